"""Gaussian noise sources.

Production noise comes from the OS CSPRNG: every draw seeds a fresh PCG64 with 256 bits read from ``os.urandom``
at that moment, so no seed is ever stored or reproducible from state (ARCHITECTURE.md §3).  Tests inject a seeded
source to couple an unlearning run with its retrain reference (§5).

Seeding.  ``PCG64(seed)`` runs ``SeedSequence(seed).generate_state(4, uint64)`` and hands the four words to
``pcg64_set_seed`` (128-bit initial state, 128-bit stream word w, increment 2w + 1): the SeedSequence hash only
spreads the 128 entropy bits of ``secrets.randbits(128)`` over those 256 bits, and costs ~10 us per draw.
``OsEntropy`` is an ``ISeedSequence`` whose ``generate_state`` returns the requested words straight from
``os.urandom``; the bit generator is seeded by the same ``pcg64_set_seed`` call, with 256 fresh CSPRNG bits instead
of 128 hashed ones.  The object holds no state: each call reads new bytes from the kernel and nothing is kept.
"""
from __future__ import annotations

import os
from typing import Protocol

import numpy as np
from numpy.random import PCG64, Generator
from numpy.random.bit_generator import ISeedSequence

_U64 = np.dtype(np.uint64)
_WORD_TYPES = (np.dtype(np.uint32), _U64)


class NoiseSource(Protocol):
    def standard_normal(self, size: int) -> np.ndarray: ...


class OsEntropy(ISeedSequence):
    """Seed words for a bit generator, read from the OS CSPRNG on every call (stateless, never reused)."""

    __slots__ = ()

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        if dtype is np.uint64 and n_words == 4:  # what PCG64.__init__ asks for
            return np.frombuffer(os.urandom(32), _U64)  # (positional: ~0.15 us less than dtype=)
        dt = np.dtype(dtype)
        if dt not in _WORD_TYPES:
            raise ValueError("only uint32 and uint64 seed words are supported")
        return np.frombuffer(os.urandom(int(n_words) * dt.itemsize), dt)


OS_ENTROPY = OsEntropy()


def secure_generator() -> Generator:
    """A fresh PCG64 generator seeded with 256 bits from the OS CSPRNG (one per draw or per run; never stored)."""
    return Generator(PCG64(OS_ENTROPY))


class SecureGaussianNoise:
    """N(0, I) draws, each from a generator freshly seeded by the OS CSPRNG."""

    def standard_normal(self, size: int) -> np.ndarray:
        return Generator(PCG64(OS_ENTROPY)).standard_normal(size)


class SeededNoise:
    """Deterministic N(0, I) draws for coupled tests.  Never used by the service."""

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def standard_normal(self, size: int) -> np.ndarray:
        return self._rng.standard_normal(size)
