"""The online DP tree's aggregation (the binary-tree mechanism; digest §1.7, §2.9): the tree's levels,
the nodes it releases with their noise, the decomposition of a prefix into nodes, and the group-privacy factor and
the CKS20 conversion of the guarantee.  The engine is in dp_tree.py."""
from __future__ import annotations

import math

import numpy as np


def levels_for(horizon: int) -> int:
    """Tree levels whose nodes can complete within the horizon: h = 0..floor(log2 T)."""
    return int(horizon).bit_length()


def group_factor(k: int, group_privacy: str) -> float:
    """rho_olu / rho_tree for k deletions (module docstring)."""
    if group_privacy == "gaussian_group":
        return float(k) ** 2
    c = max(0, math.ceil(math.log2(k) - 1e-12))  # k_bar = 2^c >= k
    return 6.0**c


def cks20_epsilon_from_order(rho: float, delta: float, min_order: float = 2.0) -> float:
    """min over alpha >= min_order of CKS20's per-order conversion of (alpha, alpha rho)-RDP to (eps, delta)-DP:
    eps_alpha = alpha rho + (alpha log(1 - 1/alpha) - log(alpha - 1) + log(1/delta)) / (alpha - 1).  Every alpha
    gives a valid epsilon, so the grid minimum (refined around its best point) is a valid, near-tight bound."""
    log_inv_delta = -math.log(delta)

    def eps(s: np.ndarray) -> np.ndarray:  # s = log(alpha - 1)
        t = np.exp(s)
        a = 1.0 + t
        return a * rho + (a * np.log1p(-1.0 / a) - s + log_inv_delta) / t

    lo = math.log(min_order - 1.0)
    s = np.linspace(lo, lo + 40.0, 4001)
    with np.errstate(over="ignore"):  # a rho near the float range: alpha rho is +inf at some orders, a valid bound
        for _ in range(3):
            e = eps(s)
            i = int(np.argmin(e))
            best = float(e[i])
            step = s[1] - s[0]
            s = np.linspace(max(lo, s[i] - step), s[i] + step, 401)
    out = math.nextafter(best, math.inf) * (1.0 + 1e-12)  # Python floats: +inf past the range, no warning
    return out if math.isfinite(out) else math.inf  # no finite epsilon: the caller refuses such a budget


class TreeAggregator:
    """Binary counting mechanism over vectors (Chan, Shi & Song 2011, Alg. 2) on the integer lattice of ``grid``.

    Every leaf is the gradient rounded to the grid, r_t = round(g_t / grid) (int64, l2 norm at most sqrt(M), see
    ``OnlineDPTree.leaf``); node sums are exact integer sums of leaves.  ``acc[j]`` is the exact node sum
    (secret) and ``rel[j]`` the released node value acc[j] + k, k ~ N_Z(0, (sigma'/grid)^2) (in grid units) of the
    last completed node of level j while it is part of the binary decomposition of t (bit j of t set), 0
    otherwise.  ``add(r, draw)`` consumes step t + 1; ``draw(n)`` returns the new node's integer noise k."""

    def __init__(self, levels: int, n: int, grid: float):
        self.grid = grid
        self.acc = np.zeros((levels, n), dtype=np.int64)
        self.rel = np.zeros((levels, n), dtype=np.int64)
        self.t = 0

    def add(self, r: np.ndarray, draw) -> None:
        t = self.t + 1
        h = (t & -t).bit_length() - 1       # the node of level h = lowest set bit of t completes at t
        # Chan et al. Alg. 2: alpha_h = leaf + alpha_0 + ... + alpha_{h-1} (these cover [t - 2^h + 1, t - 1])
        node = r + self.acc[:h].sum(axis=0) if h else r
        self.acc[:h] = 0                    # merged into the new node: no longer in the decomposition of t
        self.rel[:h] = 0
        self.acc[h] = node
        self.rel[h] = node + np.asarray(draw(node.shape[0]), dtype=np.int64)  # released once, never re-noised
        self.t = t

    @property
    def G(self) -> np.ndarray:
        """The exact prefix sum of the rounded leaves, grid * (r_1 + ... + r_t) (secret; tests)."""
        return self.grid * self.acc.sum(axis=0)

    def node_values(self) -> np.ndarray:
        """The released values of the nodes of the decomposition of t (rows of levels whose bit of t is set; the
        other rows are 0): grid * (round(s_node / grid) + k), lattice points."""
        return self.grid * self.rel

    def noise(self) -> np.ndarray:
        """G^_t - G_t: grid times the integer noise of the popcount(t) nodes of the binary decomposition of t."""
        return self.grid * (self.rel - self.acc).sum(axis=0)

    def released(self) -> np.ndarray:
        """G^_t: the sum of the released node values of the decomposition of t, summed exactly in integers (one
        multiplication by the power-of-two grid; exact in float64 below 2^53 grid units)."""
        return self.grid * self.rel.sum(axis=0)


def decomposition(t: int) -> list[tuple[int, int]]:
    """The dyadic nodes (start, end) whose union is [1, t] (one per set bit of t, highest first)."""
    out, start = [], 1
    for h in reversed(range(int(t).bit_length())):
        if t >> h & 1:
            out.append((start, start + (1 << h) - 1))
            start += 1 << h
    return out
