"""Work estimates against measured CPU (issue 36 item 3): ``python -m bench.performance.work_calibration``.

Every family (and its main variants, ``CASES``) is created at the edge of three work budgets (``SIZES``: the
budget and the share of the case's dimension), with the service's defaults for what the budget derives (the
retained-record cap ``max_records``, ``max_learn_batch``).  For each, the CPU time (``time.process_time``, BLAS on
one thread, the compiled kernels loaded: what the calibration assumes) of

* **learn**: one learn request of the largest batch the service accepts (at most 40 MB of examples);
* **forget**: one forget of one record, the model holding the records it learned (a family that keeps data reads
  them from the service's own store: ``ShortReadRetained`` over a SQLite database holding them sealed, so the read
  cost is measured, not assumed; client-features families get the record as the service hands it over);
* **retrain**: one exact retrain (families that can), from the same store;
* **predict**: predicting the learn batch's rows from the published parameters (``predict_published``)

(learn, forget and retrain followed by ``published()``, as the service publishes after each) is set against the
family's estimate for that spec (``Unlearner.estimate`` with ``max_records`` = the records held; ``predict_cost``),
one unit being about one ns of one core.  Each figure is the least of a few runs on fresh copies (another process's
burst on a shared machine is not the family's work).  Target (issue 36): every ratio measured / estimated within
[0.3, 1].  Where the estimate is a worst case benign data do not reach, the case forces it (``FORCED``: a forget
whose GD runs all max_gd_steps, the CG that runs to its cap then the dense solve, the eigendecomposition that serves
where Cholesky fails) and the row's detail says so.  ``tests/test_work_estimates.py`` runs the small sizes in CI
and prints the table; ``--json`` keeps the rows of a full run.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

import numpy as np

from app.registry import build_spec, loss_for
from app.unlearning import ArrayRetained, SpecError, engine_class, validate_examples
from app.unlearning.maths.work_budget import Budget

BASE = {"loss": "logistic", "dim": 5000, "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
        "privacy": {"epsilon": 1.0, "delta": 1e-6}}
# (family, hyperparameters, overrides): large dimensions, every family and its main variants
CASES = {
    "passive_olu": ("passive_olu", {}, {}),
    "passive_olu_restart": ("passive_olu_restart", {"max_deletions": 3, "horizon": 1000}, {}),
    "discard_and_restart": ("discard_and_restart", {}, {}),
    # max_gd_steps 8: the cap binds from the 10th record on (planned_gd_steps(1, tau) >= 10), so the forget runs every
    # GD pass its estimate counts (the default 2000 counts 642 where a first deletion plans 28: FORCED)
    "active_olu_two_phase": ("active_olu", {"variant": "two_phase", "max_gd_steps": 8}, {"dim": 1000}),
    "memory_pair": ("memory_pair", {"capacity": 3}, {}),
    "retrain": ("retrain", {}, {"dim": 200}),
    "sisa": ("sisa", {}, {"dim": 200}),
    "second_order_olu": ("second_order_olu", {}, {"dim": 300}),
    "descent_to_delete_secret": ("descent_to_delete", {"variant": "secret"}, {"dim": 1000}),
    "rewind_to_delete": ("rewind_to_delete", {"T": 20}, {"dim": 1000}),  # initial_size: its default, 256
    "exact_ridge": ("exact_ridge", {}, {"loss": "squared", "dim": 300}),
    "exact_ridge_retained": ("exact_ridge", {"deletion_features": "retained"}, {"loss": "squared", "dim": 300}),
    "online_dp_tree_kernel": ("online_dp_tree", {"horizon": 10**6, "max_deletions": 10}, {"dim": 20000}),
    # node noise beyond the compiled sampler (sigma'/g ~ 1e10), ~50 us a coordinate
    "online_dp_tree_pure": ("online_dp_tree", {"horizon": 10**6, "max_deletions": 10},
                            {"dim": 2000, "bounds": {"x_norm": 9.2516, "y_abs": 1.0}, "l2": 0.0,
                             "privacy": {"epsilon": 0.01, "delta": 1e-6}}),
}
# (work budget, share of the case's dimension): the three sizes of a run
SIZES = ((2e8, 0.25), (8e8, 0.5), (3e9, 1.0))
QUICK_SIZES = ((5e6, 0.25), (2e7, 0.5), (8e7, 1.0))
PURE_SCALE = 10.0  # online_dp_tree_pure's draws are slow: its budgets are this much larger
TARGET = (0.3, 1.0)
MAX_EXAMPLE_BYTES = 40e6  # one learn request's examples
HOLD_SECONDS = 20.0  # at most this long learning the records a model holds before its measured requests
PREDICT_ROWS = 1000
EARLY_STOP = 0.6  # a run at most this share of its estimate ends a measurement's tries


def _cg_to_cap(hvp, b, tol, max_iter):
    """second_order_numerics.cg run to its cap, then reported unconverged: the forget's worst case (every CG product
    its estimate counts, then the dense fallback: forming H and its solves)."""
    x, r = np.zeros_like(b), b.copy()
    d, rr = r.copy(), float(r @ r)
    for _ in range(max_iter):
        Hd = hvp(d)
        den = float(d @ Hd)
        a = rr / den if den > 0 else 0.0
        x += a * d
        r -= a * Hd
        rr_new = float(r @ r)
        d = r + (rr_new / rr if rr > 0 else 0.0) * d
        rr = rr_new
    hvp(x)  # cg's closing residual check
    return x, float("inf")


@contextlib.contextmanager
def _force_cg_to_cap():
    from app.unlearning.families import second_order

    with mock.patch.object(second_order, "cg", _cg_to_cap):
        yield


@contextlib.contextmanager
def _force_eigh():
    import scipy.linalg

    with mock.patch.object(scipy.linalg, "cho_factor", side_effect=np.linalg.LinAlgError("forced")):
        yield


# Worst cases the estimate counts but a request on benign data does not reach, forced here (issue 36 item 3);
# the rows' detail says so.  (active_olu: its max_gd_steps in CASES.)
FORCED = {
    "active_olu_two_phase": ("max_gd_steps binds", contextlib.nullcontext),
    "second_order_olu": ("CG to its cap, then the dense solve", _force_cg_to_cap),  # p > 201: the CG sizes
    "exact_ridge": ("Cholesky fails: eigendecomposition", _force_eigh),
    "exact_ridge_retained": ("Cholesky fails: eigendecomposition", _force_eigh),
}


@dataclass
class Row:
    case: str
    size: int
    op: str
    measured: float  # ns of CPU
    estimated: float  # work units
    detail: str = ""

    @property
    def ratio(self) -> float:
        return self.measured / self.estimated if self.estimated > 0 else float("inf")


def _cpu(fn) -> float:
    import threadpoolctl

    with threadpoolctl.threadpool_limits(1):
        t = time.process_time()
        fn()
        return (time.process_time() - t) * 1e9


def _least(eng, run, estimated: float, tries: int) -> float:
    """The least CPU time of ``run(copy)`` over up to ``tries`` fresh copies of the engine (twice as many for a
    request estimated under 10 ms, where a scheduler tick or a cold cache weighs), stopping early only once a run is
    well within the estimate (EARLY_STOP of it): stopping at the first run within it reported the first run of a
    loaded machine, not the least, for ratios near 1."""
    best = float("inf")
    for _ in range(tries if estimated > 1e7 else 2 * tries):
        e = copy.deepcopy(eng)
        best = min(best, _cpu(lambda: run(e)))
        if best <= EARLY_STOP * estimated:
            break
    return best


def _data(spec, n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, spec.dim))
    X *= 0.9 * spec.x_norm / np.linalg.norm(X, axis=1, keepdims=True)
    y = (np.arange(n) % max(2, spec.n_classes or 2)).astype(float)
    return validate_examples(spec, loss_for(spec), X, y)


class Store:
    """The service's retained store on a throwaway SQLite database (app/db/retained.py), one model id per case."""

    def __init__(self, root: Path):
        from app.crypto import Cipher
        from app.db.session import Database
        from app.db.tables import Base, Model, Tenant

        self.db = Database(f"sqlite:///{root / 'calibration.db'}", sqlite_synchronous="OFF")
        Base.metadata.create_all(self.db.engine)
        self.cipher = Cipher(bytes(range(32)))
        self._Model = Model
        now = datetime.now(timezone.utc)
        with self.db.write() as s:
            s.add(Tenant(id="t", name="t", record_key=b"k", created_at=now))
        self.n = 0

    def new(self, engine) -> str:
        self.n += 1
        mid = f"m{self.n}"
        now = datetime.now(timezone.utc)
        with self.db.write() as s:
            s.add(self._Model(id=mid, tenant_id="t", name=mid, algorithm=engine.algorithm, spec_json="{}",
                              status="ready", created_at=now, updated_at=now))
        return mid

    def add(self, mid: str, engine, steps, X, y) -> None:
        from app.db.retained import SqlRetained

        with self.db.write() as s:
            SqlRetained(s, mid, engine.spec.dim, self.cipher, groups=engine.retained_groups).add(steps, X, y)

    def reader(self, mid: str, engine):
        from app.db.retained import ShortReadRetained

        return ShortReadRetained(self.db, mid, engine.spec.dim, self.cipher, groups=engine.retained_groups)


def measure_case(name: str, size: int, sizes, store: Store, tries: int = 3) -> list[Row]:
    """The rows of one case at one size; a FORCED case's worst case forced throughout."""
    with FORCED.get(name, ("", contextlib.nullcontext))[1]():
        return _measure_case(name, size, sizes, store, tries)


def _measure_case(name: str, size: int, sizes, store: Store, tries: int) -> list[Row]:
    algorithm, hp, overrides = CASES[name]
    work, share = sizes[size]
    if name.endswith("_pure"):
        work *= PURE_SCALE
    payload = {**BASE, **overrides, "algorithm": algorithm, "hyperparameters": dict(hp)}
    payload["dim"] = max(2, int(round(payload["dim"] * share)))
    for _ in range(6):  # a size too small for the family's least request: the budget that takes it
        budget = Budget(work=work, memory=1 << 30, batch=10_000, max_records=10_000_000)
        try:
            spec = build_spec(payload, max_dim=100_000, budget=budget)
            break
        except SpecError:
            work *= 4
    else:
        raise SpecError(f"{name}: no budget up to {work:.0e} admits size {size}")
    cls = engine_class(algorithm)
    h = spec.hyperparameters
    batch = int(h.get("max_learn_batch") or budget.batch)
    if h.get("max_records"):
        batch = min(batch, int(h["max_records"]))
    batch = max(1, min(batch, int(MAX_EXAMPLE_BYTES // (8 * spec.dim))))
    eng = cls(spec)
    forced = FORCED.get(name, ("",))[0]
    if name == "second_order_olu" and eng.use_direct():
        forced = ""  # the direct solve is the planned path (p <= 201): nothing to force
    forced = f", forced: {forced}" if forced else ""
    keeps = eng.needs_retained_data
    mid = store.new(eng) if keeps else None
    held_X: list = []
    held_y: list = []
    k = 0

    def more(n: int, timed: bool = False) -> Row | None:
        """Learn n more records (the next of the stream); timed: as the measured learn request."""
        nonlocal k
        Xk, yk = _data(spec, n, k)
        k += 1
        store_now = store.reader(mid, eng) if keeps else None
        row = None
        if timed:
            estimated = cls.estimate(spec, n).learn
            row = Row(name, size, "learn", _least(eng, lambda e: (e.learn(Xk, yk, store_now), e.published()),
                                                  estimated, tries), estimated,
                      f"batch {n}, d {spec.dim}, budget {work:.0e}, after {eng.step}{forced}")
        steps = eng.learn(Xk, yk, store_now)
        if keeps:
            store.add(mid, eng, steps, Xk, yk)
        held_X.append(Xk)
        held_y.append(yk)
        return row

    def hold() -> None:
        """Learn up to the record cap (or the model's capacity, or HOLD_SECONDS): the state a request's worst case
        is at (a full curvature memory, every record a replay reads)."""
        cap = int(h.get("max_records") or 10 * batch)
        started = time.perf_counter()
        while time.perf_counter() - started < HOLD_SECONDS:
            left = eng.learn_capacity()
            room = min(cap - (eng.records_held() or eng.step), batch if left is None else min(batch, left - batch))
            if room < batch:
                break
            more(batch)

    initial = int(h.get("initial_size") or 0)
    if initial:  # rewind: the worst learn is the one that reaches initial_size (its training), initial_size - 1 held
        if initial > 1:
            more(initial - 1)
        rows = [more(batch, timed=True)]
        hold()
    else:
        hold()
        rows = [more(batch, timed=True)]
    n = eng.records_held() if keeps else eng.step
    held = spec.with_hyperparameters({**h, "max_records": n}) if h.get("max_records") else spec
    cost = cls.estimate(held, batch)
    target = 1  # the first record: where a forget replays from the record on (sisa's shard), its worst case
    if keeps:
        def forget(e):
            e.forget([target], store.reader(mid, e))
            e.published()  # what one request does: the service publishes the new parameters
    elif eng.needs_deletion_features:
        one = ArrayRetained([target], held_X[0][:1], held_y[0][:1])

        def forget(e):
            e.forget([target], one)
            e.published()
    else:
        def forget(e):
            e.forget([target])
            e.published()
    rows.append(Row(name, size, "forget", _least(eng, forget, cost.forget, tries), cost.forget,
                    f"{n} held{forced}"))
    if eng.supports_retrain and cost.retrain > 0:
        rows.append(Row(name, size, "retrain", _least(eng, lambda e: (e.retrain(store.reader(mid, e)), e.published()),
                                                      cost.retrain, tries), cost.retrain, f"{n} held{forced}"))
    X = _data(spec, max(1, min(PREDICT_ROWS, int(MAX_EXAMPLE_BYTES // (8 * spec.dim)))), 99)[0]
    published = eng.published()
    loss = loss_for(spec)
    estimated = cls.predict_cost(spec, len(X))
    rows.append(Row(name, size, "predict", _least(eng, lambda e: cls.predict_published(spec, loss, published, X),
                                                  estimated, tries), estimated, f"{len(X)} rows"))
    return rows


def run(quick: bool = False, cases=None, log=print) -> list[Row]:
    from app.unlearning.mechanism import fast, fast_dgauss

    fast.warm_up()
    fast_dgauss.warm_up()
    sizes = QUICK_SIZES if quick else SIZES
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        try:
            for name in cases or CASES:
                for size in range(len(sizes)):
                    got = measure_case(name, size, sizes, store)
                    rows += got
                    for r in got:
                        log(f"{r.case:26s} {size} {r.op:8s} measured {r.measured / 1e6:10.3f} ms  estimated "
                            f"{r.estimated / 1e6:10.3f} ms  ratio {r.ratio:5.2f}  ({r.detail})")
        finally:
            store.db.dispose()
    return rows


def table(rows: list[Row], sizes) -> str:
    """Markdown: one line per case and operation, the ratio at each size (and the sizes' budgets)."""
    head = " | ".join(f"budget {w:.0e} ({int(s * 100)} % of d)" for w, s in sizes)
    out = [f"| family | operation | {head} |", "|---|---|" + "---|" * len(sizes)]
    seen: dict[tuple[str, str], dict[int, Row]] = {}
    for r in rows:
        seen.setdefault((r.case, r.op), {})[r.size] = r
    for (case, op), by in seen.items():
        cells = [f"{by[i].ratio:.2f} ({by[i].detail})" if i in by else "-" for i in range(len(sizes))]
        out.append(f"| {case} | {op} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:  # pragma: no cover - a measurement
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = run(args.quick, [c for c in args.cases.split(",") if c] or None)
    sizes = QUICK_SIZES if args.quick else SIZES
    print(table(rows, sizes))
    bad = [r for r in rows if not TARGET[0] <= r.ratio <= TARGET[1]]
    print(f"{len(rows) - len(bad)} of {len(rows)} ratios within {TARGET}; outside: "
          + ", ".join(f"{r.case} {r.size} {r.op} {r.ratio:.2f}" for r in bad))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
