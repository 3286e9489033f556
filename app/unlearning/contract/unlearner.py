"""The engine contract (ARCHITECTURE.md §3): one small interface every algorithm implements.

The engine is pure numpy: no I/O, no web framework, no SQL.  The service talks to an
``Unlearner`` only through the methods below and never branches on algorithm names.
"""
from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Collection, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..maths import work_budget as wb
from ..mechanism.noise import NoiseSource, SecureGaussianNoise
from .certificate import Certificate
from .errors import ForgetError, InputError, SpecError
from .spec import BOUND_TOLERANCE, LIMIT_KEYS, ModelSpec, normalize_limits


class RetainedData(Protocol):
    """Access to the examples a data-holding family keeps (``needs_retained_data``).

    It reflects the store as it is when the engine is called: during ``forget(steps, retained)`` the examples
    being forgotten are still in it (the service erases them after the engine returns, in the same
    transaction), so engines that recompute must pass ``exclude=steps``.  During ``learn`` it holds the
    examples learned before this call, not the new ones.  Large sets are streamed in chunks.
    """

    def __len__(self) -> int: ...

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(X, y) of the examples learned at ``steps``, in that order (KeyError if one is not held)."""
        ...

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Yield (steps, X, y) chunks of at most ``size`` examples in step order, skipping ``exclude``."""
        ...


class ArrayRetained:
    """In-memory ``RetainedData`` over arrays (tests, replay, and client-supplied examples)."""

    def __init__(self, steps: Any, X: Any, y: Any):
        order = np.argsort(np.asarray(steps, dtype=np.int64).reshape(-1), kind="stable")
        self.steps = np.asarray(steps, dtype=np.int64).reshape(-1)[order]
        X = np.asarray(X, dtype=np.float64)
        X = X.reshape(len(self.steps), -1) if len(self.steps) else X.reshape(0, X.shape[-1] if X.ndim == 2 else 0)
        self.X = X[order]
        self.y = np.asarray(y, dtype=np.float64).reshape(-1)[order]

    def __len__(self) -> int:
        return len(self.steps)

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(self.steps, np.asarray(steps, dtype=np.int64))
        if len(idx) and (idx.max() >= len(self.steps) or not np.array_equal(self.steps[idx], np.asarray(steps))):
            raise KeyError("some steps are not retained")
        return self.X[idx], self.y[idx]

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Read-only views when nothing is excluded, else each chunk's rows gathered on its own (no n x d copy of
        the whole set per call: a replay over 1e6 records reads them once)."""
        keep = ~np.isin(self.steps, np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
        idx = None if keep.all() else np.flatnonzero(keep)
        for start in range(0, len(self.steps) if idx is None else len(idx), size):
            if idx is None:
                part = self.steps[start : start + size], self.X[start : start + size], self.y[start : start + size]
                for a in part:
                    a.flags.writeable = False  # a view of the store: readers never change what they read
            else:
                j = idx[start : start + size]
                part = self.steps[j], self.X[j], self.y[j]
            yield part


State = dict[str, "np.ndarray | int | float"]


class Unlearner(ABC):
    """A certified learner-unlearner.

    Subclasses set the class attributes and implement the abstract methods.  ``state()`` must round-trip
    exactly through ``from_state``; it holds only named float64/int64 arrays and Python numbers.
    """

    algorithm: ClassVar[str]
    accounting: ClassVar[str]  # "omega_series" | "per_update" | "capacity"
    needs_retained_data: ClassVar[bool] = False
    # True when forget() needs the deleted records' (x, y) although the service keeps no data: the client sends
    # them with the unlearn request (the service checks them against a MAC stored at learn time)
    needs_deletion_features: ClassVar[bool] = False
    # losses besides softmax with which the family is a classifier when the spec declares n_classes / classes
    # (labels are class indices; exact_ridge: least squares on +-1 targets); the service refuses classes otherwise
    classifier_losses: ClassVar[tuple[str, ...]] = ()
    guarantee_definition: ClassVar[str]
    guarantee_words: ClassVar[str]

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        self.spec = spec
        self.noise: NoiseSource = noise if noise is not None else SecureGaussianNoise()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every family takes the limit hyperparameters (LIMIT_KEYS) without knowing them: its own
        ``normalize_hyperparameters`` sees the spec without them and they are checked and put back afterwards;
        its ``forget`` refuses a request naming more records than ``max_forget_batch`` before anything changes."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("normalize_hyperparameters")
        if own is not None and not getattr(own.__func__, "_limits", False):
            fn = own.__func__

            @functools.wraps(fn)
            def normalize(klass, spec: ModelSpec) -> dict[str, Any]:
                hp = dict(spec.hyperparameters)
                limits = {k: hp.pop(k) for k in LIMIT_KEYS if k in hp}
                out = fn(klass, spec.with_hyperparameters(hp) if limits else spec)
                out.update(normalize_limits(limits))
                return out

            normalize._limits = True  # type: ignore[attr-defined]
            cls.normalize_hyperparameters = classmethod(normalize)  # type: ignore[method-assign]
        forget = cls.__dict__.get("forget")
        if forget is not None and not getattr(forget, "_limits", False):
            @functools.wraps(forget)
            def limited(self, steps, retained=None):
                cap = self.spec.hyperparameters.get("max_forget_batch")
                if cap is not None and len(steps) > int(cap):
                    raise ForgetError(f"this model forgets at most {int(cap)} records per request (its work "
                                      f"budget, hyperparameters.max_forget_batch); send the {len(steps)} ids in "
                                      "several requests")
                return forget(self, steps, retained)

            limited._limits = True  # type: ignore[attr-defined]
            cls.forget = limited  # type: ignore[method-assign]

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        """Validate ``spec.hyperparameters`` and return them with every default filled in."""
        return dict(spec.hyperparameters)

    @classmethod
    def check_calibration(cls, spec: ModelSpec) -> None:
        """Refuse (``SpecError`` naming the fields) a spec for which any calibration the model may ever need
        -- loss constants, step sizes, the sigma of the last certifiable deletion, iteration counts, the squared
        norms its updates form -- would be non-finite, or zero where it divides.  Families evaluate their own
        calibration at its worst case (app/unlearning/mechanism/calibration.py); this default covers the loss constants."""
        from ..mechanism.calibration import Checks, common_checks, construct

        checks = Checks(cls.algorithm)
        engine = construct(cls, spec)
        common_checks(checks, engine.loss, spec)

    @classmethod
    def from_state(cls, spec: ModelSpec, state: Mapping[str, Any], noise: NoiseSource | None = None) -> "Unlearner":
        engine = cls(spec, noise)
        engine.load_state(state)
        return engine

    @abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def state(self) -> State: ...

    def stored_state(self) -> State:
        """What the service stores of the state (packed and sealed at each base write): ``state()`` unless the family
        has a more compact form that ``load_state`` also reads (exact_ridge: the upper triangle of its symmetric A)."""
        return self.state()

    # ---- the contract -------------------------------------------------------------------
    @abstractmethod
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        """Consume validated examples in order; return the step assigned to each.

        ``retained`` (data-holding families only) holds the examples learned before this call.
        """

    @abstractmethod
    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        """Remove the influence of the examples learned at ``steps``; one certificate each."""

    @abstractmethod
    def published(self) -> np.ndarray:
        """The only parameters that ever leave the engine: weights followed by the bias (d + 1); softmax: the
        K x (d + 1) matrix flattened row-major."""

    @property
    @abstractmethod
    def step(self) -> int: ...

    @abstractmethod
    def constants(self) -> dict[str, float]:
        """Public constants L, beta, mu, D derived from the spec (never from data)."""

    @abstractmethod
    def ledger(self) -> dict[str, Any]:
        """Public accounting: rho_spent, rho_budget, capacity_total, capacity_left, deletions."""

    supports_retrain: ClassVar[bool] = False
    # Issue 36 item 1: True when ``learn`` is a deterministic function of the state and the batch (no noise, no
    # retained data read) and learning batches one after another gives, bit for bit, the state of learning them
    # concatenated in one call (exact integer sums).  The service then stores a learn as the batch itself (sealed;
    # a few kB) instead of the whole state, and rebuilds a version by re-learning the batches logged since the last
    # full state (app/db/state_log.py); every forget folds that log into a full state again.
    learn_replays_exactly: ClassVar[bool] = False
    # True when ``published()`` and ``state()`` only read what a learn or forget left (any cache ``published`` fills
    # is not part of ``state``): the service may then solve the published parameters on one thread while it packs
    # and seals the state on another (exact_ridge at D = 1 025: a Cholesky beside an 8 MiB state).
    publish_beside_state: ClassVar[bool] = False

    def accounting_params(self) -> dict[str, Any] | None:
        """Parameters of the ledger policy in ``app.privacy`` that this model's Gaussian certificates must fit
        (``{"accounting": "omega_series" | "capacity", ...}``), so that the service can check every charge
        independently of the engine; None for families whose guarantee is not an additive zCDP budget."""
        return None

    def creation_charge(self) -> dict[str, float] | None:
        """A privacy charge paid when the model is created ({"sigma", "rho"}), for families that are private from
        the start (the whole declared stream is charged up front and deletions are free); None otherwise."""
        return None

    def learn_capacity(self) -> int | None:
        """How many more examples the model may learn (a declared horizon, or the retained-record cap
        ``max_records`` less the records held), or None for no limit."""
        cap = self.spec.hyperparameters.get("max_records")
        held = self.records_held()
        if cap is None or held is None:
            return None
        return max(0, int(cap) - held)

    def learn_refusal(self) -> str | None:
        """Why the model learns nothing more, with the remedy, where ``learn_capacity`` is spent for a reason of its
        own (the service answers it as the 409 horizon-reached problem's detail); None: the service's own words."""
        return None

    @classmethod
    def publishes_counts(cls, spec: ModelSpec) -> bool:
        """Whether the model's record counts (records learned, held and forgotten, and the steps, which count the
        records learned) may be shown in its metadata and receipts.  False for a family whose published versions are
        private with respect to each record's presence (exact_ridge with publication private): an exact count would
        tell an observer that a record came or went.  The service then withholds them (null)."""
        return True

    def learn_capacity_field(self) -> str | None:
        """The spec field that bounds ``learn_capacity`` (a refusal at the cap names it): the retained-record cap
        ``hyperparameters.max_records`` where the spec has one, else a declared ``hyperparameters.horizon``; None
        when the bound is a constant of the family."""
        hp = self.spec.hyperparameters
        if hp.get("max_records") is not None:
            return "hyperparameters.max_records"
        return "hyperparameters.horizon" if hp.get("horizon") is not None else None

    def learn_batch_limit(self) -> int | None:
        """The most examples one learn request may carry (``max_learn_batch``: the work budget), or None."""
        cap = self.spec.hyperparameters.get("max_learn_batch")
        return None if cap is None else int(cap)

    def records_held(self) -> int | None:
        """The records this model keeps now (families that keep data; None for the others)."""
        return None

    def dropped_through(self) -> int:
        """The last step whose record no longer influences the state although nobody forgot it: an exact restart of
        a model that keeps no data discards everything learned before it (the records stay in the service's record
        index, and a later forget of one is an exact receipt).  0 when none.  A family that restarts keeps the last
        step before its current epoch in ``epoch_start``; a model that keeps its data relearns what it holds at a
        restart, so it drops nothing.  The service counts those records as no longer held (quotas, issue 37)."""
        if self.needs_retained_data:
            return 0
        return int(getattr(self, "epoch_start", 0) or 0)

    def retained_groups(self, steps: np.ndarray) -> np.ndarray:
        """The public group of each retained step (int64, like ``steps``): the store seals a group's records together
        (issue 36 item 2), so that a replay reading one group (sisa: one shard) reads and decrypts only its records.
        A pure function of the step and the spec, never of data; it is part of the stored layout, so it must not
        change for an existing spec.  The default puts every record in group 0."""
        return np.zeros(len(steps), dtype=np.int64)

    def restart_steps(self, steps: np.ndarray) -> tuple[int, int] | None:
        """Of the steps a ``learn`` call just assigned, the (first, last) range whose forget will discard the
        whole learned state (an exact restart: receipts say so) rather than being certified by noise, known from
        public step indices; None when no forget of them restarts the model."""
        return None

    # ---- work and memory (issue 21) ----------------------------------------------------------------
    @classmethod
    def keeps_records(cls, spec: ModelSpec) -> bool:
        """Whether the work of a request grows with the records the model keeps: such a spec needs the retained-
        record cap ``max_records`` (filled in by the service from its budget when not given)."""
        return bool(cls.needs_retained_data)

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> "wb.Cost":
        """The worst case of one request (app/unlearning/maths/work_budget.py), from the normalised spec alone: ``batch`` is
        the largest learn request; a family that keeps records reads its cap from ``max_records``.  This default
        is the one-pass online learner: one projected OGD step per example (the compiled loop for the scalar losses
        on a schedule of the clock alone, a Python step otherwise), a Gaussian release per forget."""
        from ..mechanism.fast import LOSS_CODES

        p = spec.n_params
        compiled = spec.loss in LOSS_CODES and spec.hyperparameters.get("schedule") != "adaptive"
        learn = wb.fast_ogd(batch, p) if compiled else wb.ogd_steps(batch, p)
        # a forget request's certificate, ledger and checks in Python beside the release: passive_olu's forget at
        # p = 1 251 measured 0.37 ms alone and 0.65-0.76 ms in the calibration run (issue 36 item 3), 0.16 the release
        return wb.Cost(learn=learn, forget=wb.release(p) + 10.0 * wb.STEP, forget_each=wb.release(p),
                       array_bytes=wb.F64 * p)

    @classmethod
    def predict_cost(cls, spec: ModelSpec, n: int) -> float:
        """The work of predicting ``n`` rows from the published parameters (``predict_published``): each member of
        ``published_shape`` scores the rows over its outputs (a classifier's K, else 1)."""
        shape = cls.published_shape(spec)
        members = shape[0] if cls.published_ensemble(spec) else 1
        outputs = int(np.prod(shape)) // (members * (spec.dim + 1))
        return wb.predict(n, spec.dim + 1, outputs, members)

    @classmethod
    def estimate(cls, spec: ModelSpec, batch: int) -> "wb.Cost":
        """``cost``, never an exception other than a refusal: an estimate that leaves the float range (an overflow a
        family's estimate did not saturate) is a SpecError naming the numeric hyperparameters (issue 29)."""
        try:
            return cls.cost(spec, batch)
        except SpecError:
            raise
        except (ArithmeticError, ValueError) as e:
            hp = [f"hyperparameters.{k}" for k, v in spec.hyperparameters.items() if type(v) in (int, float)]
            err = SpecError(f"{spec.algorithm}: the work of one request cannot be estimated ({type(e).__name__}); "
                            "lower its largest numbers", fields=(*hp, "dim"))
            err.field, err.located = err.fields[0], True  # type: ignore[attr-defined]  # no range to search
            raise err from None

    def retrain(self, retained: RetainedData) -> None:
        """Exact retrain on the retained examples: a new ledger epoch (data-holding families)."""
        raise NotImplementedError(f"{self.algorithm} keeps no data to retrain on")

    # ---- shared helpers -----------------------------------------------------------------
    def declare_loss(self, hp: Mapping[str, Any], extra_mu: float = 0.0) -> None:
        """Set ``loss`` and its public constants L, beta, mu from the declared bounds (never from data);
        ``extra_mu`` adds a surrogate's own regulariser (000 Thm 3.4)."""
        from ..maths.losses import make_loss

        spec = self.spec
        self.loss = make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2 + extra_mu, hp,
                               spec.n_classes)
        self.L = self.loss.lipschitz
        self.beta = self.loss.smoothness
        self.mu = self.loss.mu

    def stored_theta(self, state: Mapping[str, Any], key: str = "theta") -> np.ndarray:
        """A parameter vector from a stored state, checked against the model dimension (n_params)."""
        theta = np.asarray(state[key], dtype=np.float64)
        if theta.shape != (self.spec.n_params,):
            raise ValueError("stored parameters do not match the model dimension")
        return theta.copy()

    @property
    def status(self) -> str:
        """"ready", or "retrain_required" once the model can certify no further deletion."""
        return "ready"

    def validate_examples(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        return validate_examples(self.spec, self.loss, X, y)

    # ---- prediction from the published parameters alone (the service predicts without loading the engine) -----
    @classmethod
    def published_shape(cls, spec: ModelSpec) -> tuple[int, ...]:
        """The shape of ``published()``: (d + 1,), or (K, d + 1) for a classifier of K classes (softmax); an ensemble
        adds its members first."""
        return (spec.n_classes, spec.dim + 1) if spec.n_classes else (spec.dim + 1,)

    @classmethod
    def published_ensemble(cls, spec: ModelSpec) -> str | None:
        """How predictions combine the members when ``published()`` holds several models (``published_shape``'s
        first axis): "mean_output"; None for one model."""
        return None

    @classmethod
    def predict_published(cls, spec: ModelSpec, loss: Any, published: np.ndarray,
                          X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, outputs) of the raw features X from the published parameters: the outputs are what the API
        calls scores (logistic: the class-1 probability; softmax: the n x K class probabilities; otherwise the
        value).  InputError (out-of-bounds-input) when the scores are not finite numbers.  X is a 2-D array, or a
        scipy CSR array of the same shape (a hashed model's rows: the service scores their tokens alone); a family
        that overrides this reads X through products only (tests/test_sparse_scoring.py)."""
        with np.errstate(over="ignore", invalid="ignore"):
            scores = loss.linear_scores(published, X)
            out = loss.score_output(scores) if np.all(np.isfinite(scores)) else scores
        if not np.all(np.isfinite(out)):
            raise InputError("Feature values too large to score.", code="out-of-bounds-input")
        return (np.argmax(out, axis=1).astype(np.float64) if out.ndim == 2 else loss.predict(scores)), out

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predictions, scores) from the published parameters only."""
        return self.predict_published(self.spec, self.loss, self.published(), np.asarray(X, dtype=np.float64))


def ogd_learn_work(spec: ModelSpec, batch: int) -> float:
    """The work of learning ``batch`` examples by projected OGD through ``retrain.ogd_run`` (OGDIterate): the
    compiled exact loop for the scalar losses, a Python-level step each otherwise (softmax)."""
    from ..mechanism.fast import LOSS_CODES

    p = spec.n_params
    return wb.exact_ogd(batch, p) + 3.0 * wb.STEP if spec.loss in LOSS_CODES else wb.ogd_steps(batch, p)


def ogd_replay_work(spec: ModelSpec, n: int, chunk: int) -> float:
    """Reading n kept records in chunks of ``chunk`` and replaying OGD over them (``retrain.ogd_recompute``: one
    ``ogd_run`` per chunk, as ``ogd_learn_work`` counts a learn)."""
    chunks = math.ceil(max(n, 1) / max(chunk, 1))
    return wb.read(n, spec.n_params, chunk) + ogd_learn_work(spec, n) + (chunks - 1) * 3.0 * wb.STEP


def checked_forget_steps(steps: Sequence[int], t: int) -> list[int]:
    """A forget request's steps as ints, refused (ForgetError) when one is named twice or was never learned (outside
    1..t): the check every family that forgets by step starts with."""
    steps = [int(s) for s in steps]
    if len(set(steps)) != len(steps):
        raise ForgetError("a step is named twice in one forget request")
    for u in steps:
        if not 1 <= u <= t:
            raise ForgetError(f"step {u} was never learned by this model")
    return steps


def validate_examples(spec: ModelSpec, loss: Any, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """Reject inputs that would void the Lipschitz constant before they touch the state."""
    try:
        X = np.asarray(X, dtype=np.float64)
    except ValueError:  # ragged rows (feature vectors of different lengths)
        raise InputError(f"features must have dimension {spec.dim}", code="invalid-dimension") from None
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != spec.dim:
        raise InputError(f"features must have dimension {spec.dim}", code="invalid-dimension")
    if y.shape != (X.shape[0],):
        raise InputError("one label per example is required", code="invalid-dimension")
    bad = ~np.isfinite(X).all(axis=1) | ~np.isfinite(y)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"example {i} has a non-finite feature or label", index=i)
    norms = np.linalg.norm(X, axis=1)
    over = norms > spec.x_norm * (1.0 + BOUND_TOLERANCE)
    if over.any():
        i = int(np.flatnonzero(over)[0])
        raise InputError(f"example {i} has feature norm {norms[i]:.6g} above the declared bound x_norm={spec.x_norm}", index=i)
    return X, loss.normalize_labels(y)
