"""TEMPORARY (removed once branch ``sampler`` is merged): a discrete_gaussian on the noise sources for tests.

Not exact (rounded continuous draws); only so that the integration can be exercised before the exact sampler lands.
"""
import numpy as np

from app.unlearning import noise as _noise


def _install():
    if hasattr(_noise.SeededNoise, "discrete_gaussian"):
        return

    def seeded(self, sigma, size):
        return np.rint(sigma * self._rng.standard_normal(size)).astype(np.int64)

    def secure(self, sigma, size):
        return np.rint(sigma * self.standard_normal(size)).astype(np.int64)

    _noise.SeededNoise.discrete_gaussian = seeded
    _noise.SecureGaussianNoise.discrete_gaussian = secure


_install()
