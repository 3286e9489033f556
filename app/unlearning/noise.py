"""Gaussian noise sources.

Production noise comes from the OS CSPRNG: every draw seeds a fresh PCG64 from ``secrets`` (128 bits), so
no seed is ever stored or reproducible from state (ARCHITECTURE.md §3).  Tests inject a seeded source to
couple an unlearning run with its retrain reference (§5).
"""
from __future__ import annotations

import secrets
from typing import Protocol

import numpy as np


class NoiseSource(Protocol):
    def standard_normal(self, size: int) -> np.ndarray: ...


class SecureGaussianNoise:
    """N(0, I) draws, each from a generator freshly seeded by the OS CSPRNG."""

    def standard_normal(self, size: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
        return rng.standard_normal(size)


class SeededNoise:
    """Deterministic N(0, I) draws for coupled tests.  Never used by the service."""

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def standard_normal(self, size: int) -> np.ndarray:
        return self._rng.standard_normal(size)
