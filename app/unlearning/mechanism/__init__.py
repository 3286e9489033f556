"""The release mechanism: noise sources, the exact discrete Gaussian sampler (pure, and its compiled kernel), the
compiled OGD loop and grid noise step, the discrete release and its round-off floor, the calibration checks."""
