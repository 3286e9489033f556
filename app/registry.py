"""ModelRegistry: spec -> engine instance; engine state <-> stored blob; per-process cache by version.

The only place that maps the stored model onto the engine.  It never branches on algorithm names: the
engine class named by the spec supplies its own hyperparameter defaults, constants and accounting.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import re
import sys
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from . import state_store
from .state_store import LogInfo
from .privacy import rho_from_epsilon_delta
from .privacy.ledger import BudgetExhausted, LedgerState
from .privacy.modes import accounting_from_params
from .unlearning import ModelSpec, SpecError, Unlearner, engine_class, warm_kernels
from .unlearning.maths.losses import MAX_CLASSES, make_loss
from .unlearning.maths.work_budget import Budget
from .admission import check_budget, request_budget  # noqa: F401  (request_budget: re-exported)
from .unlearning.mechanism.calibration import ALL_FIELDS, N_MAX, require_finite_array

CONVERSION = "cks20"


@functools.lru_cache(maxsize=4096)
def _rho(epsilon: float, delta: float) -> float:
    """The zCDP budget of the (epsilon, delta) target (app.privacy, CKS20); cached: the field search re-asks it."""
    return rho_from_epsilon_delta(epsilon, delta, conversion=CONVERSION)


def _spec_of(payload: dict[str, Any], *, max_dim: int, budget: Budget | None = None) -> ModelSpec:
    """Validate a ModelCreate payload into an engine spec (every default filled in), calibration included, and,
    given a budget, the work and memory of one request (``check_budget``)."""
    if payload["dim"] > max_dim:
        raise SpecError(f"dim must be at most {max_dim}", fields=("dim",))
    cls = engine_class(payload["algorithm"])
    n_classes, classes = _classes_of(payload, cls, max_dim=max_dim)
    privacy = payload["privacy"]
    try:
        rho = _rho(float(privacy["epsilon"]), float(privacy["delta"]))
    except (ArithmeticError, ValueError) as e:
        raise SpecError(f"the zCDP budget of (epsilon, delta) cannot be computed ({e})",
                        fields=("privacy.epsilon", "privacy.delta")) from None
    spec = ModelSpec(
        algorithm=payload["algorithm"], loss=payload["loss"], dim=int(payload["dim"]),
        x_norm=float(payload["bounds"]["x_norm"]), y_abs=float(payload["bounds"]["y_abs"]),
        domain_radius=float(payload["domain_radius"]), l2=float(payload["l2"]),
        epsilon=float(privacy["epsilon"]), delta=float(privacy["delta"]), rho=rho,
        hyperparameters=dict(payload.get("hyperparameters") or {}), n_classes=n_classes, classes=classes,
        features=payload.get("features"),  # normalised by the service (app.features.normalize_spec)
    )
    try:
        spec = spec.with_hyperparameters(cls.normalize_hyperparameters(spec))
    except SpecError:
        raise
    except (ArithmeticError, ValueError) as e:  # a default derived from the bounds overflowed
        raise SpecError(f"the hyperparameter defaults cannot be derived from these bounds ({type(e).__name__})",
                        fields=("bounds.x_norm", "domain_radius", "l2", "bounds.y_abs")) from None
    try:
        cls.check_calibration(spec)  # the worst case of every calibration the model can need (calibration.py)
        _check_ledger(cls(spec))
    except SpecError:
        raise
    except (ArithmeticError, ValueError) as e:  # a family check that failed outside its Checks: still a refusal
        raise SpecError(f"{spec.algorithm}: the calibration cannot be computed ({type(e).__name__}: {e})",
                        fields=ALL_FIELDS) from None
    return spec if budget is None else check_budget(cls, spec, budget)


def _classes_of(payload: dict[str, Any], cls: type[Unlearner], *, max_dim: int) -> tuple[int, tuple[str, ...] | None]:
    """(n_classes, class names or None) of a classifier (softmax needs them; another loss takes them where the family
    classifies with it, ``classifier_losses``): K from ``n_classes`` and/or ``classes`` (they must agree),
    2 <= K <= MAX_CLASSES, K (dim + 1) parameters at most max_dim + 1; (0, None) otherwise."""
    n, names = payload.get("n_classes"), payload.get("classes")
    if payload["loss"] != "softmax":
        if n is None and names is None:
            return 0, None
        if payload["loss"] not in cls.classifier_losses:  # exact_ridge: least squares
            field = "n_classes" if n is not None else "classes"
            raise SpecError(f"{field} applies to loss softmax (or a classifier family's loss)", fields=(field,))
    if names is not None:
        names = tuple(names)
        if len(set(names)) != len(names):
            raise SpecError("classes must be distinct names", fields=("classes",))
        if n is not None and n != len(names):
            raise SpecError(f"n_classes = {n} but {len(names)} class names are declared", fields=("n_classes",))
        n = len(names)
    if n is None:
        raise SpecError("loss softmax needs n_classes (or the class names in classes)", fields=("n_classes",))
    if not 2 <= n <= MAX_CLASSES:
        raise SpecError(f"n_classes must be in [2, {MAX_CLASSES}]", fields=("n_classes",))
    if n * (payload["dim"] + 1) > max_dim + 1:
        raise SpecError(f"a classifier has n_classes * (dim + 1) parameters, at most {max_dim + 1}",
                        fields=("n_classes", "dim"))
    return int(n), names


def _check_ledger(engine) -> None:
    """The service's own ledger (app.privacy.ledger) re-derives every charge from the (epsilon, delta) -> rho
    conversion: its allowance for the first and the last deletion it can certify (the capacity, or N_MAX for
    the omega series) must be a finite, positive float, else that deletion would be refused as a mismatch."""
    params = engine.accounting_params()
    if params is None:
        return
    eps = ("privacy.epsilon", "privacy.delta")
    i = 1
    try:
        policy = accounting_from_params(params)
        last = policy.capacity_total or N_MAX
        for i in sorted({1, last}):
            charge = policy.next_charge(LedgerState(rho_spent=0.0, charges=i - 1))
            if charge.rho is not None and not (0.0 < charge.rho < math.inf):
                raise ValueError(f"allowance {charge.rho!r}")
    except (BudgetExhausted, ArithmeticError, ValueError) as e:
        raise SpecError(f"{engine.algorithm}: the privacy ledger cannot charge deletion i = {i} "
                        f"({type(e).__name__}: {e})", fields=eps) from None


def build_spec(payload: dict[str, Any], *, max_dim: int, budget: Budget | None = None) -> ModelSpec:
    """Validate a ModelCreate payload into an engine spec with every default filled in.

    A refusal is a ``SpecError`` whose ``fields`` names the field to change (its API path) and whose
    ``accepted`` gives that field's accepted range with every other field as given, found by evaluating the
    family's own checks (``accepted_range``), or None when no single field's value makes the spec valid.
    """
    try:
        return _spec_of(payload, max_dim=max_dim, budget=budget)
    except SpecError as e:
        if not getattr(e, "located", False):  # the budget check names its field and range itself
            e.field, e.accepted = locate(payload, e, max_dim=max_dim)
        raise


# ---- which field, and what range of it, the family accepts ------------------------------------------------
_F64_MIN = sys.float_info.min  # smallest positive normal float: the schema's lower bound of positive numbers
# the schema's own ranges (app/schemas/models.py); the family's checks decide within them
SCHEMA_RANGES = {"bounds.x_norm": (_F64_MIN, sys.float_info.max), "bounds.y_abs": (_F64_MIN, sys.float_info.max),
                 "domain_radius": (_F64_MIN, sys.float_info.max), "l2": (_F64_MIN, sys.float_info.max),
                 "privacy.epsilon": (_F64_MIN, sys.float_info.max), "privacy.delta": (1e-300, math.nextafter(1.0, 0.0))}
_GRID_STEP = 16  # decades between the probes of the coarse scan; the edges are then bisected
_BISECT = 12     # bisection steps per edge (in log10 space: 16 / 2^12 decades, about 1%)


def _get(payload: dict[str, Any], path: str) -> Any:
    node: Any = payload
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _with(payload: dict[str, Any], path: str, value: float) -> dict[str, Any]:
    out = copy.deepcopy(payload)
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def suspects(payload: dict[str, Any], err: SpecError) -> list[str]:
    """The fields a refusal is about: the engine's own list, else the field and hyperparameter names its message
    mentions, in the order they appear ("omega must be a number > 1" -> hyperparameters.omega)."""
    if err.fields:
        return list(err.fields)
    names = {p.rsplit(".", 1)[-1]: p for p in SCHEMA_RANGES}
    names["rho"] = "privacy.epsilon"  # the zCDP budget is the (epsilon, delta) target's conversion
    names.update({k: f"hyperparameters.{k}" for k in (payload.get("hyperparameters") or {})})
    # "<key> is required ..." / "<key> must ...": a hyperparameter the client may not have sent at all
    m = re.match(r"([a-z_][a-z0-9_]*) (?:is required|must)", str(err))
    if m and m.group(1) not in names:
        names[m.group(1)] = f"hyperparameters.{m.group(1)}"
    found = []
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", str(err)):
        path = names.get(m.group(0))
        if path is not None and path not in found:
            found.append(path)
    return found


def _candidates(payload: dict[str, Any], err: SpecError) -> list[str]:
    """Numeric fields to try: the suspects only when there are any, else every numeric field the client gave."""
    named = suspects(payload, err)
    if named:
        return named
    hp = [f"hyperparameters.{k}" for k, v in (payload.get("hyperparameters") or {}).items() if isinstance(v, float)]
    return list(SCHEMA_RANGES) + hp


_SEARCH_BUDGET = 200  # spec evaluations one refusal may spend on locating the field (bounded work per request)


class _Budget:
    def __init__(self, n: int):
        self.left = n

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TimeoutError


def accepted_range(payload: dict[str, Any], path: str, *, max_dim: int,
                   budget: _Budget | None = None) -> tuple[float, float] | None:
    """The interval of values of ``path`` (every other field as given) that the family accepts, around the
    closest accepted probe to the given value; None if no probe is accepted.  Probes are powers of ten 16 decades
    apart within the schema's range, then each edge is bisected in log space: the ends returned are accepted."""
    lo_s, hi_s = SCHEMA_RANGES.get(path, (_F64_MIN, sys.float_info.max))

    budget = budget or _Budget(_SEARCH_BUDGET)

    def ok(v: float) -> bool:
        budget.spend()
        try:
            _spec_of(_with(payload, path, v), max_dim=max_dim)
            return True
        except SpecError:
            return False

    exps = [e for e in range(-307, 309, _GRID_STEP) if lo_s <= 10.0**e <= hi_s] + [0]
    probes = sorted({10.0**e for e in exps} | {lo_s, hi_s})
    good = [ok(v) for v in probes]
    if not any(good):
        return None
    given = _get(payload, path)
    target = math.log10(given) if isinstance(given, (int, float)) and given > 0 else 0.0
    best = min((i for i, g in enumerate(good) if g), key=lambda i: abs(math.log10(probes[i]) - target))
    lo_i = hi_i = best
    while lo_i > 0 and good[lo_i - 1]:
        lo_i -= 1
    while hi_i < len(probes) - 1 and good[hi_i + 1]:
        hi_i += 1

    def edge(inside: float, outside: float) -> float:
        a, b = math.log10(inside), math.log10(outside)
        for _ in range(_BISECT):
            mid = 0.5 * (a + b)
            if ok(10.0**mid):
                a = mid
            else:
                b = mid
        return 10.0**a if a != math.log10(inside) else inside

    lo = probes[lo_i] if lo_i == 0 else edge(probes[lo_i], probes[lo_i - 1])
    hi = probes[hi_i] if hi_i == len(probes) - 1 else edge(probes[hi_i], probes[hi_i + 1])
    return lo, hi


def locate(payload: dict[str, Any], err: SpecError, *, max_dim: int) -> tuple[str | None, tuple[float, float] | None]:
    """(field, accepted range) for a refused spec: the first candidate field some value of which is accepted
    with every other field as given; else the engine's first suspect with no range."""
    budget = _Budget(_SEARCH_BUDGET)
    for path in _candidates(payload, err):
        if not isinstance(_get(payload, path), (int, float)):
            continue
        try:
            found = accepted_range(payload, path, max_dim=max_dim, budget=budget)
        except TimeoutError:
            break
        if found is not None:
            return path, found
    named = suspects(payload, err)
    return (named[0] if named else None), None


def spec_to_json(spec: ModelSpec) -> str:
    out = {**spec.__dict__, "hyperparameters": dict(spec.hyperparameters)}
    if not spec.n_classes:  # the stored text of models that are no classifiers is unchanged
        out.pop("n_classes")
        out.pop("classes")
    elif spec.classes is not None:
        out["classes"] = list(spec.classes)
    return json.dumps(out, sort_keys=True)


def spec_from_json(text: str) -> ModelSpec:
    d = json.loads(text)
    if d.get("classes") is not None:
        d["classes"] = tuple(d["classes"])
    return ModelSpec(**d)


def loss_for(spec: ModelSpec):
    """The declared loss with its public constants: what validation and predictions use (no engine state)."""
    return make_loss(spec.loss, spec.x_norm, spec.y_abs, spec.domain_radius, spec.l2, spec.hyperparameters,
                     spec.n_classes)


def published_bytes(theta: np.ndarray) -> bytes:
    """The published parameters as stored; a non-finite value is refused (NumericError), never stored as null."""
    require_finite_array(theta, "the published parameters")
    return np.ascontiguousarray(theta, dtype="<f8").tobytes()


def published_array(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f8")


class ModelRegistry:
    """Builds engines and caches them per process, keyed by model id and state version; says what a write stores
    of an engine's state and rebuilds a version from the stored base and deltas (app/state_store.py)."""

    def __init__(self, capacity: int = 256, cipher=None, state_log: bool = True):
        self.cipher = cipher  # app.crypto.Cipher: state blobs are sealed at rest (AES-GCM, AAD = model id)
        self.state_log = state_log  # False: every write stores the whole state (Settings.state_log)
        self._cache: OrderedDict[str, tuple[int, Unlearner]] = OrderedDict()
        self._lock = threading.Lock()
        self.capacity = capacity
        # per engine, the stored state it was read at (or, once its write is planned, the one that write leaves)
        self._stored: weakref.WeakKeyDictionary[Unlearner, LogInfo] = weakref.WeakKeyDictionary()
        self._planned: weakref.WeakKeyDictionary[Unlearner, LogInfo] = weakref.WeakKeyDictionary()
        warm_kernels()  # off the request path: requests take the numpy path until they load (kernels_status)

    @staticmethod
    def new_engine(spec: ModelSpec) -> Unlearner:
        return engine_class(spec.algorithm)(spec)

    def checkout(self, model_id: str, version: int, spec_json: str, load) -> Unlearner:
        """An engine at ``version`` for exclusive use by one write (taken out of the cache).

        ``load()`` reads the stored state (app/db/state_log.py ``Stored``) only when the cached copy is missing or
        stale; the engine is then rebuilt from the base and the deltas after it (``state_store.rebuild``).
        """
        with self._lock:
            cached = self._cache.pop(model_id, None)
        if cached is not None and cached[0] == version:
            return cached[1]
        engine, info = state_store.rebuild(spec_from_json(spec_json), model_id, load(), self.cipher)
        self._stored[engine] = info
        return engine

    def checkin(self, model_id: str, version: int, engine: Unlearner) -> None:
        """Return an engine after its transaction committed at ``version``."""
        info = self._planned.pop(engine, None)
        if info is not None:
            self._stored[engine] = info
        with self._lock:
            self._cache[model_id] = (version, engine)
            self._cache.move_to_end(model_id)
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)

    def evict(self, model_id: str) -> None:
        with self._lock:
            self._cache.pop(model_id, None)

    def plan_write(self, engine: Unlearner, model_id: str, version: int,
                   learned: tuple[Any, Any] | None = None) -> state_store.StateWrite:
        """What to store of ``engine``'s state at ``version`` (a base, or a delta after a learn of ``learned``);
        takes effect for this engine's next write once ``checkin`` says the transaction committed."""
        write = state_store.plan(engine, model_id, version, self._stored.get(engine), self.cipher,
                                 learned if self.state_log else None)
        self._planned[engine] = write.info
        return write

    def stored_of(self, engine: Unlearner) -> LogInfo | None:
        """The stored state ``engine`` was read at (None when unknown)."""
        return self._stored.get(engine)

    def logs_examples(self, engine: Unlearner) -> bool:
        """Whether this model's stored state may have logged learned examples (state_store.logs_examples)."""
        return state_store.logs_examples(engine, self._stored.get(engine))

    def dump(self, engine: Unlearner, model_id: str | None = None) -> bytes:
        """The engine state as a base blob to store: sealed with the cipher, bound to ``model_id``."""
        if self.cipher is not None and model_id is None:
            raise TypeError("dump() needs the model id to seal the state (it is the AES-GCM AAD)")
        write = state_store.base_write(engine, model_id or "", 0, self.cipher)
        self._planned[engine] = write.info
        return bytes(write.payload)
