"""Descent-to-delete (paper 002, Neel, Roth, Sharifi-Malvajerdi 2020) as one model family.

Every update -- ``learn`` adds an example, ``forget`` deletes one -- is one round of the paper: warm-started
full-batch projected gradient descent on the *updated* retained set (Algorithm 2), then publication of the
result plus fresh Gaussian noise (Algorithm 3).  The published draw is cached until the next update (pitfall 2).
``variant`` selects the theorem:

- ``secret`` (Thm 3.1): strongly convex; the unperturbed iterate theta_hat is the secret state, T_i = I.
- ``perfect`` (Thm 3.2): strongly convex; no secret state, warm start from the published model, T_i = I +
  log log(4di/delta)/log(1/gamma), I >= I_min.
- ``regularized_strong`` (Thm 3.4): convex; runs Thm 3.1 on g = f + (m/2)||theta||^2 with m from the theorem
  (exponent 2/5, erratum E1), fixed until the next full training.
- ``regularized_weak`` (Thm 3.5 / Rem. 3.6): convex; T_i = i^{2 xi} I, sigma with the 4 sqrt 2 constant (E2).
- ``distributed`` (Thm 4.5): perturbed distributed descent: C copies of a bootstrap sample of size B = K^2 in K
  partitions, reservoir sampling with replacement (Alg. 5) on every update, only modified partitions re-optimised
  (vectorised across partitions), the copy with the lowest empirical loss published (E9: that selection is the
  paper's, not covered by its formal proof; ``selection="single"`` keeps one copy and avoids it, at the price of
  the accuracy guarantee holding only in expectation).

Publication (issue 14; app/unlearning/mechanism/release.py): the mean is rounded to a grid g and released with discrete
Gaussian noise (Delta' = Delta + g sqrt(d), sigma' = sigma Delta'/Delta); Delta is at least the float64 round-off
floor 2 e/(1 - gamma) of the projected GD steps (``roundoff_floor``); the perfect variant's Delta also carries its
earlier releases' lattice (below).

The perfect variant and the re-rounding of its releases (issue 29 item 7).  Thm 3.2's induction (digest §3.3, E4's
tight form) bounds the pre-noise mean mu'_i of round i against the minimiser theta*_i on D_i:
    ||mu'_i - theta*_i|| <= gamma^{T_i} (||theta~_{i-1} - theta*_{i-1}|| + 4L/(mn)),
with the paper's theta~_{i-1} = mu'_{i-1} + Z, ||Z|| <= sigma sqrt(2d) log(4di/delta) (Lemma A.2) and
gamma^{T_i} log(4di/delta) <= gamma^I, so r = G (4L/(mn) + sigma sqrt(2d)), G = gamma^I/(1 - gamma^I) (eq. 13),
and Delta = r + gamma^I 4L/(mn) <= G (8L/(mn) + sigma sqrt(2d)).  Here theta~_{i-1} = Pi(g (round(mu'_{i-1}/g) + k)),
k ~ N_Z(0, (sigma'/g)^2)^d, and the next round warm-starts from it (Pi is non-expansive towards theta* in Theta):
  (1) the rounding moves the mean by at most g sqrt(d)/2 (g/2 per coordinate): deterministic, contracted by
      gamma^{T_i} <= gamma^I like the rest, so r gains G g sqrt(d)/2;
  (2) the noise is the lattice's, sigma' = sigma (Delta + g sqrt(d))/Delta (rounded up) > sigma: N_Z(0, s^2) is
      s^2-subgaussian (CKS20, its tail bound), so ||g k|| <= sigma' sqrt(2d) log(4di/delta) on the same event,
      and r gains G sqrt(2d) (sigma' - sigma).
g and sigma' are functions of the epoch's public (Delta, sigma, d, R), the same at every release of the epoch (the
training's too), so the complete bound is Delta = G (8L/(mn) + sqrt(2d) sigma) + G (sqrt(2d) (sigma' - sigma) +
g sqrt(d)/2) (the second group is the certificate's ``rerounding``), raised to the round-off floor.  The release keeps
its inputs (the paper's Delta at this sigma, hence the same g and sigma'); the lattice points of the two worlds
differ by at most Delta + g sqrt(d) (the receipt's sensitivity), and (Delta + g sqrt(d))/sigma' <= Delta/sigma
since sigma'/sigma = (Delta_in + g sqrt(d))/Delta_in with Delta_in <= Delta.  Privacy needs Delta/sigma <=
sqrt(x + 2 eps) - sqrt(x), x = 2 log(2/delta) (Lemma A.3 at delta/2).  The paper's sigma and I >= I_min give
a + b (E4) for the paper's Delta, and the term adds about (b + G c)/K (K = 2^10, release.py) to the ratio: the
slack (c - a - b, and b - G sqrt(2d) for I > I_min) almost always holds it, and sigma stays Thm 3.2's; where it
does not (I = I_min ~ 1 at a small epsilon), sigma is raised to G (8L/(mn) + g sqrt(d)/2)/(c - G sqrt(2d) sigma'/sigma)
(``_perfect_calibration``).  T_i and I_min are unchanged: (1) needs no tail absorption, (2) has the paper's tail
factor, absorbed by the same log log(4di/delta)/log(1/gamma) iterations, and I >= I_min keeps G sqrt(2d) <= b <
c sigma/sigma', so the raised sigma is finite.  The other variants need no term: their chain runs on the secret
iterate (or secret partitions) and every release is post-processing of it (pitfall 13).

Deviations (documented): the published point is projected onto Theta (E5, post-processing); the Lipschitz
constant of g uses sup ||theta|| = R of the centred ball (L + mR, tighter than the paper's L + mD and valid);
several updates in one request are processed sequentially, one round each (pitfall 12).

Every record can be forgotten (issue 29 item 4): the theorems assume n_i >= n/2 (Assumption 2.6), so a forget that
would leave fewer than half of the epoch's records is an exact retrain on the rest instead (the initial state when
none remain): exact certificates with ``details["restart"]`` and ``["retrain"]``, a new epoch.  The model is never
``retrain_required``.
"""
from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..contract.certificate import Certificate, exact_retrain_certificates
from ..contract.errors import ForgetError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, checked_forget_steps
from ..maths import d2d_constants as dm
from ..maths.domain import project_l2_ball
from ..maths.losses import make_loss
from ..mechanism import release
from ..mechanism.noise import NoiseSource
from .descent_to_delete_data import DatasetView, cached, reservoir_update
from .descent_to_delete_variants import DescentToDeleteVariants


class DescentToDelete(DescentToDeleteVariants):
    algorithm = "descent_to_delete"
    accounting = "per_update"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = "(epsilon, delta)-unlearning per update (Neel, Roth, Sharifi-Malvajerdi 2020, Def. 2.4)"
    guarantee_words = (
        "After each update, the published model is (epsilon, delta)-indistinguishable from the model the same "
        "training algorithm would publish if retrained from scratch on the current data. The guarantee is per "
        "update (not composed across updates); the secret-state variants keep an unpublished exact iterate."
    )

    # Test hooks for negative controls (never changed by the service).
    sigma_scale = 1.0            # multiplies every sigma
    weak_constant_printed = False  # Thm 3.5 as printed: 2 sqrt(2M) instead of 4 sqrt(2) sqrt(M) (E2)
    strong_exponent = 0.4          # Thm 3.4 exponent (E1: printed 4/5, corrected 2/5)
    partition_iterations_cap: int | None = None  # distributed: cap T' (a deliberately under-budgeted control)
    # Work bound checked at creation: a round that needs more gradient-descent iterations than this (gamma too
    # close to 1) would never finish inside a request; such a spec is refused instead (tests may lower it).
    max_iterations: int = 10**6

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.variant: str = hp["variant"]
        self.I: int = int(hp["iterations"])
        self.xi = float(hp["xi"])
        self.chunk_size = int(hp["chunk_size"])
        self.d = spec.n_params
        self.R = float(spec.domain_radius)
        self.D = 2.0 * self.R
        self.base_loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
        self.sampler: np.random.Generator | None = None  # tests inject a seeded generator
        # state
        self.t = 0
        self.n_epoch = 0
        self.n_current = 0
        self.round = 0
        self.epoch = 0
        self.n_deletions = 0
        self.grad_evals = 0
        self.m_reg = 0.0
        self.theta = np.zeros(self.d)
        self.published_ = np.zeros(self.d)
        self.selected = 0
        self.part_theta = np.zeros((0, 0, self.d))
        self.slots = np.zeros((0, 0), np.int64)
        self.slot_partition = np.zeros(0, np.int64)
        self._last_mean = np.zeros(self.d)  # the pre-noise mean of the last publication (tests only, never state)
        self.last_release: dict[str, float] = {}  # grid, sigma, sensitivity of the last release (public; certificates)
        self._configure()

    def records_held(self) -> int:
        return self.n_current

    # ---- state --------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "t": self.t, "n_epoch": self.n_epoch, "n_current": self.n_current, "round": self.round,
            "epoch": self.epoch, "n_deletions": self.n_deletions, "grad_evals": self.grad_evals,
            "m_reg": self.m_reg, "published": self.published_.copy(),
        }
        if self.variant in ("secret", "regularized_strong", "regularized_weak"):
            st["theta"] = self.theta.copy()
        if self.variant == "distributed":
            C, K = self.part_theta.shape[:2]
            st.update({
                "C": int(C), "K": int(K), "B": int(self.slots.shape[1]), "selected": self.selected,
                "part_theta": self.part_theta.reshape(-1).copy(),
                "slots": self.slots.reshape(-1).astype(np.int64),
                "slot_partition": self.slot_partition.astype(np.int64).copy(),
            })
        return st

    def load_state(self, state: Mapping[str, Any]) -> None:
        for k in ("t", "n_epoch", "n_current", "round", "epoch", "n_deletions", "grad_evals"):
            setattr(self, k, int(state[k]))
        self.m_reg = float(state["m_reg"])
        pub = np.asarray(state["published"], dtype=np.float64)
        if pub.shape != (self.d,):
            raise ValueError("stored parameters do not match the model dimension")
        self.published_ = pub.copy()
        if "theta" in state:
            self.theta = np.asarray(state["theta"], dtype=np.float64).reshape(self.d).copy()
        if self.variant == "distributed":
            C, K, B = int(state["C"]), int(state["K"]), int(state["B"])
            self.selected = int(state["selected"])
            self.part_theta = np.asarray(state["part_theta"], np.float64).reshape(C, K, self.d).copy()
            self.slots = np.asarray(state["slots"], np.int64).reshape(C, B).copy()
            self.slot_partition = np.asarray(state["slot_partition"], np.int64).reshape(B).copy()
        self._configure()

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.published_.copy()

    def constants(self) -> dict[str, float]:
        return {"L": self.c.L, "beta": self.c.M, "mu": self.c.m, "D": self.D, "gamma": self.c.gamma, "eta": self.c.eta}

    def ledger(self) -> dict[str, Any]:
        n = self.n_epoch
        return {
            "accounting": self.accounting,
            "rho_spent": self.rho_update if self.round > 0 else 0.0,  # per update; updates do not compose
            "rho_budget": self.spec.rho,
            "capacity_total": n - math.ceil(n / 2) if n else None,
            "capacity_left": max(0, self.n_current - math.ceil(n / 2)) if n else None,
            "deletions": self.n_deletions,
            "epoch": self.epoch,
            "epsilon": self.spec.epsilon,
            "delta": self.spec.delta,
            "sigma": self.sigma,
        }

    # ---- randomness ---------------------------------------------------------------------------------------
    def _rng(self) -> np.random.Generator:
        if self.sampler is not None:
            return self.sampler
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def roundoff_floor(self) -> float:
        """Float64 round-off two coupled runs can add to ||mean - reference mean|| (release.py): every projected GD
        step on a set of at most n_epoch examples errs by at most e = C (d + 2 + n) u_64 (R + eta L) (the average's
        summation included), and the steps contract by gamma (strongly convex objective), so both runs together add
        at most 2 e / (1 - gamma), whatever the number of steps and rounds."""
        if self.n_epoch == 0 or not self.c.gamma < 1.0:
            return 0.0
        e = release.step_roundoff(self.d + self.n_epoch, self.R, self.c.eta * self.c.L)
        return release.roundoff_floor(e, 2**62, self.c.gamma)

    def _publish(self, mean: np.ndarray) -> None:
        """f_publish (Alg. 3 / 7): one fresh draw per update, cached; projected onto Theta (E5).

        Released through the discrete Gaussian (release.py): Delta = max(sensitivity, round-off floor), sigma
        scaled with it (sigma/Delta as calibrated), grid g, Delta' = Delta + g sqrt(d), sigma' = sigma Delta'/Delta.
        The (epsilon, delta) calibration of sigma/Delta carries over through CKS20 (zCDP Delta^2/(2 sigma^2),
        Thm 14; the discrete Gaussian's (epsilon, delta) profile matches the continuous one's up to CKS20's
        negligible correction at sigma'/g >= 2^10)."""
        self._last_mean = mean.copy()
        pr = self.perfect_release
        if pr is not None and self.sigma > 0.0:  # perfect: the planned inputs; Delta carries the re-rounding
            self.published_, grid, sigma_used, _ = release.discrete_release(
                mean, pr["sensitivity"], pr["sigma"] * self.sigma_scale, self.noise, scale=self.R, radius=self.R)
            self.last_release = {"grid": grid, "sigma": sigma_used, "roundoff_floor": pr["floor"],
                                 "sensitivity": self.sensitivity + grid * math.sqrt(self.d),
                                 "rerounding": pr["rerounding"]}
            return
        floor = self.roundoff_floor()
        sens, sigma = self.sensitivity, self.sigma
        if sigma > 0.0 and floor > sens:
            sigma, sens = sigma * (floor / sens) if sens > 0.0 else sigma, floor
        self.published_, grid, sigma_used, sens_used = release.discrete_release(
            mean, sens, sigma, self.noise, scale=self.R, radius=self.R)
        self.last_release = {"grid": grid, "sigma": sigma_used, "sensitivity": sens_used, "roundoff_floor": floor}

    # ---- gradient descent ---------------------------------------------------------------------------------
    def _grad(self, theta: np.ndarray, view: DatasetView) -> np.ndarray:
        total = np.zeros(self.d)
        for _, Xa, y in view.chunks(self.chunk_size):
            total += self.loss.grad_sum(theta, Xa, y)
        return total / view.n + self.c.m * theta

    def _gd(self, theta: np.ndarray, iters: int, view: DatasetView) -> np.ndarray:
        """iters full-batch projected GD steps with eta = 2/(M+m) on the average loss over D_i (pitfall 7)."""
        eta = self.c.eta
        for _ in range(iters):
            theta = project_l2_ball(theta - eta * self._grad(theta, view), self.R)
        self.grad_evals += iters * view.n
        return theta

    def train_from_scratch(self, view: DatasetView) -> np.ndarray:
        """A(D) with this epoch's constants (Alg. 1): T steps from 0.  Used by training and the replay reference."""
        return self._gd(np.zeros(self.d), self.T, view)

    # ---- distributed helpers ------------------------------------------------------------------------------
    def _partition_gd(self, thetas: np.ndarray, Xp: np.ndarray, yp: np.ndarray, iters: int) -> np.ndarray:
        """Projected GD on k partitions at once: thetas (k, d), Xp (k, P, d), yp (k, P)."""
        eta, mu, P = self.c.eta, self.c.m, Xp.shape[1]
        if self.loss.n_out > 1:  # softmax: each partition's parameters are a matrix (losses.py)
            for _ in range(iters):
                thetas = np.stack([th - eta * (self.loss.grad_sum(th, X, y) / P + mu * th)
                                   for th, X, y in zip(thetas, Xp, yp)])
                norms = np.linalg.norm(thetas, axis=1, keepdims=True)
                thetas = np.where(norms > self.R, thetas * (self.R / np.maximum(norms, 1e-300)), thetas)
            self.grad_evals += iters * Xp.shape[0] * P
            return thetas
        for _ in range(iters):
            r = self.loss.residual(np.einsum("kpd,kd->kp", Xp, thetas), yp)
            thetas = thetas - eta * (np.einsum("kpd,kp->kd", Xp, r) / P + mu * thetas)
            norms = np.linalg.norm(thetas, axis=1, keepdims=True)
            thetas = np.where(norms > self.R, thetas * (self.R / np.maximum(norms, 1e-300)), thetas)
        self.grad_evals += iters * Xp.shape[0] * P
        return thetas

    def _train_partitions(self, l: int, parts: np.ndarray, start: np.ndarray, iters: int, view: DatasetView) -> np.ndarray:
        P = self.sizes.P
        group = max(1, self.chunk_size // P)
        out = np.empty((len(parts), self.d))
        for g0 in range(0, len(parts), group):
            sel = parts[g0 : g0 + group]
            slot_idx = (sel[:, None] * P + np.arange(P)[None, :]).reshape(-1)  # slot k is in partition k // P
            steps = self.slots[l, slot_idx]
            uniq, inv = np.unique(steps, return_inverse=True)
            Xu, yu = view.get(uniq)
            Xp = Xu[inv].reshape(len(sel), P, -1)
            yp = yu[inv].reshape(len(sel), P)
            out[g0 : g0 + group] = self._partition_gd(start[g0 : g0 + group], Xp, yp, iters)
        return out

    def _select_and_publish(self, view: DatasetView) -> None:
        """l* = argmin_l f_{D_i}(avg theta_hat_l) on the full current data (Alg. 4/6; E9), then Alg. 7."""
        avgs = self.part_theta.mean(axis=1)
        totals = np.zeros(len(avgs))
        for _, Xa, y in view.chunks(self.chunk_size):
            for l, th in enumerate(avgs):
                totals[l] += float(self.loss.losses(th, Xa, y).sum())
        self.selected = int(np.argmin(totals))
        self._publish(avgs[self.selected])

    def _distributed_train(self, view: DatasetView) -> None:
        sz, rng = self.sizes, self._rng()
        all_steps = view.steps(self.chunk_size)
        self.slots = all_steps[rng.integers(0, len(all_steps), size=(sz.C, sz.B))].astype(np.int64)  # S ~ P^B(D)
        self.slot_partition = (np.arange(sz.B) // sz.P).astype(np.int64)  # fixed; i.i.d. slots make it uniform
        self.part_theta = np.zeros((sz.C, sz.K, self.d))
        every = np.arange(sz.K)
        for l in range(sz.C):
            self.part_theta[l] = self._train_partitions(l, every, np.zeros((sz.K, self.d)), self.T, view)
        self._select_and_publish(view)

    def reference_partitions(self, view: DatasetView) -> np.ndarray:
        """Replay reference: A on the *current* slot contents (distributed as P^B(D_i), Lemma 4.2), per copy avg."""
        sz = self.sizes
        saved = self.grad_evals
        out = np.stack([self._train_partitions(l, np.arange(sz.K), np.zeros((sz.K, self.d)), self.T, view).mean(axis=0)
                        for l in range(sz.C)])
        self.grad_evals = saved
        return out

    def _distributed_update(self, view: DatasetView, kind: str, step: int, i: int) -> None:
        sz, rng = self.sizes, self._rng()
        pool = view.steps(self.chunk_size) if kind == "delete" else None
        for l in range(sz.C):  # independent reservoir randomness per copy (pitfall 16)
            idx = reservoir_update(self.slots[l], kind, step, view.n, pool, rng)
            changed = np.unique(self.slot_partition[idx])
            if len(changed) == 0:
                continue  # pitfall 17: nothing to re-optimise; still select and publish
            iters = dm.distributed_partition_iterations(self.c, sz, self.n_epoch, self.I, i, self.spec.delta,
                                                        len(changed))
            if self.partition_iterations_cap is not None:
                iters = min(iters, self.partition_iterations_cap)
            self.part_theta[l, changed] = self._train_partitions(l, changed, self.part_theta[l, changed], iters, view)
        self._select_and_publish(view)

    # ---- rounds -------------------------------------------------------------------------------------------
    def _full_train(self, view: DatasetView) -> None:
        """A(D): a fresh fit on the current data, a new epoch (n := |D|, round := 0, m and sigma recomputed)."""
        self.epoch += 1
        self.round = 0
        self.n_epoch = self.n_current = view.n
        self.m_reg = self._regularization_for(view.n) if view.n else 0.0
        self._configure()
        if view.n == 0:
            self.theta = np.zeros(self.d)
            self.published_ = np.zeros(self.d)
            return
        if self.variant == "distributed":
            self._distributed_train(view)
            return
        theta = self.train_from_scratch(view)
        if self.variant != "perfect":
            self.theta = theta
        self._publish(theta)

    def _update(self, view: DatasetView, kind: str, step: int) -> tuple[str, int]:
        """One round of Alg. 2 (or 6).  Returns (mechanism, iterations)."""
        i = self.round + 1
        if self.hp["retrain_when_cheaper"] and self.update_cost(i, view.n) >= self.training_cost(view.n):
            self._full_train(view)
            return "exact", self.T
        self.round = i
        self.n_current = view.n
        if self.variant == "distributed":
            self._distributed_update(view, kind, step, i)
            return release.MECHANISM, 0
        iters = self.update_iterations(i)
        start = self.published_ if self.variant == "perfect" else self.theta  # Thm 3.2 vs 3.1 (pitfalls 4, 5)
        theta = self._gd(start.copy(), iters, view)
        if self.variant != "perfect":
            self.theta = theta
        self._publish(theta)
        return release.MECHANISM, iters

    def _adds_cost_more(self, k: int, held: int, n_total: int) -> bool:
        """Whether k sequential add rounds would cost at least one full training on all n_total examples."""
        budget, spent = self.training_cost(n_total), 0
        for j in range(1, k + 1):
            spent += self.update_cost(self.round + j, held + j)
            if spent >= budget:
                return True
        return False

    # ---- the contract -------------------------------------------------------------------------------------
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.spec.dim)
        y = np.asarray(y, dtype=np.float64)
        k = len(y)
        steps = np.arange(self.t + 1, self.t + k + 1, dtype=np.int64)
        if k == 0:
            return steps
        retained = cached(retained, self.spec.dim)
        held = 0 if retained is None else len(retained)
        if self.n_current and retained is None:
            raise ValueError("descent_to_delete needs the retained examples to learn incrementally")
        self.t += k
        full = DatasetView(retained, (), steps, X, y)
        if self.n_epoch == 0 or (self.hp["retrain_when_cheaper"] and self._adds_cost_more(k, held, full.n)):
            self._full_train(full)  # the first fit (initial training, T iterations), or a cheaper refit
            return steps
        for j in range(k):  # one add update per example (pitfall 12)
            self._update(DatasetView(retained, (), steps[: j + 1], X[: j + 1], y[: j + 1]), "add", int(steps[j]))
        return steps

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        if retained is None:
            raise ValueError("descent_to_delete needs the retained examples")
        retained = cached(retained, self.spec.dim)
        steps = checked_forget_steps(steps, self.t)
        try:
            retained.get(steps)
        except KeyError:
            raise ForgetError("some steps are not held (never learned or already forgotten)") from None
        n_after = len(retained) - len(steps)
        if 2 * n_after < self.n_epoch:  # Assumption 2.6: n_i >= n/2 (pitfall 6): the analysis certifies no such round
            return self._forget_by_retrain(steps, retained)
        self.n_current = len(retained)
        certs = []
        for j, u in enumerate(steps):  # sequentially, one round each
            view = DatasetView(retained, steps[: j + 1])
            mechanism, iters = self._update(view, "delete", u)
            self.n_deletions += 1
            exact = mechanism == "exact"
            rel = self.last_release
            certs.append(Certificate(
                learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions, mechanism=mechanism,
                sigma=rel.get("sigma", self.sigma), sensitivity=0.0 if exact else rel.get("sensitivity", self.sensitivity),
                rho=0.0 if exact else self.rho_update,
                details={
                    "epsilon": 0.0 if exact else self.spec.epsilon, "delta": 0.0 if exact else self.spec.delta,
                    "mechanism_delta": self.mechanism_delta, "round": float(self.round),
                    "epoch": float(self.epoch), "n_epoch": float(self.n_epoch), "n_after": float(view.n),
                    "iterations": float(iters), "gamma": self.c.gamma, "m": self.c.m, "L": self.c.L,
                    "M": self.c.M, "variant_" + self.variant: 1.0, "grid": rel.get("grid", 0.0),
                    "shift": self.sensitivity, "roundoff_floor": rel.get("roundoff_floor", 0.0),
                    **({"rerounding": rel["rerounding"]} if "rerounding" in rel else {}),
                },
            ))
        return certs

    def _forget_by_retrain(self, steps: list[int], retained: RetainedData) -> list[Certificate]:
        """A forget that would leave fewer than n/2 of the epoch's records (Assumption 2.6; the theorems certify no
        such round) is an exact retrain instead (issue 29 item 4): A(D minus ``steps``) from theta = 0 as a new
        epoch, or the initial state when nothing remains.  The new state is what training without them gives --
        the comparator itself -- so every certificate is exact (sigma = rho = 0); the first carries ``restart`` (a
        new ledger epoch) and every one ``retrain``.  Before, this refused (retrain required), and a retrain on the
        last record left a one-record epoch whose forget refused again, forever."""
        tau = self.t
        self._full_train(DatasetView(retained, steps))
        certs = exact_retrain_certificates(steps, tau, self.n_deletions, {
            "epoch": float(self.epoch), "n_epoch": float(self.n_epoch), "n_after": float(self.n_current),
            "variant_" + self.variant: 1.0})
        self.n_deletions += len(certs)
        return certs

    def retrain(self, retained: RetainedData) -> None:
        """Exact full retrain on the retained examples: a new epoch (n reset, round 0, fresh constants)."""
        self._full_train(DatasetView(cached(retained, self.spec.dim)))
