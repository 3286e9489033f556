"""Real service processes for the integration tests: ``python -m uvicorn app.main:app`` as a subprocess.

Each process is configured only through the environment, like production.  Its stdout/stderr (uvicorn and
application logs) go to a log file that tests can scan.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .conftest import ADMIN_TOKEN, free_port

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ServiceProcess:
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_level: str = "info"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "ServiceProcess":
        return self.launch().wait_ready(timeout)

    def launch(self) -> "ServiceProcess":
        env = {**os.environ, **self.env}
        env.pop("CI", None)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", self.log_level],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def wait_ready(self, timeout: float = 60.0, path: str = "/readyz") -> "ServiceProcess":
        """Until ``path`` answers 200 (``/healthz``: alive, before the kernels are loaded); killed on time-out."""
        try:
            wait_for_200(self.url + path, self.proc, self.log_path, timeout)
        except TimeoutError:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, exactly like a power cut of the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, token: str | None = None, timeout: float = 60) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def new_tenant(self, name: str = "t") -> tuple[str, str]:
        with self.client(ADMIN_TOKEN) as c:
            r = c.post("/v1/tenants", json={"name": name})
            assert r.status_code == 201, r.text
            return r.json()["id"], r.json()["api_key"]


def wait_for_200(url: str, proc: subprocess.Popen, log_path: Path, timeout: float = 60.0,
                 poll: float = 0.05) -> None:
    """Poll ``url`` until it answers 200.  RuntimeError with the log's tail if the process exits first,
    TimeoutError (also with it) once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200:\n{log_path.read_text()[-4000:]}")
        time.sleep(poll)


def assert_kernels_compiling(url: str) -> None:
    """``/readyz`` is 503 only because the compiled kernels are still compiling (issue 23)."""
    r = httpx.get(url + "/readyz", timeout=5)
    checks = r.json()["checks"]
    assert r.status_code == 503 and checks.pop("kernels") == "compiling", r.text
    assert checks == {"database": "ok", "schema": "ok", "signing_key": "ok"}


def service_env(data_dir: Path, database_url: str, **extra: str) -> dict[str, str]:
    env = {"OLU_DATA_DIR": str(data_dir), "OLU_DATABASE_URL": database_url, "OLU_ADMIN_TOKEN": ADMIN_TOKEN}
    env.update({k: v for k, v in extra.items()})
    return env
