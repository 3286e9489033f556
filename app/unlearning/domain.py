"""The convex set K: a centred L2 ball of radius R (diameter D = 2R)."""
from __future__ import annotations

import numpy as np


def project_l2_ball(theta: np.ndarray, radius: float) -> np.ndarray:
    norm = float(np.linalg.norm(theta))
    if norm <= radius:
        return theta
    return theta * (radius / norm)
