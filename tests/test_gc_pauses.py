"""gc_pauses (issue 37, fairness): the objects loaded at start-up are moved out of the cyclic collector's walk, so a
full collection set off by one tenant's allocations no longer stops every request for ~100 ms; frozen once at
start-up and once more when the compiled kernels have loaded."""
from __future__ import annotations

import gc
import threading
import time
import weakref

from fastapi.testclient import TestClient

from app import gc_pauses
from app.config import Settings
from app.main import create_app


def test_the_service_freezes_what_start_up_loaded(tmp_path):
    assert Settings(data_dir=tmp_path).gc_freeze is False  # the suite's conftest: off for the other tests
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    app = create_app(Settings(data_dir=tmp_path, log_level="WARNING", gc_freeze=True))
    try:
        with TestClient(app) as c:
            assert c.get("/healthz").status_code == 200
            assert gc.get_freeze_count() > 10_000  # the modules, the app, its settings and routes
    finally:
        gc.unfreeze()


def test_a_second_freeze_once_loading_ends(monkeypatch):
    calls = []
    monkeypatch.setattr(gc_pauses, "freeze", lambda: calls.append(threading.current_thread().name))
    loading = threading.Event()
    loading.set()
    gc_pauses.freeze_at_start_up(loading.is_set, poll=0.01)
    assert calls == ["MainThread"]  # at once, on the caller's thread
    time.sleep(0.05)
    assert len(calls) == 1  # still loading: not yet
    loading.clear()
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == ["MainThread", "olu-gc-freeze"]


def test_freeze_collects_first_so_no_garbage_is_kept():
    gc.unfreeze()
    try:
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a reference cycle ...
        gone = weakref.ref(a)
        del a, b  # ... that is garbage: only the collector frees it
        gc_pauses.freeze()
        assert gone() is None  # collected before the freeze, not frozen for good
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
