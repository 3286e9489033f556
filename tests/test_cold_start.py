"""No request waits for a compiler (issue 23): a service started on an empty numba cache answers its first learns
on the numpy path while the kernels compile in the background, with the results a warm service gives (to
round-off; tests/test_fast_path.py bounds a stream that switches loop by the certificates' round-off floor).

The latency of the first learn is printed here and measured in ``python -m bench --sections coldstart``
(docs/performance.md); what this test asserts is structural: the answer came while ``/readyz`` still reported the
kernels compiling (503: a load balancer sends traffic to warm replicas meanwhile), so it cannot have waited for
them.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from .conftest import ADMIN_TOKEN
from .procs import ServiceProcess, assert_kernels_compiling, service_env

DIM = 16
N = 1000


def _examples(seed: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, DIM))
    X = 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)
    return [{"id": f"r{i}", "x": x.round(12).tolist(), "y": float(i % 2)} for i, x in enumerate(X)]


MODEL = {"name": "cold", "algorithm": "passive_olu", "loss": "logistic", "dim": DIM, "bounds": {"x_norm": 1.0},
         "domain_radius": 10.0, "l2": 0.05, "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def _warm_parameters(tmp_path, rows: list[dict]) -> list[float]:
    """The same model and learn in this process, whose kernels the session fixture loaded."""
    from fastapi.testclient import TestClient

    from app.config import Settings
    from app.main import create_app
    from app.unlearning.mechanism import fast

    assert fast.ready() or not fast.available()
    settings = Settings(data_dir=tmp_path / "warm", admin_token=ADMIN_TOKEN, rate_limit=None, auth_failure_limit=0)
    with TestClient(create_app(settings)) as c:
        key = c.post("/v1/tenants", headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                     json={"name": "warm"}).json()["api_key"]
        c.headers["authorization"] = f"Bearer {key}"
        mid = c.post("/v1/models", json=MODEL).json()["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": rows}).status_code == 200
        p = c.get(f"/v1/models/{mid}/parameters").json()
        return p["weights"] + [p["bias"]]


def test_first_learn_on_an_empty_numba_cache_does_not_wait_for_the_compiler(tmp_path):
    from app.unlearning.mechanism import fast

    if not fast.available():
        pytest.skip(f"numba is off here ({fast.unavailable_reason() or 'OLU_NUMBA=0'}): there is nothing to compile")
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = service_env(tmp_path / "data", f"sqlite:///{tmp_path / 'olu.db'}", NUMBA_CACHE_DIR=str(cache))
    rows = _examples()
    svc = ServiceProcess(env, tmp_path / "service.log").launch()
    try:
        svc.wait_ready(path="/healthz")
        assert_kernels_compiling(svc.url)
        _, key = svc.new_tenant("cold")
        with svc.client(key) as c:
            mid = c.post("/v1/models", json=MODEL).json()["id"]
            started = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/learn", json={"examples": rows})
            seconds = time.perf_counter() - started
            assert r.status_code == 200, r.text
            assert_kernels_compiling(svc.url)  # still compiling after the answer: the learn did not wait for it
            print(f"first {N}-example learn on an empty numba cache: {seconds:.3f} s (numpy path)")
            p = c.get(f"/v1/models/{mid}/parameters").json()
            cold = p["weights"] + [p["bias"]]
            # and a forget on the pure discrete Gaussian route, also without waiting
            f = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["r5"]})
            assert f.status_code == 200, f.text
            assert_kernels_compiling(svc.url)
    finally:
        svc.stop()
    np.testing.assert_allclose(cold, _warm_parameters(tmp_path, rows), rtol=0, atol=1e-12)


def test_olu_warm_builds_or_loads_the_cache():
    """``olu warm`` (the image runs it at build time): loads the kernels the session already compiled into numba's
    default cache and says so; with numba switched off it reports "off" and succeeds (nothing to build)."""
    import os
    import subprocess

    from .procs import REPO
    from .tools import tool, tool_env

    olu = tool("olu")
    assert olu, "the olu console script is installed with the package"
    env = tool_env({k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"})
    warm = subprocess.run([olu, "warm"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0 and warm.stdout.startswith("kernels: ok in "), warm.stdout + warm.stderr
    off = subprocess.run([olu, "warm"], cwd=REPO, env={**env, "OLU_NUMBA": "0"}, capture_output=True, text=True,
                         timeout=120)
    assert off.returncode == 0 and off.stdout.startswith("kernels: off"), off.stdout + off.stderr


def test_olu_serve_steers_sqlite_to_one_worker(monkeypatch, tmp_path):
    """bench --sections scale: on SQLite more workers add no ingest and lengthen the learn tail, so `olu serve`
    warns when asked for several workers on SQLite (and not on PostgreSQL, nor for one worker)."""
    import uvicorn
    from typer.testing import CliRunner

    from app.cli import app as cli

    import app.main

    runs = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: runs.append(kw["workers"]))
    # olu serve builds the app once before uvicorn (issue 40: a setting it cannot use is one line, before any worker
    # starts); here only the warning matters, so that check stands aside (no PostgreSQL needs to answer)
    from types import SimpleNamespace

    built = SimpleNamespace(state=SimpleNamespace(ctx=SimpleNamespace(db=SimpleNamespace(dispose=lambda: None))))
    monkeypatch.setattr(app.main, "create_app", lambda *a, **kw: built)
    monkeypatch.setenv("OLU_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("OLU_ADMIN_TOKEN", ADMIN_TOKEN)
    runner = CliRunner()
    monkeypatch.setenv("OLU_DATABASE_URL", f"sqlite:///{tmp_path / 'olu.db'}")
    several = runner.invoke(cli, ["serve", "--workers", "4"])
    one = runner.invoke(cli, ["serve"])
    monkeypatch.setenv("OLU_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/olu")
    postgres = runner.invoke(cli, ["serve", "--workers", "4"])
    assert runs == [4, 1, 4]
    assert "4 workers on SQLite" in several.output and "one worker" in several.output
    assert "warning" not in one.output and "warning" not in postgres.output


def test_the_image_builds_the_kernels_into_a_cache_the_service_user_owns():
    """No Docker daemon here, so the Dockerfile is checked for what makes a container start warm: NUMBA_CACHE_DIR
    set, ``olu warm`` run at build time after the install, the cache handed to the non-root service user (numba
    uses only a cache directory it can write), liveness on /healthz for the HEALTHCHECK."""
    import re

    from .procs import REPO

    docker = (REPO / "Dockerfile").read_text()
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", docker)
    assert cache, "the image sets NUMBA_CACHE_DIR"
    run = next(line for line in docker.split("\nRUN ")[1:] if "useradd" in line)
    assert run.index("pip install") < run.index("olu warm") < run.index('chown -R olu /data "$NUMBA_CACHE_DIR"')
    assert re.search(r"^USER olu$", docker, re.M)
    healthcheck = docker[docker.index("HEALTHCHECK"):].split("\n\n")[0]
    assert "/healthz" in healthcheck and "/readyz" not in healthcheck.split("CMD", 1)[1]
