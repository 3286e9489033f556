"""A request past its deadline stops computing (issue 29, item 1).

The issue: a learn of an ``online_dp_tree`` model answered 503 ``request-deadline-exceeded`` after 11 s, and the
server then stayed near 100 % of a core for about 14 minutes with no request in flight.  Now the worker runs the
engine with the request's check installed as its checkpoint (app/unlearning/contract/errors.py): the engine calls
it at every gradient and every pure-path noise draw, and it raises once the request has given up.

The test serves a model whose learn takes many seconds of CPU (the tree's node noise beyond the compiled sampler's
range: ~50 us a coordinate), with a deliberately tiny deadline and a budget high enough to accept it, and measures
the CPU time the process spends in the two seconds after the 503: a ratio of CPU time to the window, which
stays small once the computation has stopped (it was a whole core before).  The aborted learn changes nothing,
and the model takes a later learn (its gate was released).
"""
from __future__ import annotations

import secrets
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from app.unlearning import engine_class
from app.unlearning.contract.errors import Cancelled, cancellable, checkpoint
from app.registry import build_spec

DEADLINE = 0.5
WINDOW = 2.0
# sigma'/g ~ 1e10 (beyond the kernel's 2^30.5): each example draws dim + 1 coordinates on the pure path
SLOW = {"name": "slow", "algorithm": "online_dp_tree", "loss": "logistic", "dim": 2000,
        "bounds": {"x_norm": 9.2516, "y_abs": 1.0}, "domain_radius": 1.0, "l2": 0.0,
        "privacy": {"epsilon": 0.01, "delta": 1e-6},
        "hyperparameters": {"horizon": 1_000_000, "max_deletions": 10, "variant": "convex"}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    token = "deadline-admin-" + secrets.token_hex(16)
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("deadline"), admin_token=token, rate_limit=0,
                              log_level="WARNING", request_deadline_seconds=DEADLINE, max_request_work=1e14))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/tenants", json={"name": "deadline"}, headers={"authorization": f"Bearer {token}"})
        c.headers["authorization"] = f"Bearer {r.json()['api_key']}"
        yield c


def _rows(n: int, dim: int, x_norm: float, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    X *= 0.9 * x_norm / np.linalg.norm(X, axis=1, keepdims=True)
    return [{"id": f"r{seed}-{i}", "x": X[i].tolist(), "y": int(i % 2)} for i in range(n)]


def test_the_engine_stops_at_its_next_checkpoint_once_cancelled():
    """Engine level: a learn run under a check that raises stops with Cancelled, and a learn outside any check is
    unaffected (the checkpoint is a no-op without one)."""
    spec = build_spec({**SLOW, "dim": 50}, max_dim=100_000)
    eng = engine_class("online_dp_tree")(spec)
    X = np.full((3, 50), 0.1)
    y = np.array([0.0, 1.0, 0.0])
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 2:
            raise Cancelled()

    with cancellable(check), pytest.raises(Cancelled):
        eng.learn(X, y)
    checkpoint()  # nothing installed any more
    assert len(engine_class("online_dp_tree")(spec).learn(X, y)) == 3


def test_a_learn_past_its_deadline_stops_computing_and_changes_nothing(client):
    r = client.post("/v1/models", json=SLOW)
    assert r.status_code == 201, r.text
    mid = r.json()["id"]
    rows = _rows(60, SLOW["dim"], SLOW["bounds"]["x_norm"], 1)  # ~6 s of draws at ~50 us a coordinate
    r = client.post(f"/v1/models/{mid}/learn", json={"examples": rows})
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "/problems/request-deadline-exceeded"
    workers = [t for t in threading.enumerate() if t.name.startswith("olu-compute")]
    cpu0, wall0, threads0 = time.process_time(), time.monotonic(), _thread_cpu(workers)
    time.sleep(WINDOW)
    wall = time.monotonic() - wall0
    busy = (time.process_time() - cpu0) / wall
    worker_busy = (_thread_cpu(workers) - threads0) / wall
    # the process as a whole (the worker, the event loop, the test) and the compute workers alone: on a loaded
    # machine an abandoned computation gets only part of a core, so its own thread's share is asserted too
    assert busy < 0.3, f"the process used {busy:.0%} of a core in the {WINDOW} s after the 503"
    assert worker_busy < 0.05, f"the compute workers used {worker_busy:.0%} of a core after the 503"
    assert not [t for t in threading.enumerate() if t.name.startswith("olu-compute") and _busy(t)]
    m = client.get(f"/v1/models/{mid}").json()
    assert m["step"] == 0 and m["n_records"] == 0, m  # the aborted learn changed nothing
    r = client.post(f"/v1/models/{mid}/learn", json={"examples": _rows(1, SLOW["dim"], 9.2516, 2)})
    assert r.status_code == 200, r.text  # the gate was released: the model serves the next write


def _thread_cpu(threads: list[threading.Thread]) -> float:
    """The CPU time the threads have used (seconds; a thread that has ended counts 0)."""
    total = 0.0
    for t in threads:
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):
            pass
    return total


def _busy(thread: threading.Thread) -> bool:
    """Whether a compute worker is inside a computation now (its frame is below the pool's idle wait)."""
    import sys
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name in ("learn", "forget", "retrain"):
            return True
        frame = frame.f_back
    return False
