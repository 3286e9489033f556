"""Compiled path of the exact discrete Gaussian sampler (placeholder: the pure path until the kernel lands)."""
from __future__ import annotations

import numpy as np

from . import noise


def sample(sigma: float, size: int, rand) -> np.ndarray:
    return noise.sample_discrete_gaussian_pure(sigma, size, rand)
