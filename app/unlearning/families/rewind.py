"""Rewind-to-delete and descend-to-delete with minibatch SGD (paper 004, Mu & Klabjan; digest descend-or-rewind.md).

One family, ``algorithm = "rewind_to_delete"``, hyperparameter ``variant``:

* ``"rewind"`` (R2D, Algorithms 1-2): (projected) SGD for T steps with minibatches drawn uniformly *with
  replacement*; the un-noised iterate theta_{T-K} is kept as a secret checkpoint; the release is
  theta_T + N(0, sigma^2 I).  A deletion rewinds to theta_{T-K}, runs exactly K steps on the retained set and
  releases the result plus *fresh* noise.  ``projected`` selects PSGD-R2D (Thm 2, via appendix Thm 18) or
  SGD-R2D (Thm 3, via appendix Thm 22); ``regime`` selects the strongly convex / convex / nonconvex constant.
* ``"descend"`` (SGD-D2D, Algorithms 3-4, Thm 4): unprojected SGD, strongly convex only; the un-noised
  final iterate theta_T is kept and a deletion runs K more steps from it on the retained set.

Errata (digest §0.3, §3.4, §3.5), resolved by tests/test_rewind.py: the printed strongly convex constants of
Theorems 2 and 3 divide by mu where their proofs (Thm 18 / Thm 22) give eta / (1 - gamma); the coupled replay
exhibits realized distances above the printed Theorem 2 value.  This module uses the appendix forms only.

Certificate semantics (accounting ``"capacity"``).  sigma is fixed *before training* from public quantities
only -- T, K, eta, b, the declared bounds (G, L, mu, B, C, ell_theta0), n (the public record count at training
time) and the capacity m_cap = min(m_max, n - 1[, D2D bound]) -- and is the same sigma the comparator
"retrain from scratch on D minus Z with the same T, eta, b, theta_0, sigma" uses.  Every release of an epoch
(the training release and the release after every deletion request) is individually (epsilon, delta)-
indistinguishable from that comparator, with delta = ``spec.delta`` = 2 x the calibration delta (the paper's
(epsilon, 2 delta), Lemmas 13/14: Markov tail delta/2 plus a Gaussian mechanism at delta/2).  Several
requests are served by always restarting from the *original* secret start point (theta_{T-K}, or theta_T for
D2D) with the *cumulative* deletion set Z_cum, |Z_cum| <= m_cap: each release is then an instance of the
single-request theorem.  Nothing composes across releases; the guarantee does not cover an adversary who
combines several releases (including the pre-deletion one), nor the secret checkpoint, which still carries
the deleted records' influence until the next retrain.

An epoch whose capacity m_cap is 0 (n = 1, or descend with m/n < 1/(6B + 1) ruling out every deletion, e.g. n up
to a few hundred at a small l2) publishes the trained iterate without noise (sigma = 0) and forgets by an exact
retrain on its training records minus the forgotten ones (issue 21): certificates "exact" with
``details["restart"]`` and ``["retrain"]``, a new epoch; such a model is never ``retrain_required``.  An epoch with
capacity > 0 that has spent it refuses (CapacityExhausted) until ``retrain``, which opens an epoch whose forgets are
certified again, or exact retrains if its capacity is 0.

Release (issue 14; app/unlearning/mechanism/release.py): theta rounded to a grid g plus discrete Gaussian noise on the tail
sensitivity (raised to the float64 round-off floor of T SGD steps when below it, ``roundoff_floor``); the
certificate's sigma and sensitivity are the lattice ones (tail' = tail + g sqrt(d), sigma' = sigma tail'/tail).

Streaming ``learn`` for a batch-trained family: examples are appended and get steps as usual.  Until
``initial_size`` examples are held the model publishes theta_0 = 0 (data independent; forgetting is exact).
The ``learn`` call that reaches ``initial_size`` trains on every held example (that call's batch included).
Later examples are *pending*: with ``learn_policy = "queue"`` (default) they have no influence on the model
until the next ``retrain`` (their deletion is exact and costs no capacity); with ``"retrain"`` every later
``learn`` call retrains from scratch on all held examples (a new epoch, exact, capacity restored).

Randomness: minibatch indices come from an injectable ``BatchSampler``; the default draws every run from a
fresh PCG64 seeded by the OS CSPRNG and stores nothing, so neither indices nor seeds are in ``state()``.
Tests inject a scripted sampler to build the paper's coupling.  Release noise comes from ``self.noise``.
"""
from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..contract.certificate import Certificate, exact_retrain_certificates
from ..contract.errors import CapacityExhausted, ForgetError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData
from ..maths.domain import project_l2_ball
from ..maths.losses import augment, make_loss
from ..mechanism import release
from ..mechanism.noise import NoiseSource
from .rewind_calibration import CHUNK, RewindCalibration, _abc_constants


# ---------------------------------------------------------------------------------------------------------
# Randomness for minibatches
# ---------------------------------------------------------------------------------------------------------
class BatchSampler(Protocol):
    def positions(self, pool_size: int, steps: int, batch: int) -> np.ndarray:
        """(steps, batch) int64 positions into the pool, i.i.d. uniform with replacement."""
        ...


class SecureBatchSampler:
    """Fresh CSPRNG-seeded generator per run; nothing is stored, nothing is reproducible from state."""

    def positions(self, pool_size: int, steps: int, batch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
        return rng.integers(0, pool_size, size=(steps, batch), dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------
class RewindToDelete(RewindCalibration):
    algorithm = "rewind_to_delete"
    accounting = "capacity"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = "(epsilon, delta)-certified unlearning vs retraining, per release, up to m_max deletions per epoch"
    guarantee_words = (
        "Each model published after a deletion is statistically almost indistinguishable (the stated epsilon and "
        "delta) from the model that retraining from scratch without every record deleted so far in this epoch "
        "would publish, with the same training length, step size, batch size and noise level. Each release is "
        "certified on its own; up to m_max deletions per epoch, after which the model must be retrained."
    )

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None, sampler: BatchSampler | None = None):
        super().__init__(spec, noise)
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.variant: str = hp["variant"]
        self.projected: bool = hp["projected"]
        self.regime: str = hp["regime"]
        self.T: int = hp["T"]
        # per epoch; with sigma_target it is chosen at training time (digest §2.4 step 6)
        self.K: int = hp["K"] if hp.get("K") is not None else max(1, self.T // 4)
        self.sigma_target: float | None = hp["sigma_target"]
        self.b: int = hp["batch_size"]
        self.m_max: int = hp["m_max"]
        self.initial_size: int = hp["initial_size"]
        self.learn_policy: str = hp["learn_policy"]
        self.calibration: str = hp["calibration"]
        self.loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, hp, spec.n_classes)
        self.G, self.Ls, self.mu = self.loss.lipschitz, self.loss.smoothness, self.loss.mu
        self.B, self.C, self.ell0 = _abc_constants(spec, self.loss, self.projected)
        self.eta: float = hp["eta"]
        self.sampler: BatchSampler = sampler if sampler is not None else SecureBatchSampler()
        self.dim = spec.n_params
        self._reset_epoch_state()
        self.t = 0
        self.epoch = 0
        self.n_deletions = 0

    def _reset_epoch_state(self) -> None:
        self.trained = 0
        self.trained_upto = 0
        self.n_train = 0
        self.deleted = np.zeros(0, dtype=np.int64)
        self.theta_start = np.zeros(self.dim)  # theta_{T-K} (rewind) or theta_T (descend): SECRET
        self.published_theta = np.zeros(self.dim)  # theta_0 = 0 until the first training
        self.sigma = 0.0
        self.sensitivity = 0.0
        self.capacity_total = 0
        self.rho_release = 0.0
        self.last_release: dict[str, float] = {}  # grid, sigma', tail' of the last release (public; not state)
        self.last_mean = np.zeros(self.dim)

    def records_held(self) -> int:
        return self.t - self.n_deletions

    # ---- state ------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "t": self.t, "epoch": self.epoch, "n_deletions": self.n_deletions, "trained": self.trained,
            "trained_upto": self.trained_upto, "n_train": self.n_train, "deleted": self.deleted.copy(),
            "theta_start": self.theta_start.copy(), "published": self.published_theta.copy(),
            "sigma": self.sigma, "sensitivity": self.sensitivity, "capacity_total": self.capacity_total,
            "rho_release": self.rho_release, "K": self.K,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        for key in ("theta_start", "published"):
            if np.asarray(state[key]).shape != (self.dim,):
                raise ValueError("stored parameters do not match the model dimension")
        self.t = int(state["t"])
        self.epoch = int(state["epoch"])
        self.n_deletions = int(state["n_deletions"])
        self.trained = int(state["trained"])
        self.trained_upto = int(state["trained_upto"])
        self.n_train = int(state["n_train"])
        self.deleted = np.asarray(state["deleted"], dtype=np.int64).copy()
        self.theta_start = np.asarray(state["theta_start"], dtype=np.float64).copy()
        self.published_theta = np.asarray(state["published"], dtype=np.float64).copy()
        self.sigma = float(state["sigma"])
        self.sensitivity = float(state["sensitivity"])
        self.capacity_total = int(state["capacity_total"])
        self.rho_release = float(state["rho_release"])
        self.K = int(state["K"])

    @classmethod
    def from_state(cls, spec: ModelSpec, state: Mapping[str, Any], noise: NoiseSource | None = None,
                   sampler: BatchSampler | None = None) -> RewindToDelete:
        engine = cls(spec, noise, sampler)
        engine.load_state(state)
        return engine

    # ---- public views -----------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.published_theta.copy()

    @property
    def capacity_left(self) -> int:
        return self.capacity_total - len(self.deleted) if self.trained else 0

    @property
    def status(self) -> str:
        # an epoch that certifies no deletion at all (capacity_total 0: few records, or the descend bound
        # m/n < 1/(6B + 1)) forgets by an exact retrain instead (forget), so it never needs one
        return "retrain_required" if self.trained and self.capacity_total > 0 and self.capacity_left <= 0 else "ready"

    def constants(self) -> dict[str, float]:
        out = {"L": self.G, "beta": self.Ls, "mu": self.mu, "D": 2.0 * self.spec.domain_radius, "eta": self.eta}
        if not self.projected:
            out.update({"B": self.B, "C": self.C, "ell_theta0": self.ell0})
        return out

    def ledger(self) -> dict[str, Any]:
        return {
            "accounting": self.accounting,
            "rho_spent": self.rho_release,  # the current release's conditional Gaussian charge; nothing composes
            "rho_budget": None,
            "capacity_total": self.capacity_total if self.trained else None,
            "capacity_left": self.capacity_left if self.trained else None,
            "deletions": self.n_deletions,
            "epoch": self.epoch,
            "trained": bool(self.trained),
            "n_train": self.n_train,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "epsilon": self.spec.epsilon,
            "delta": self.spec.delta,
            "conversion": self._conversion(),
        }

    # ---- SGD ------------------------------------------------------------------------------------------------
    def _sgd(self, theta: np.ndarray, pool: "_Pool", steps: int,
             checkpoint_after: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        pos = np.asarray(self.sampler.positions(pool.n, steps, self.b), dtype=np.int64)
        if pos.shape != (steps, self.b) or (steps and (pos.min() < 0 or pos.max() >= pool.n)):
            raise RuntimeError("batch sampler returned positions of the wrong shape or range")
        # only the rows this run samples are read from the store: memory O(min(n, steps * b) d)
        uniq, inverse = np.unique(pos, return_inverse=True)
        Xa, y = pool.rows(uniq)
        y = self.loss.normalize_labels(y)
        local = inverse.reshape(pos.shape)
        R, eta, proj = self.spec.domain_radius, self.eta, self.projected
        ckpt = theta.copy() if checkpoint_after == 0 else None
        for t, idx in enumerate(local, start=1):
            theta = theta - eta * self.loss.mean_grad(theta, Xa[idx], y[idx])
            if proj:
                theta = project_l2_ball(theta, R)
            if t == checkpoint_after:
                ckpt = theta.copy()
        return theta, ckpt

    def _train(self, pool: "_Pool", upto: int) -> None:
        """Algorithm 1 / 3 on the n records given, as a new epoch.  sigma is fixed first, from public quantities
        only (n, m_cap, T, K, eta, b, declared bounds), before the first SGD step.  Nothing is changed if it raises."""
        n = pool.n
        if n == 0:
            self._reset_epoch_state()
            self.epoch += 1
            return
        cap = self.capacity_for(n)
        K = self.min_K(n, cap, self.sigma_target) if self.sigma_target is not None else self.K
        sens = self.sensitivity_bound(n, cap, K) if cap > 0 else 0.0
        sigma, tail = self.noise_scale(sens)
        theta0 = np.zeros(self.dim)  # data-independent start, inside the projection ball
        if self.variant == "rewind":
            theta_T, start = self._sgd(theta0, pool, self.T, checkpoint_after=self.T - K)
        else:
            theta_T, _ = self._sgd(theta0, pool, self.T)
            start = theta_T.copy()
        self._reset_epoch_state()
        self.epoch += 1
        self.K = K
        self.theta_start = start
        self.trained, self.trained_upto, self.n_train = 1, upto, n
        self.capacity_total, self.sigma, self.sensitivity = cap, sigma, sens
        # (tail/sigma)^2/2 = tail^2/(2 sigma^2): the ratio first, so that neither square under- or overflows
        self.rho_release = 0.5 * (tail / sigma) ** 2 if sigma > 0 else 0.0
        self.published_theta = self._release(theta_T)

    def roundoff_floor(self) -> float:
        """Float64 round-off two coupled runs (this one and the comparator's retrain) can add to the distance of
        their final iterates (release.py): each SGD step on a minibatch of b errs by at most
        e = C (d + 1 + b) u_64 (R + eta G), and an error is carried by the later steps' Lipschitz factor --
        max(|1 - eta mu|, |1 - eta beta|) (strongly convex), 1 (convex), 1 + eta beta (nonconvex) -- over at most T
        steps; the floor is 2 sum_{j<T} c^j e, in the same units as the tail sensitivity it is compared with
        (the Markov tail divides the expected distance by d1 >= 1, so comparing with the undivided floor is safe)."""
        e = release.step_roundoff(self.dim + self.b, self.spec.domain_radius, self.eta * self.G)
        if self.regime == "strongly_convex":
            c = max(abs(1.0 - self.eta * self.mu), abs(1.0 - self.eta * self.Ls))
        elif self.regime == "convex":
            c = 1.0
        else:
            c = 1.0 + self.eta * self.Ls
        return release.roundoff_floor(e, self.T, c)

    def _release(self, theta: np.ndarray) -> np.ndarray:
        """theta released through the discrete Gaussian with a fresh draw every time (never reuse the training
        noise): the Gaussian mechanism's sensitivity is the tail sensitivity, raised to the round-off floor when it
        is below it (sigma scaled with it), then the grid's lattice sensitivity tail' = tail + g sqrt(d) and
        sigma' = sigma tail'/tail (release.py; the (epsilon, delta) calibration of sigma/tail carries over, CKS20).
        ``last_release`` keeps the public grid, sigma' and tail' for the certificates."""
        self.last_mean = theta.copy()  # the pre-noise iterate (coupled replays only; never state, never published)
        if self.sigma == 0.0:
            self.last_release = {}
            return theta.copy()
        tail, sigma, floor = self.tail_sensitivity, self.sigma, self.roundoff_floor()
        if floor > tail:
            sigma, tail = (sigma * floor / tail if tail > 0.0 else sigma), floor
        out, grid, sigma_used, tail_used = release.discrete_release(theta, tail, sigma, self.noise,
                                                                    scale=self.spec.domain_radius)
        self.last_release = {"grid": grid, "sigma": sigma_used, "tail_sensitivity": tail_used, "roundoff_floor": floor}
        return out

    # ---- learning -------------------------------------------------------------------------------------------
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        """Append examples.  The call that brings the held examples to ``initial_size`` trains on all of them;
        after that, examples are pending until the next retrain (``learn_policy="queue"``) or every call
        retrains (``"retrain"``).  ``retained`` holds the examples learned before this call (None: none)."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        new_t = self.t + len(y)
        steps = np.arange(self.t + 1, new_t + 1, dtype=np.int64)
        held = (len(retained) if retained is not None else 0) + len(y)
        if len(y) and ((not self.trained and held >= self.initial_size)
                       or (self.trained and self.learn_policy == "retrain")):
            self._train(_Pool(retained, (), None, self.spec.dim, X, y), new_t)
        self.t = new_t
        return steps

    def retrain(self, retained: RetainedData | None) -> None:
        """Exact retrain on every held example (pending ones included): new epoch, fresh capacity."""
        self._train(_Pool(retained, (), None, self.spec.dim), self.t)

    # ---- unlearning -----------------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = [int(s) for s in steps]
        if len(set(steps)) != len(steps):
            raise ForgetError("a step is named twice in one request")
        if retained is None:
            raise ValueError(f"{self.algorithm} needs the retained examples to forget")
        already = set(self.deleted.tolist())
        for u in steps:
            if not 1 <= u <= self.t:
                raise ForgetError(f"step {u} was never learned by this model")
            if u in already:
                raise ForgetError(f"step {u} was already forgotten")
        try:
            retained.get(steps)
        except KeyError:
            raise ForgetError("some steps are not held (already forgotten)") from None
        in_model = [u for u in steps if self.trained and u <= self.trained_upto]
        if in_model and self.capacity_total == 0:
            return self._forget_by_retrain(steps, in_model, retained)
        m_cum = len(self.deleted) + len(in_model)
        if in_model and m_cum > self.capacity_total:
            raise CapacityExhausted(
                f"{len(in_model)} deletion(s) requested, {self.capacity_left} certifiable before a retrain "
                f"(m_max = {self.m_max}, capacity {self.capacity_total} for n = {self.n_train})")
        tau = self.t
        certs: list[Certificate] = []
        if in_model:
            deleted = np.union1d(self.deleted, np.asarray(in_model, dtype=np.int64))
            pool = _Pool(retained, steps, self.trained_upto, self.spec.dim)
            if pool.n != self.n_train - len(deleted):
                raise RuntimeError("retained store does not match the training set minus the deletions")
            # Algorithm 2 (rewind: K steps from theta_{T-K}) or 4 (descend: K steps from theta_T); always from
            # the ORIGINAL secret start point with the cumulative deletion set (digest §5.2).
            theta, _ = self._sgd(self.theta_start.copy(), pool, self.K)
            self.deleted = deleted
            self.published_theta = self._release(theta)
            details = {"m_cumulative": float(len(deleted)), "capacity_total": float(self.capacity_total),
                       "capacity_left": float(self.capacity_left), "n_train": float(self.n_train),
                       "T": float(self.T), "K": float(self.K), "eta": self.eta, "batch_size": float(self.b),
                       "Sigma_at_m": self.sensitivity_bound(self.n_train, len(deleted)),
                       "epoch": float(self.epoch), "delta_total": self.spec.delta}
            mech = release.MECHANISM if self.sigma > 0 else "exact"  # K = T: rewinding to theta_0 is retraining
            rel = self.last_release
            sigma_used, sens = rel.get("sigma", self.sigma), self.sensitivity
            if rel:  # Sigma scaled like the tail: sensitivity'/sigma' = Sigma/sigma (release.py)
                sens = self.sensitivity * rel["tail_sensitivity"] / self.tail_sensitivity
                details.update(grid=rel["grid"], shift=self.sensitivity, roundoff_floor=rel["roundoff_floor"],
                               tail_sensitivity=rel["tail_sensitivity"])
            for u in in_model:
                self.n_deletions += 1
                certs.append(Certificate(
                    learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions, mechanism=mech,
                    sigma=sigma_used, sensitivity=sens, rho=self.rho_release, details=details))
        for u in steps:
            if u in in_model:
                continue
            # not part of the trained model (collected before training, or pending): forgetting is exact
            self.n_deletions += 1
            certs.append(Certificate(
                learned_step=u, forgotten_step=tau, deletion_index=self.n_deletions, mechanism="exact",
                sigma=0.0, sensitivity=0.0, rho=0.0, details={"pending": 1.0, "epoch": float(self.epoch)}))
        certs.sort(key=lambda c: steps.index(c.learned_step))
        return certs

    def _forget_by_retrain(self, steps: list[int], in_model: list[int], retained: RetainedData) -> list[Certificate]:
        """An epoch that certifies no deletion (capacity 0, so sigma = 0 and the release is the trained iterate)
        forgets by retraining from theta_0 on the trained records minus ``steps`` (the pending ones stay pending):
        the new state is exactly what training without them gives -- the comparator itself -- so every
        certificate is exact (sigma = rho = 0).  The first one carries ``restart`` (the state was discarded; a new
        ledger epoch begins) and ``retrain``."""
        pool = _Pool(retained, steps, self.trained_upto, self.spec.dim)
        if pool.n != self.n_train - len(self.deleted) - len(in_model):
            raise RuntimeError("retained store does not match the training set minus the deletions")
        tau = self.t
        self._train(pool, self.trained_upto)
        certs = exact_retrain_certificates(steps, tau, self.n_deletions,
                                           {"epoch": float(self.epoch), "n_train": float(self.n_train)})
        self.n_deletions += len(certs)
        return certs


class _Pool:
    """The SGD pool D' in step order (the retained examples, optionally with steps <= upto, minus ``exclude``,
    then any new examples of this call).  Only its step ids are held; ``rows`` reads the sampled rows from the
    store in chunks, so a run never loads the whole retained set (SGD needs random access to D')."""

    def __init__(self, retained: RetainedData | None, exclude: Sequence[int], upto: int | None, dim: int,
                 new_X: np.ndarray | None = None, new_y: np.ndarray | None = None):
        parts = []
        if retained is not None:
            for s, _, _ in retained.chunks(CHUNK, exclude=exclude):
                s = np.asarray(s, dtype=np.int64)
                parts.append(s if upto is None else s[s <= upto])
        self.steps = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.retained, self.dim = retained, dim
        self.new_X = np.zeros((0, dim)) if new_X is None else np.asarray(new_X, dtype=np.float64)
        self.new_y = np.zeros(0) if new_y is None else np.asarray(new_y, dtype=np.float64)
        self.n = len(self.steps) + len(self.new_y)

    def rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(augmented X, y) at sorted unique ``positions`` of the pool."""
        held = positions[positions < len(self.steps)]
        Xs, ys = [np.zeros((0, self.dim))], [np.zeros(0)]
        for i in range(0, len(held), CHUNK):
            X, y = self.retained.get(self.steps[held[i : i + CHUNK]])
            Xs.append(np.asarray(X, dtype=np.float64).reshape(-1, self.dim))
            ys.append(np.asarray(y, dtype=np.float64))
        fresh = positions[positions >= len(self.steps)] - len(self.steps)
        Xs.append(self.new_X[fresh])
        ys.append(self.new_y[fresh])
        return augment(np.vstack(Xs)), np.concatenate(ys)
