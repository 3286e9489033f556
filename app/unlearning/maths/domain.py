"""The convex set K: a centred L2 ball of radius R (diameter D = 2R)."""
from __future__ import annotations

import math

import numpy as np

_F64 = np.dtype(np.float64)


def project_l2_ball(theta: np.ndarray, radius: float) -> np.ndarray:
    if theta.dtype == _F64:
        # what np.linalg.norm(theta) computes for a real array (sqrt of x . x over x = theta.ravel(order="K")),
        # bit for bit, without its ~1 us of argument handling
        x = theta.ravel(order="K")
        norm = math.sqrt(x.dot(x))
    else:
        norm = float(np.linalg.norm(theta))
    if norm <= radius:
        return theta
    return theta * (radius / norm)
