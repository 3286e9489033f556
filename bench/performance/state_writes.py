"""Writes proportional to the change (issue 36 item 1): ``python -m bench.performance.state_writes``.

Two service processes on SQLite (``synchronous=FULL``, the defaults otherwise): one with the state log
(``OLU_STATE_LOG=true``, the default) and one without it (every write stores the whole state, as before issue 36).
On each, in turn:

* **bytes per learn**: one tenant sends ``LEARNS`` learns of one example, one at a time, into an ``exact_ridge``
  model at d = 1 439 (a 16.6 MB state) and into a ``memory_pair`` model at d = 10^5 (16 MiB); the bytes the
  server process wrote to storage (``/proc/<pid>/io`` ``write_bytes``: the WAL, its checkpoints into the database
  file, compactions included) divided by the number of learns.
* **another tenant's learn**: a second tenant's ``passive_olu`` learns of one example (d = 32), one at a time; its p50
  alone and while the first tenant sends its exact_ridge learns one at a time from another thread, in alternate
  windows (``WINDOWS`` of each), so that a change of load on the shared machine hits both alike.

Targets: bytes per 1-example exact_ridge learn with the log <= 1 % of those without it; the other tenant's p50
while the exact_ridge tenant writes <= 2 x its p50 alone (with the log).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ..common import machine, stream
from .service_store import create, start_service, tenant_client

LEARNS = 60
WINDOW_S = 4.0
WINDOWS = 3
TARGET_BYTES = 0.01
TARGET_P50 = 2.0


def ridge_body(d: int = 1439) -> dict:
    return {"name": "ridge", "algorithm": "exact_ridge", "loss": "squared", "dim": d,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def pair_body(d: int = 100_000) -> dict:
    return {"name": "pairs", "algorithm": "memory_pair", "loss": "logistic", "dim": d,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def small_body() -> dict:
    return {"name": "small", "algorithm": "passive_olu", "loss": "logistic", "dim": 32,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}}


def written(pid: int) -> int:
    """Bytes the process has caused to be written to storage (``write_bytes`` of /proc/<pid>/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no write_bytes")


class Learner:
    """Learns one example at a time into a model (ids never repeat)."""

    def __init__(self, c: httpx.Client, mid: str, d: int, prefix: str, loss: str = "squared"):
        self.c, self.mid, self.prefix, self.k = c, mid, prefix, 0
        X, y = stream(512, d, seed=len(prefix), loss="logistic" if loss == "logistic" else "squared")
        self.X, self.y = X, y

    def one(self) -> float:
        i = self.k % len(self.X)
        body = {"examples": [{"id": f"{self.prefix}{self.k}", "x": self.X[i].tolist(), "y": float(self.y[i])}]}
        self.k += 1
        t0 = time.perf_counter()
        r = self.c.post(f"/v1/models/{self.mid}/learn", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"learn: {r.status_code} {r.text[:300]}")
        return time.perf_counter() - t0


def bytes_per_learn(srv, learner: Learner, n: int) -> float:
    learner.one()  # the model's engine in the cache, its first write done
    before = written(srv.proc.pid)
    for _ in range(n):
        learner.one()
    time.sleep(0.2)
    return (written(srv.proc.pid) - before) / n


def interference(heavy: Learner, light: Learner) -> dict:
    """The light tenant's learn times alone and while the heavy tenant learns, in alternate windows."""
    alone, loaded, heavy_times = [], [], []
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            heavy_times.append(heavy.one())

    for _ in range(WINDOWS):
        end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < end:
            alone.append(light.one())
        stop.clear()
        t = threading.Thread(target=flood)
        t.start()
        time.sleep(0.3)  # the flood under way
        end = time.perf_counter() + WINDOW_S
        while time.perf_counter() < end:
            loaded.append(light.one())
        stop.set()
        t.join()
    return {"alone_p50_s": statistics.median(alone), "loaded_p50_s": statistics.median(loaded),
            "alone_n": len(alone), "loaded_n": len(loaded),
            "heavy_learn_p50_s": statistics.median(heavy_times) if heavy_times else None,
            "ratio": statistics.median(loaded) / statistics.median(alone)}


def run_one(state_log: bool, learns: int, log=print) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        srv, admin = start_service(tmp, {"OLU_STATE_LOG": "true" if state_log else "false"})
        try:
            a, b = tenant_client(srv.url, admin), tenant_client(srv.url, admin)
            ridge = create(a, ridge_body())
            pairs = create(a, pair_body())
            small = create(b, small_body())
            heavy = Learner(a, ridge["id"], 1439, "ridge-")
            out = {"state_log": state_log,
                   "ridge_bytes_per_learn": bytes_per_learn(srv, heavy, learns),
                   "pairs_bytes_per_learn": bytes_per_learn(srv, Learner(a, pairs["id"], 100_000, "pair-", "logistic"),
                                                            max(5, learns // 6))}
            log(f"  state_log={state_log}: exact_ridge d=1439 {out['ridge_bytes_per_learn'] / 1e6:.3f} MB per learn, "
                f"memory_pair d=1e5 {out['pairs_bytes_per_learn'] / 1e6:.3f} MB per learn")
            out["interference"] = interference(heavy, Learner(b, small["id"], 32, "small-", "logistic"))
            log(f"  another tenant's learn p50: alone {out['interference']['alone_p50_s'] * 1e3:.1f} ms, while "
                f"exact_ridge learns {out['interference']['loaded_p50_s'] * 1e3:.1f} ms "
                f"({out['interference']['ratio']:.2f}x)")
            a.close()
            b.close()
        finally:
            srv.stop()
    return out


def run(learns: int = LEARNS, log=print) -> dict:
    on = run_one(True, learns, log)
    off = run_one(False, learns, log)
    return {"machine": machine(), "learns": learns, "with_log": on, "without_log": off,
            "ratios": {"ridge_bytes": on["ridge_bytes_per_learn"] / off["ridge_bytes_per_learn"],
                       "pairs_bytes": on["pairs_bytes_per_learn"] / off["pairs_bytes_per_learn"],
                       "other_tenant_p50_with_log": on["interference"]["ratio"],
                       "other_tenant_p50_without_log": off["interference"]["ratio"]}}


def report(r: dict) -> str:
    on, off, q = r["with_log"], r["without_log"], r["ratios"]
    return "\n".join([
        f"writes proportional to the change: SQLite synchronous=FULL ({r['machine']['date_utc']} UTC, "
        f"{r['machine']['nproc']} cores, load {r['machine']['load_avg']})",
        "| | with the state log | without (whole state) | ratio |", "|---|---|---|---|",
        f"| exact_ridge d = 1 439, bytes written per 1-example learn | {on['ridge_bytes_per_learn'] / 1e3:,.1f} kB | "
        f"{off['ridge_bytes_per_learn'] / 1e6:,.1f} MB | {q['ridge_bytes']:.4f} (target <= {TARGET_BYTES}) |",
        f"| memory_pair d = 10^5, bytes written per 1-example learn | {on['pairs_bytes_per_learn'] / 1e6:,.2f} MB | "
        f"{off['pairs_bytes_per_learn'] / 1e6:,.1f} MB | {q['pairs_bytes']:.3f} |",
        f"| another tenant's learn p50, alone -> while exact_ridge learns | "
        f"{on['interference']['alone_p50_s'] * 1e3:.1f} -> {on['interference']['loaded_p50_s'] * 1e3:.1f} ms "
        f"({q['other_tenant_p50_with_log']:.2f}x, target <= {TARGET_P50}) | "
        f"{off['interference']['alone_p50_s'] * 1e3:.1f} -> {off['interference']['loaded_p50_s'] * 1e3:.1f} ms "
        f"({q['other_tenant_p50_without_log']:.2f}x) | |"])


def main() -> None:  # pragma: no cover - a measurement
    ap = argparse.ArgumentParser()
    ap.add_argument("--learns", type=int, default=LEARNS)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    r = run(args.learns)
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    main()
