"""passive_olu's release history (issue 29 item 7) and allocation ``group`` (issue 30 item 3).

Release history: the (tau_r, summed grid) rows of the ledger epoch's discrete releases, whose re-rounding a record's
carried shift picks up (``rerounding``; passive.py's module docstring).

Allocation ``group`` (the proof is docs/passive_group_allocation.md).

The certificate of forget i compares the window from forget i on with the run that never saw any of the i records
forgotten so far in the ledger epoch (000 Def. 2.2).  Privacy amplification by iteration with the optimal split of
the group's shift over the releases gives D_alpha <= alpha S^2 / (2 V):

  S = sum_j a_j(tau) + 2 sqrt(n) sum_t g_t Gamma(tau_t, tau)   the group's certified shift carried to tau (each
      a_j = max(Delta_u Gamma(u_j, tau) + its re-rounding at the releases not counted, round-off floor), plus the
      lattice roundings of the counted releases (the absorbed and the carried part, one g sqrt(n) each);
  V = sum_t sigma_t^2 Gamma(tau_t, tau)^2                        the noise of the counted releases, contracted
      like the iterate (a variance contracts with the square);

counting only releases made after every record of the group was learned (tau_t >= max_j u_j), this one included:
then the split b_t proportional to sigma_t^2 Gamma(tau_t, tau) absorbs nothing before it exists.  Release i gets
sigma_i^2 = S^2/(2 rho) - V_before (never below a 2^-20 fraction of a_i^2/(2 rho)), so every window is rho-zCDP;
after the stream (no learning between forgets) this is sigma_i^2 = (2i - 1) a^2/(2 rho) for equal shifts.

The windows' bounds are not added: the receipt's rho is the window bound S^2/(2V) (<= rho), and the ledger keeps
the current one (accounting ``per_update``: "the guarantee of the current publication").  The lattice sensitivity
passed to the release is the record's own a_i, raised where sigma_i/a_i would exceed the int64 range of the exact
sampler (any value works: the grid it gives is counted in S).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..contract.errors import CapacityExhausted
from ..maths.schedules import Adaptive
from ..mechanism import release
from ..mechanism.calibration import SIGMA_GRID_MAX

GROUP_FLOOR = 2.0**-20  # sigma_i^2 >= GROUP_FLOOR a_i^2/(2 rho): a release always noises (never an exact copy)


class GroupAllocation:
    """Mixed into PassiveOLU: the release history, and the state and the noise of allocation ``group``."""

    def release_load(self, state: Mapping[str, Any]) -> None:
        self.release_tau, self.release_grid = release.load_release_history(state, self.n_charged, self.t,
                                                                           self.max_grid)

    def rerounding(self, u: int, tau: int, before: float = math.inf) -> float:
        """What the re-rounding at this epoch's releases since u (before ``before``) adds to u's shift carried to tau
        (release.rerounding with Gamma(tau_r, tau); 1 for the adaptive schedule, as in shift_bound)."""
        adaptive = isinstance(self.schedule, Adaptive)
        return release.rerounding(self.release_tau, self.release_grid, u, self.spec.n_params,
                                  None if adaptive else (lambda t: math.exp(self.log_gamma(t, tau))), before)

    def max_grid(self) -> float:
        """The largest grid a release can have: that of the largest shift certifiable, the first step's eta_1 L
        (its public bound for the adaptive schedule), doubled for the round-off floor and the re-rounding terms
        (release.py's grid grows with the sensitivity): legacy states' conservative release history."""
        bound = getattr(self.schedule, "public_eta_bound", None)
        eta_1 = bound() if bound is not None else self.schedule.eta(1)
        return release.grid_resolution(2.0 * eta_1 * self.L, self.spec.n_params, self.spec.domain_radius)

    def group_reset(self) -> None:
        self.group_u: list[int] = []                            # forgotten steps of this ledger epoch
        self.group_rel: list[tuple[int, float, float]] = []     # releases: (tau_t, sigma_t, grid_t)

    def group_state(self, out: dict[str, Any]) -> None:
        if self.group_u:
            out["group_u"] = np.asarray(self.group_u, dtype=np.int64)
            out["group_rel"] = np.asarray(self.group_rel, dtype=np.float64).reshape(-1)

    def group_load(self, state: Mapping[str, Any]) -> None:
        self.group_reset()
        if "group_u" in state:
            self.group_u = np.asarray(state["group_u"], dtype=np.int64).reshape(-1).tolist()
            rel = np.asarray(state["group_rel"], dtype=np.float64).reshape(-1, 3)
            self.group_rel = [(int(t), float(s), float(g)) for t, s, g in rel]

    def _group_gamma(self, t: int, tau: int) -> float:
        return 1.0 if t >= tau else math.exp(self.log_gamma(t, tau))

    def group_noise(self, u: int, tau: int, a: float) -> tuple[float, float, float, float]:
        """(sigma_i, sensitivity for the release, window bound rho_i, S) for forgetting step u (its certified
        shift a) at tau; public quantities only."""
        n, rho, R = self.spec.n_params, self.spec.rho, self.spec.domain_radius
        members = self.group_u + [u]
        first = max(members)
        S = 0.0
        for v in members:  # each member's shift, re-rounded only at the releases not counted below (tau_r < first)
            delta_v, gamma_v, _ = self.shift_bound(v, tau)
            S += max(delta_v * gamma_v + self.rerounding(v, tau, first), self.roundoff_floor(v, tau))
        V, lattice = 0.0, 0.0
        for t, s, g in self.group_rel:
            if t >= first:
                G = self._group_gamma(t, tau)
                V += (s * G) ** 2
                lattice += 2.0 * math.sqrt(n) * g * G
        sens = a
        for _ in range(64):  # the grid grows with the sensitivity passed; raise it until the exact sampler fits
            grid = release.grid_resolution(sens, n, R)
            total = S + lattice + 2.0 * math.sqrt(n) * grid
            var = max(total * total / (2.0 * rho) - V, GROUP_FLOOR * a * a / (2.0 * rho))
            sigma = math.sqrt(var)
            need = sigma * (2.0 * release.GRID_FACTOR + 1.0) * math.sqrt(n) / SIGMA_GRID_MAX
            if sens >= need:
                break
            sens = 2.0 * need  # sigma grows by a 2^-9 fraction of the new grid term at most: this ends at once
        else:  # pragma: no cover - group_precheck keeps sigma finite
            raise CapacityExhausted("the group allocation's noise is out of range; an exact restart is required")
        window = total * total / (2.0 * (V + var))
        return sigma, sens, min(window, rho), total

    def group_precheck(self, k: int) -> None:
        """Refuse (CapacityExhausted: the model restarts instead) before anything changes when k more group forgets
        could need a sigma out of float range: every shift is at most 4 eta_1 L (public)."""
        bound = getattr(self.schedule, "public_eta_bound", None)
        a_cap = 4.0 * (bound() if bound is not None else self.schedule.eta(1)) * self.L
        m = len(self.group_u) + k
        try:
            var = (m * a_cap) ** 2 / (2.0 * self.spec.rho)
        except OverflowError:
            var = math.inf
        if not math.isfinite(var):
            raise CapacityExhausted(f"{m} forgotten records exceed the group allocation's range; an exact restart "
                                    "is required")

    def group_record(self, u: int, tau: int, sigma: float, grid: float) -> None:
        self.group_u.append(u)
        self.group_rel.append((tau, sigma, grid))
