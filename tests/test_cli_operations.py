"""``olu operations``: the client verbs that follow an operation with a rich progress bar, and the worker process.

``wait`` follows a retrain paused mid-way until it succeeds (exit 0, the final bar full, the operation printed);
``retrain --no-wait`` starts one; ``cancel`` then ``wait`` ends with exit 2; ``olu operations work`` runs the
operations of a service whose replicas run none (OLU_OPERATION_WORKERS=0) and stops on SIGTERM.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app

from .conftest import start_server
from .helpers import create_model, examples, unit_rows
from .procs import REPO
from .test_operations import Pause


@pytest.fixture
def served(monkeypatch):
    data_dir = Path(tempfile.mkdtemp(prefix="olu-cli-ops-"))
    srv, (uv, thread) = start_server(f"sqlite:///{data_dir / 'olu.db'}", data_dir, "sqlite",
                                     operation_lease_seconds=1.5)
    pause = Pause(monkeypatch)
    _, key = srv.new_tenant("cli")
    yield srv, key, pause
    pause.go.set()
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


def _model(c, n: int = 40) -> str:
    mid = create_model(c, dim=3, algorithm="sisa", hyperparameters={"shards": 4})["id"]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(n, 3))}).status_code == 200
    return mid


def _olu(*args: str):
    return CliRunner().invoke(app, ["operations", *args])


def test_wait_follows_a_retrain_with_a_progress_bar_until_it_succeeds(served):
    srv, key, pause = served
    with srv.client(key) as c:
        mid = _model(c)
        started = _olu("retrain", mid, "--server", srv.url, "--api-key", key, "--no-wait")
        assert started.exit_code == 0, started.output
        op = json.loads(started.stdout)
        assert op["kind"] == "retrain" and op["status"] in ("queued", "running")

        def let_go():  # once the progress moved: the bar has shown it mid-way
            ends = time.monotonic() + 60
            while c.get(f"/v1/operations/{op['id']}").json()["progress"]["done"] == 0 and time.monotonic() < ends:
                time.sleep(0.05)
            time.sleep(0.3)
            pause.go.set()

        helper = threading.Thread(target=let_go)
        helper.start()
        out = _olu("wait", op["id"], "--server", srv.url, "--api-key", key, "--interval", "0.05")
        helper.join()
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["status"] == "succeeded"
    assert "retrain succeeded" in out.stderr and "40/40" in out.stderr and "100%" in out.stderr, out.stderr


def test_cancel_then_wait_exits_2_and_list_shows_it(served):
    srv, key, pause = served
    with srv.client(key) as c:
        mid = _model(c)
        op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
        assert pause.entered.wait(60)
    cancel = _olu("cancel", op["id"], "--server", srv.url, "--api-key", key)
    assert cancel.exit_code == 0 and op["id"] in cancel.stdout, cancel.output
    out = _olu("wait", op["id"], "--server", srv.url, "--api-key", key, "--interval", "0.05", "--quiet")
    assert out.exit_code == 2 and json.loads(out.stdout)["status"] == "cancelled", out.output
    listed = _olu("list", "--server", srv.url, "--api-key", key)
    assert f"{op['id']} retrain of {mid}: cancelled" in listed.stdout, listed.output
    missing = _olu("show", "op_" + "0" * 30, "--server", srv.url, "--api-key", key)
    assert missing.exit_code == 4 and "Operation not found" in missing.stderr


def test_a_worker_process_runs_the_operations_of_replicas_that_run_none(tmp_path):
    srv, (uv, thread) = start_server(f"sqlite:///{tmp_path / 'olu.db'}", tmp_path, "sqlite", operation_workers=0,
                                     operation_poll_seconds=0.2)
    worker = None
    try:
        _, key = srv.new_tenant("worker")
        with srv.client(key) as c:
            mid = _model(c, n=12)
            op = c.post(f"/v1/models/{mid}/retrain", headers={"Prefer": "respond-async"}).json()
            assert c.get(f"/v1/operations/{op['id']}").json()["status"] == "queued"  # no runner in this process
            env = {**os.environ, "OLU_DATA_DIR": str(tmp_path), "OLU_DATABASE_URL": f"sqlite:///{tmp_path / 'olu.db'}",
                   "OLU_OPERATION_POLL_SECONDS": "0.2"}
            env.pop("OLU_OPERATION_WORKERS", None)
            worker = subprocess.Popen([sys.executable, "-m", "app.cli", "operations", "work"], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            ends = time.monotonic() + 120
            while (got := c.get(f"/v1/operations/{op['id']}").json())["status"] in ("queued", "running"):
                assert time.monotonic() < ends and worker.poll() is None, worker.stdout.read().decode()[-3000:]
                time.sleep(0.1)
            assert got["status"] == "succeeded" and got["result"]["epoch"] == 2, got
            assert c.get(f"/v1/models/{mid}").json()["epoch"] == 2
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        uv.should_exit = True
        thread.join(timeout=10)
        srv.app.state.ctx.db.dispose()
