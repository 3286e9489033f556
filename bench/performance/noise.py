"""Noise sampler micro-benchmark: 17 draws (d = 16 plus the bias) per call, the size of one passive forget.

Compares the exact discrete Gaussian sampler (app/unlearning/mechanism/noise.py) on its compiled path (fast_dgauss.py,
numba) and its pure-Python path with today's continuous ``SecureGaussianNoise.standard_normal(17)``, all with
production randomness (fresh os.urandom key or seed per call).  Median time per call over batches.
"""
from __future__ import annotations

import statistics
import time

from app.unlearning.mechanism import fast_dgauss
from app.unlearning.mechanism.noise import SECURE_BITS, SecureGaussianNoise, sample_discrete_gaussian

SIZE = 17
SIGMAS = (10.0, 1e3, 1e6)


def _per_call(fn, batch: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - t0) / batch)
    return statistics.median(times)


def run(quick: bool = False) -> dict:
    reps = 5 if quick else 15
    noise = SecureGaussianNoise()
    fast_dgauss.warm_up()
    res: dict = {"size": SIZE, "compiled_available": fast_dgauss.available(),
                 "standard_normal_s": _per_call(lambda: noise.standard_normal(SIZE), 200, reps), "rows": []}
    for sigma in SIGMAS:
        row = {"sigma": sigma}
        if fast_dgauss.available():
            row["compiled_s"] = _per_call(lambda: sample_discrete_gaussian(sigma, SIZE, SECURE_BITS), 200, reps)
        previous = fast_dgauss.set_enabled(False)
        try:
            row["pure_s"] = _per_call(lambda: sample_discrete_gaussian(sigma, SIZE, SECURE_BITS), 5, reps)
        finally:
            fast_dgauss.set_enabled(previous)
        res["rows"].append(row)
    return res
