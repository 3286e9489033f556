"""Every family's work estimate holds against the CPU time it measures (issue 29, item 1).

The service refuses at creation a spec one request of which would exceed its work budget, from the family's
estimate alone (``Unlearner.cost``, app/unlearning/maths/work_budget.py: one work unit ~ one ns of one core).  The
issue found ``online_dp_tree``'s estimate 50-100x short at a large dimension (its node draws beyond the compiled
sampler's range).  Here every family is created at a budget's edge at a large dimension, with the largest learn
batch the service accepts (``max_learn_batch`` or the service's batch limit), and the engine's CPU time
(``time.process_time``, BLAS on one thread as the calibration assumes) of that learn, of a forget of one record and
of an exact retrain is compared with the estimate for that spec: the ratio measured / estimated must stay below 2.
The estimate converts through the calibration constant (1 unit = 1 ns), so the check is a ratio, not a latency.

Not measured here: reading the retained records from the store (an in-memory store stands in; the estimate counts
each read as ``READ`` units on top) and the service's per-request costs that do not depend on the spec.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import pytest

from app.registry import build_spec, loss_for
from app.unlearning import ArrayRetained, engine_class, validate_examples
from app.unlearning.maths.work_budget import Budget
from app.unlearning.mechanism import fast_dgauss

threadpoolctl = pytest.importorskip("threadpoolctl")

LIMIT = 2.0
WORK = 5e7  # a budget 60x below the default: specs at its edge run in a fraction of a second each
BASE = {"loss": "logistic", "dim": 5000, "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
        "privacy": {"epsilon": 1.0, "delta": 1e-6}}
# (family, hyperparameters, overrides, budget): large dimensions, every family and its main variants
CASES = {
    "passive_olu": ("passive_olu", {}, {}, WORK),
    "passive_olu_restart": ("passive_olu_restart", {"max_deletions": 3, "horizon": 1000}, {}, WORK),
    "discard_and_restart": ("discard_and_restart", {}, {}, WORK),
    "active_olu_two_phase": ("active_olu", {"variant": "two_phase"}, {"dim": 1000}, WORK),
    "memory_pair": ("memory_pair", {"capacity": 3}, {}, WORK),
    "retrain": ("retrain", {}, {}, WORK),
    "sisa": ("sisa", {}, {}, WORK),
    "second_order_olu": ("second_order_olu", {}, {"dim": 300}, WORK),
    "descent_to_delete_secret": ("descent_to_delete", {"variant": "secret"}, {"dim": 1000}, WORK),
    "rewind_to_delete": ("rewind_to_delete", {"initial_size": 3, "T": 20}, {"dim": 1000}, WORK),
    # exact_ridge (issue 30): the d^2 sums in BLAS row blocks per learn, the (d+1)^3 solve of its published weights;
    # by default the client resends a forgotten record, with deletion_features retained it keeps them and retrains
    "exact_ridge": ("exact_ridge", {}, {"loss": "squared", "dim": 300}, WORK),
    "exact_ridge_retained": ("exact_ridge", {"deletion_features": "retained"}, {"loss": "squared", "dim": 300}, WORK),
    "online_dp_tree_kernel": ("online_dp_tree", {"horizon": 10**6, "max_deletions": 10}, {"dim": 20000}, WORK),
    # the issue's case: node noise beyond the compiled sampler (sigma'/g ~ 1e10), ~50 us a coordinate
    "online_dp_tree_pure": ("online_dp_tree", {"horizon": 10**6, "max_deletions": 10},
                            {"dim": 2000, "bounds": {"x_norm": 9.2516, "y_abs": 1.0}, "l2": 0.0,
                             "privacy": {"epsilon": 0.01, "delta": 1e-6}}, 5e8),
}
RATIOS: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def kernels_and_report():
    fast_dgauss.warm_up()  # the service's steady state: the compiled sampler loaded (the estimate assumes it)
    yield
    if RATIOS:
        worst = max(RATIOS, key=RATIOS.get)
        print("\nmeasured / estimated work: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(RATIOS.items()))
              + f"; worst {worst} {RATIOS[worst]:.2f}")


def _data(spec, n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, spec.dim))
    X *= 0.9 * spec.x_norm / np.linalg.norm(X, axis=1, keepdims=True)
    return validate_examples(spec, loss_for(spec), X, (np.arange(n) % 2).astype(float))


def _cpu(fn) -> float:
    with threadpoolctl.threadpool_limits(1):
        t = time.process_time()
        fn()
        return (time.process_time() - t) * 1e9  # ns = work units (the calibration constant: 1 unit ~ 1 ns)


def _check(name: str, what: str, eng, run, estimated: float):
    """Run ``run(copy)`` on a copy of the engine; on a measurement above the estimate, again on fresh copies (at
    most 3 in all, 6 for a request estimated under 10 ms, where a scheduler tick weighs; the least kept: another
    process's burst on this shared machine is not the family's work).  Returns the engine the first run changed."""
    first = copy.deepcopy(eng)
    measured = _cpu(lambda: run(first))
    for _ in range(2 if estimated > 1e7 else 5):
        if measured <= estimated:
            break
        again = copy.deepcopy(eng)
        measured = min(measured, _cpu(lambda: run(again)))
    ratio = measured / estimated
    RATIOS[f"{name} {what}"] = ratio
    assert ratio <= LIMIT, f"{name}: one {what} took {measured / 1e9:.3g} s of CPU, {ratio:.2f}x its estimate"
    return first


@pytest.mark.parametrize("name", sorted(CASES))
def test_measured_work_is_within_twice_the_estimate(name):
    algorithm, hp, overrides, work = CASES[name]
    budget = Budget(work=work, memory=256 << 20, batch=10_000, max_records=100_000)
    payload = {**BASE, **overrides, "algorithm": algorithm, "hyperparameters": dict(hp)}
    spec = build_spec(payload, max_dim=100_000, budget=budget)
    cls = engine_class(algorithm)
    h = spec.hyperparameters
    batch = int(h.get("max_learn_batch") or budget.batch)
    if h.get("max_records"):
        batch = min(batch, int(h["max_records"]))
    batch = min(batch, max(1, int(4e7 // (8 * spec.dim))))  # at most 40 MB of examples
    X, y = _data(spec, batch, 0)
    retained = ArrayRetained(np.zeros(0, dtype=np.int64), np.zeros((0, spec.dim)), np.zeros(0))
    learned = {}

    def learn(e):
        learned["steps"] = e.learn(X, y, retained if e.needs_retained_data else None)

    eng = _check(name, f"learn of {batch}", cls(spec), learn, cls.estimate(spec, batch).learn)
    steps = learned["steps"]
    store = ArrayRetained(steps, X, y)
    held = spec.with_hyperparameters({**h, "max_records": batch}) if h.get("max_records") else spec
    cost = cls.estimate(held, batch)  # the forget and the retrain with the records this engine holds
    data = eng.needs_retained_data or eng.needs_deletion_features
    _check(name, "forget of 1", eng, lambda e: e.forget([int(steps[-1])], store if data else None), cost.forget)
    if eng.supports_retrain and cost.retrain > 0:
        _check(name, "retrain", eng, lambda e: e.retrain(store), cost.retrain)
