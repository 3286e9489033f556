"""Exact-retrain baseline (digest §2.9): OGD, and at each forget a recomputation of OGD without the record.

Learning is projected OGD with the passive family's default schedule (eta_t = min(1/(mu t), 2/(beta+mu))).
A forget recomputes OGD from the data-independent start theta = 0 over the retained examples in step order,
skipping the forgotten ones and keeping the clock (a retained example learned at step s is replayed with
eta_s, pitfall P7).  The result *is* the reference run of the OLU definition on the masked stream, so the
published parameters after a forget are exactly what the model would publish had the record never been
learned: certificate mechanism "exact", sigma = 0, rho = 0.  Cost O(n d) per forget, streamed in chunks.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import ForgetError, SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData, Unlearner, checked_forget_steps
from ..maths import work_budget as wb
from ..maths.domain import project_l2_ball
from ..maths.losses import Loss, augment
from ..maths.schedules import CappedStronglyConvex, Schedule
from ..mechanism import fast
from ..mechanism.calibration import Checks, common_checks, construct, update_norm_bound
from ..mechanism.noise import NoiseSource

SCHEDULES = ("strongly_convex_capped",)
CHUNK_SIZE = 4096


def ogd_run(loss: Loss, schedule: Schedule, radius: float, theta: np.ndarray, X: np.ndarray, y: np.ndarray,
            steps: Sequence[int]) -> np.ndarray:
    """Projected OGD over the raw rows X: example k is consumed at clock ``steps[k]`` with eta_{steps[k]} (000
    §2.3); returns the new iterate (``theta`` is not changed).

    Learning and every replay of the exact families go through here, so a forget's recomputation does the very
    operations the learning did: for the scalar losses the exact loop of mechanism/exact_ogd.py, compiled once
    numba has loaded it and in numpy before (or without numba), the same bits either way (issue 32); softmax
    (and test losses) take the numpy loop over ``Loss.grad`` below, also in learning and replay alike."""
    if fast.exact_supported(schedule, loss):
        return fast.exact_ogd_at(theta, X, y, np.asarray(steps, dtype=np.int64), schedule, loss, radius)
    for s, x_aug, label in zip(steps, augment(np.asarray(X, dtype=np.float64)), y):
        theta = project_l2_ball(theta - schedule.eta(int(s)) * loss.grad(theta, x_aug, label), radius)
    return theta


def ogd_recompute(loss: Loss, schedule: Schedule, radius: float, dim: int, retained: RetainedData,
                  exclude: Collection[int] = (), upto: int | None = None, chunk_size: int = CHUNK_SIZE) -> np.ndarray:
    """OGD from theta = 0 over the retained examples (minus ``exclude``) in step order, clock kept.

    Equals, bit for bit, a fresh run on the masked stream (skipped steps do not update).
    """
    theta = np.zeros(loss.n_params(dim))
    for steps, X, y in retained.chunks(chunk_size, exclude=exclude):
        if upto is not None and len(steps) and steps[-1] > upto:  # (no copy of a chunk that is all kept)
            keep = steps <= upto
            steps, X, y = steps[keep], X[keep], y[keep]
        if len(steps):
            theta = ogd_run(loss, schedule, radius, theta, np.asarray(X, dtype=np.float64),
                            np.asarray(y, dtype=np.float64), steps)
    return theta


class OGDIterate:
    """Shared by the families whose state is one projected-OGD iterate ``theta`` on the step clock ``t``
    (they set ``loss``, ``schedule``, ``spec``, ``theta`` and ``t``): learning, skipping, the published output."""

    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        steps = np.arange(self.t + 1, self.t + 1 + len(X), dtype=np.int64)
        self.theta = ogd_run(self.loss, self.schedule, self.spec.domain_radius, self.theta, X,
                             np.asarray(y, dtype=np.float64), steps)
        self.t += len(X)
        return steps

    def skip(self, n: int = 1) -> None:
        """Advance the clock without an update (the masked stream's skip symbol; the clock is kept, P7)."""
        self.t += n

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.theta.copy()


def check_forget_steps(steps: Sequence[int], t: int, retained: RetainedData | None, algorithm: str) -> list[int]:
    """Validate a forget request against the clock and the retained store (shared by data-holding families)."""
    steps = checked_forget_steps(steps, t)
    if retained is None:
        raise ForgetError(f"{algorithm} needs the retained examples to forget")
    if steps:
        try:
            retained.get(steps)
        except KeyError:
            raise ForgetError("some steps are not held (already forgotten?)") from None
    return steps


class ExactOGD(Unlearner):
    """What the exact families built on projected OGD share (retrain; sisa, one OGD per shard): the data kept, the
    passive schedule eta_t = min(1/(mu t), 2/(beta+mu)) from theta = 0, the hyperparameters (``schedule``,
    ``huber_delta``, and the family's ``OWN_HYPERPARAMETERS``), the calibration checks, the public constants and a
    ledger with nothing to spend (rho = 0).  Subclasses call ``start_ogd`` in ``__init__``."""

    accounting = "per_update"
    needs_retained_data = True
    supports_retrain = True
    guarantee_definition = "exact unlearning (rho = 0)"
    OWN_HYPERPARAMETERS: tuple[str, ...] = ()

    def start_ogd(self, spec: ModelSpec) -> dict[str, Any]:
        hp = self.normalize_hyperparameters(spec)
        self.hp = hp
        self.declare_loss(hp)
        self.schedule: Schedule = CappedStronglyConvex(self.mu, self.beta)
        self.chunk_size = CHUNK_SIZE
        self.t = 0
        self.n_deletions = 0
        self.epoch = 0
        return hp

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        hp = dict(spec.hyperparameters)
        unknown = set(hp) - {"schedule", "huber_delta", *cls.OWN_HYPERPARAMETERS}
        if unknown:
            raise SpecError(f"unknown hyperparameters for {cls.algorithm}: {', '.join(sorted(unknown))}")
        hp.setdefault("schedule", "strongly_convex_capped")
        if hp["schedule"] not in SCHEDULES:
            raise SpecError(f"schedule must be one of {', '.join(SCHEDULES)}", fields=("hyperparameters.schedule",))
        if spec.loss == "huber":
            hp.setdefault("huber_delta", 1.0)
        if not spec.l2 > 0:
            raise SpecError(f"{cls.algorithm} needs l2 > 0 (strong convexity mu = l2)", fields=("l2",))
        return hp

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """Exact forgetting needs no noise: the loss constants and the largest OGD step (eta_1 L) must be finite."""
        checks = Checks(cls.algorithm)
        eng = construct(cls, spec)
        common_checks(checks, eng.loss, spec)
        eta_1 = checks.finite("eta_1", lambda: eng.schedule.eta(1), "l2", "bounds.x_norm", positive=True)
        step = checks.squared("eta_1 L", eta_1 * eng.L, "bounds.x_norm", "l2", "domain_radius")
        checks.squared("update_norm", update_norm_bound(spec.domain_radius, step), "domain_radius", "bounds.x_norm")

    def records_held(self) -> int:
        return self.t - self.n_deletions

    def constants(self) -> dict[str, float]:
        return {"L": self.L, "beta": self.beta, "mu": self.mu, "D": 2.0 * self.spec.domain_radius}

    def ledger(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "rho_spent": 0.0, "rho_budget": None,
                "capacity_total": None, "capacity_left": None, "deletions": self.n_deletions}


class RetrainOGD(OGDIterate, ExactOGD):
    algorithm = "retrain"
    guarantee_words = (
        "After the deletion the model is recomputed without the record: what it publishes is exactly what the "
        "same algorithm would have published had the record never been learned."
    )

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        self.start_ogd(spec)
        self.theta = np.zeros(spec.n_params)

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Learn: one OGD step per example.  Forget and retrain: read every kept record and replay OGD over them
        (one recomputation serves a whole forget request): O(N d) for N = max_records."""
        p, N = spec.n_params, int(spec.hyperparameters.get("max_records") or batch)
        replay = wb.read(N, p) + wb.exact_ogd(N, p)  # the compiled exact loop (mechanism/exact_ogd.py)
        check = wb.read_random(1, p)  # the forgotten record is looked up first (held?)
        return wb.Cost(learn=wb.exact_ogd(batch, p) + wb.CALL, forget=replay + check,
                       forget_each=check - wb.STORE, retrain=replay,
                       array_bytes=wb.F64 * (p + 1) * min(N, CHUNK_SIZE) * 2,
                       learn_fields=("dim",), forget_fields=("hyperparameters.max_records", "dim"))

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"theta": self.theta.copy(), "t": self.t, "n_deletions": self.n_deletions, "epoch": self.epoch}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.theta = self.stored_theta(state)
        self.t = int(state["t"])
        self.n_deletions = int(state["n_deletions"])
        self.epoch = int(state["epoch"])

    # ---- unlearning -------------------------------------------------------------------------------
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = check_forget_steps(steps, self.t, retained, self.algorithm)
        if not steps:
            return []
        # One recomputation serves the whole request: every certificate refers to the same exact state.
        self.theta = ogd_recompute(self.loss, self.schedule, self.spec.domain_radius, self.spec.dim, retained,
                                   exclude=steps, upto=self.t, chunk_size=self.chunk_size)
        certs = []
        for u in steps:
            self.n_deletions += 1
            certs.append(Certificate(learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions,
                                     mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0,
                                     details={"recomputed_from_step": 1.0}))
        return certs

    def retrain(self, retained: RetainedData) -> None:
        self.theta = ogd_recompute(self.loss, self.schedule, self.spec.domain_radius, self.spec.dim, retained,
                                   upto=self.t, chunk_size=self.chunk_size)
        self.epoch += 1
