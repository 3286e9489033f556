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

    def wait_ready(self, timeout: float = 60.0) -> "ServiceProcess":
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"service did not become ready:\n{self.log_path.read_text()[-4000:]}")
            time.sleep(0.05)

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


def service_env(data_dir: Path, database_url: str, **extra: str) -> dict[str, str]:
    env = {"OLU_DATA_DIR": str(data_dir), "OLU_DATABASE_URL": database_url, "OLU_ADMIN_TOKEN": ADMIN_TOKEN}
    env.update({k: v for k, v in extra.items()})
    return env
