"""Shared helpers of the benchmark runner (``python -m bench``): timing, specs, machine description."""
from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

import numpy as np

from app.unlearning import ALGORITHMS, ModelSpec
from app.privacy import rho_from_epsilon_delta


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (seconds)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stream(n: int, d: int, seed: int = 0, loss: str = "logistic") -> tuple[np.ndarray, np.ndarray]:
    """Rows inside the unit ball and labels from a noisy linear rule."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X *= 0.95 / np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    w = rng.standard_normal(d)
    s = X @ w + 0.3 * rng.standard_normal(n)
    y = (s > 0).astype(np.float64) if loss == "logistic" else np.clip(s, -1, 1)
    return X, y


def spec(algorithm: str, d: int, hp: dict | None = None, loss: str = "logistic") -> ModelSpec:
    cls = ALGORITHMS[algorithm]
    k = 0
    if cls.classifier_losses and loss == "logistic":  # a family classifying with its own loss (exact_ridge)
        loss, k = cls.classifier_losses[0], 2
    s = ModelSpec(algorithm=algorithm, loss=loss, dim=d, x_norm=1.0, y_abs=1.0, domain_radius=10.0, l2=0.01,
                  epsilon=1.0, delta=1e-6, rho=rho_from_epsilon_delta(1.0, 1e-6), hyperparameters=dict(hp or {}),
                  n_classes=k)
    return s.with_hyperparameters(cls.normalize_hyperparameters(s))


def machine() -> dict:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            return "?"

    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "nproc": sh("nproc"), "cpu": cpu,
            "free_h": sh("free -h"), "python": sys.version.split()[0], "platform": platform.platform(),
            "numpy": np.__version__, "load_avg": list(os.getloadavg())}


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e3 else f"{v:.0f}"


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def projected_time(history: list[tuple[int, float]], n: int) -> float:
    """Time at size n extrapolated from the measured (size, seconds): t_last (n / n_last)^k, k >= 1 the growth
    exponent between the last two sizes; 0 with nothing measured yet."""
    if not history:
        return 0.0
    n2, t2 = history[-1]
    k = 1.0
    if len(history) >= 2:
        n1, t1 = history[-2]
        if t1 > 0 and t2 > 0 and n2 > n1:
            k = max(1.0, math.log(t2 / t1) / math.log(n2 / n1))
    return t2 * (n / n2) ** k


def free_port() -> int:
    """A free TCP port on the loopback interface (for a service process a benchmark starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def passive_model(name: str, dim: int, l2: float) -> dict:
    """The request body of a passive OLU logistic model with unit-norm features (the HTTP benchmarks' model)."""
    return {"name": name, "algorithm": "passive_olu", "loss": "logistic", "dim": dim, "bounds": {"x_norm": 1.0},
            "domain_radius": 10.0, "l2": l2, "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def wait_for(url: str, proc, path: str = "/readyz", timeout: float = 120.0, poll: float = 0.05) -> float:
    """Poll ``url + path`` until it answers 200 (seconds waited); RuntimeError if ``proc`` exits or time runs out."""
    import httpx

    started = time.perf_counter()
    while True:
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.perf_counter() - started > timeout:
            raise RuntimeError(f"{url}{path} did not answer 200")
        time.sleep(poll)


# one client measures the service alone: the per-key and per-tenant request limits (default 1000/s and 200/s,
# app/config.py) would answer 429 to the bench's own loops, so the servers it starts run with them off
NO_RATE_LIMITS = {"OLU_RATE_LIMIT": "0", "OLU_TENANT_RATE_LIMIT": "0"}
