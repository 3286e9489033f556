"""Every family's work estimate holds against the CPU time it measures (issue 29 item 1, issue 36 item 3).

The service refuses at creation a spec one request of which would exceed its work budget, from the family's
estimate alone (``Unlearner.cost``, app/unlearning/maths/work_budget.py: one work unit ~ one ns of one core).  Here
every family (and its main variants) is created at the edge of three small budgets (``QUICK_SIZES`` of
bench/performance/work_calibration.py: the budget and a share of a large dimension), learns the records the model
holds (briefly), and the CPU time (``time.process_time``, BLAS on one thread, the compiled kernels loaded) of a learn
of the largest batch, a forget of one record (the first: a replay from the record on is its worst case), an exact
retrain and a prediction of up to 1 000 rows is compared with the estimate.  Data-keeping families read the records
from the service's own store on SQLite, so the read cost is measured, not assumed.

The test prints the table and fails on an estimate short of the measured CPU by more than ``LIMIT`` (the least of a
few runs; a request that exceeds its estimate could exceed the budget the estimate admitted it under; the margin
covers a CI run measuring beside the rest of the suite on 2 cores).  The target of
issue 36 (every ratio measured / estimated within [0.3, 1]) is the benchmark's, at larger sizes on a quiet machine
(``python -m bench.performance.work_calibration``; docs/operations.md §8 lists the ratios; the worst cases that
benign data do not reach are forced there and here: ``FORCED`` in the bench).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench.performance import work_calibration as wc

pytest.importorskip("threadpoolctl")

LIMIT = 2.0
ROWS: list = []


@pytest.fixture(scope="module")
def store():
    from app.unlearning.mechanism import fast, fast_dgauss

    fast.warm_up()  # the service's steady state: the compiled kernels loaded (the estimates assume them)
    fast_dgauss.warm_up()
    with tempfile.TemporaryDirectory() as tmp:
        s = wc.Store(Path(tmp))
        yield s
        s.db.dispose()
    if ROWS:
        print("\nmeasured / estimated work (issue 36 target: within [0.3, 1]):\n" + wc.table(ROWS, wc.QUICK_SIZES))


@pytest.mark.parametrize("name", sorted(wc.CASES))
def test_measured_work_is_within_its_estimate(store, name, monkeypatch):
    monkeypatch.setattr(wc, "HOLD_SECONDS", 0.25)  # CI: hold what a quarter second of learning holds
    rows = [r for size in range(len(wc.QUICK_SIZES)) for r in wc.measure_case(name, size, wc.QUICK_SIZES, store,
                                                                                tries=3)]
    ROWS.extend(rows)
    short = [f"{r.op} at size {r.size}: {r.measured / 1e6:.3g} ms measured, {r.ratio:.2f}x the estimate ({r.detail})"
             for r in rows if r.ratio > LIMIT]
    assert not short, f"{name}: " + "; ".join(short)
    assert {r.op for r in rows} >= {"learn", "forget", "predict"}
