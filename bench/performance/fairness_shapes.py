"""Section fairness, request shapes (issue 37 item 1): another tenant's latency while one tenant, within its limits,
sends requests of a costly shape one at a time (or from a few clients).

Each row: tenant A sends one shape from ``clients`` processes (at nice ``FLOOD_NICE``, like fairness.py's flood),
each waiting for its answer before the next request; tenant B sends 1-row predicts one at a time and measures its
latency, alone and while A sends, in alternate windows of one run.  Target: B's p99 while A sends within 2x of its
p99 alone.  Shapes:

- hashed predict: 1 000 feature dictionaries ``{"c": "v.."}`` (~14 KB of JSON) to a hashed model of dim 10^5,
  800 MB of dense rows if encoded at once (F5-F);
- hashed learn: 200 such dictionaries (the learn hands the engine batch x 10^5 float64 rows: 160 MB);
- 19 MiB learn bodies: columnar JSON (10 000 x 100), per-example JSON (10 000 x 100) and msgpack with raw float64
  rows (10 000 x 240), at most OLU_MAX_BATCH examples each (F5-G);
- unlearn bodies of 10 000 ids never learned (2.5 MB of JSON; each answered 404 after the ids' commitments are
  looked up, F5-G's cheap 404);
- the same columnar JSON body with ``OLU_DECODE_PROCESS_BYTES=0`` (decoded in the server's process, on the worker
  thread holding A's turn): what the decode pool saves.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import tempfile
import time

import httpx
import msgpack
import numpy as np
import orjson

from ..common import passive_model
from .fairness import FLOOD_NICE, TARGET, b_windows, percentiles
from .ingest import Server

HASHED_DIM = 100_000
BIG_N = 10_000


def _hashed_model() -> dict:
    return {**passive_model("hashed", HASHED_DIM, 0.01),
            "features": {"type": "hashed", "dim": HASHED_DIM, "categorical": ["c"]}}


def _rows(n: int, d: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, d))
    return 0.9 * X / np.linalg.norm(X, axis=1, keepdims=True)


def _request(shape: str, seed: int):
    """A function of the request number returning (path suffix, body, content type) for ``shape``."""
    if shape == "hashed predict":
        body = orjson.dumps({"features": [{"c": f"v{i % 97}"} for i in range(1000)]})
        return lambda n: ("predict", body, "application/json")
    if shape == "hashed learn":
        return lambda n: ("learn", orjson.dumps({"examples": [
            {"id": f"h{seed}-{n}-{i}", "features": {"c": f"v{i % 97}"}, "y": float(i % 2)} for i in range(200)]}),
            "application/json")
    if shape == "unlearn unknown ids":  # F5-G's cheap 404: 10 000 ids never learned, 250 characters each
        return lambda n: ("unlearn", orjson.dumps({"ids": [f"u{seed}-{n}-{i}".ljust(250, "x") for i in range(BIG_N)]}),
                          "application/json")
    d = 240 if shape == "msgpack 19 MiB" else 100
    X = _rows(BIG_N, d, seed)
    Xl, y = X.tolist(), [float(i % 2) for i in range(BIG_N)]
    if shape == "msgpack 19 MiB":
        xb, yb = X.astype("<f8").tobytes(), np.asarray(y).astype("<f8").tobytes()
        return lambda n: ("learn", msgpack.packb({"ids": [f"m{seed}-{n}-{i}" for i in range(BIG_N)], "x": xb, "y": yb}),
                          "application/msgpack")
    if shape == "examples JSON 19 MiB":
        return lambda n: ("learn", orjson.dumps({"examples": [{"id": f"e{seed}-{n}-{i}", "x": x, "y": v}
                                                              for i, (x, v) in enumerate(zip(Xl, y))]}),
                          "application/json")
    return lambda n: ("learn", orjson.dumps({"ids": [f"c{seed}-{n}-{i}" for i in range(BIG_N)], "x": Xl, "y": y}),
                      "application/json")


def _sender(url: str, key: str, mid: str, shape: str, on, stop, counts, seed: int, ready) -> None:
    if FLOOD_NICE:
        os.nice(FLOOD_NICE)
    make = _request(shape, seed)
    ready.put(seed)
    tally: dict[str, int] = {}
    sizes = []
    n = 0
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=300) as c:
        while not stop.is_set():
            if not on.is_set():
                time.sleep(0.01)
                continue
            n += 1
            path, body, ctype = make(n)
            sizes.append(len(body))
            try:
                code = str(c.post(f"/v1/models/{mid}/{path}", content=body, headers={"content-type": ctype}).status_code)
            except httpx.HTTPError as e:
                code = type(e).__name__
            tally[code] = tally.get(code, 0) + 1
    counts.put((tally, max(sizes) if sizes else 0))


def _row(srv: Server, admin: str, shape: str, clients: int, quick: bool) -> dict:
    with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {admin}"}, timeout=60) as c:
        a = c.post("/v1/tenants", json={"name": "A"}).json()
        b = c.post("/v1/tenants", json={"name": "B"}).json()
    spec = _hashed_model() if shape.startswith("hashed") else passive_model(
        "big", 240 if shape == "msgpack 19 MiB" else 100, 0.01)
    with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {a['api_key']}"}, timeout=120) as c:
        r = c.post("/v1/models", json=spec)
        r.raise_for_status()
        a_mid = r.json()["id"]
        if shape == "hashed predict":
            c.post(f"/v1/models/{a_mid}/learn", json={"examples": [
                {"id": f"w{i}", "features": {"c": f"v{i}"}, "y": float(i % 2)} for i in range(50)]}).raise_for_status()
            # untimed: the decode pool's first process starts in the background (DecodePool.warm), as after any
            # server's first large body; the first window (alone) leaves it time to answer
            c.post(f"/v1/models/{a_mid}/predict", content=_request(shape, 0)(0)[1],
                   headers={"content-type": "application/json"}).raise_for_status()
    Xb = _rows(200, 64, 9)
    with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {b['api_key']}"}, timeout=60) as c:
        b_mid = c.post("/v1/models", json=passive_model("b", 64, 0.01)).json()["id"]
        c.post(f"/v1/models/{b_mid}/learn", json={"ids": [f"r{i}" for i in range(200)], "x": Xb.tolist(),
                                                  "y": [float(i % 2) for i in range(200)]}).raise_for_status()
    ctx = mp.get_context("spawn")
    on, stop, counts, ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_sender, args=(srv.url, a["api_key"], a_mid, shape, on, stop, counts, s, ready))
             for s in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    window, rounds = (2.0, 2) if quick else (4.0, 3)
    body = orjson.dumps({"x": [Xb[0].tolist()]})
    with httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {b['api_key']}",
                                                 "content-type": "application/json"}, timeout=60) as c:
        # alone: A's request in flight ends; busy: A's first one is sent
        lat, b_codes = b_windows(c, f"/v1/models/{b_mid}/predict", body, on, rounds, window, "busy",
                                 {"alone": 1.0, "busy": 0.3})
    on.clear()
    stop.set()
    tally: dict[str, int] = {}
    size = 0
    for _ in procs:
        got, biggest = counts.get(timeout=300)
        size = max(size, biggest)
        for k, v in got.items():
            tally[k] = tally.get(k, 0) + v
    for p in procs:
        p.join(timeout=60)
    out = {"shape": shape, "clients": clients, "a_status": tally, "body_bytes": size, "b_status": b_codes,
           "busy_seconds": rounds * window, "loadavg": os.getloadavg()[0]}
    out.update(percentiles(lat))
    out["p99_ratio"] = out["busy"]["p99_s"] / out["alone"]["p99_s"]
    return out


ROWS = (("hashed predict", 2, {}), ("hashed learn", 1, {}), ("columnar JSON 19 MiB", 1, {}),
        ("examples JSON 19 MiB", 1, {}), ("msgpack 19 MiB", 1, {}), ("unlearn unknown ids", 1, {}),
        ("columnar JSON 19 MiB", 1, {"OLU_DECODE_PROCESS_BYTES": "0"}))


def run(quick: bool, only: set[str] | None = None) -> dict:
    rows = []
    for shape, clients, env in ROWS:
        if only and shape not in only:
            continue
        tmp, admin = tempfile.mkdtemp(prefix="olu-shapes-"), "bench-" + secrets.token_hex(16)
        srv = Server("app.main:app", {"OLU_DATA_DIR": tmp, "OLU_ADMIN_TOKEN": admin, "OLU_SQLITE_SYNCHRONOUS": "FULL",
                                      **env})
        try:
            row = _row(srv, admin, shape, clients, quick)
        finally:
            srv.stop()
        row["env"] = env
        rows.append(row)
    return {"rows": rows, "target_p99_ratio": TARGET, "cpus": os.cpu_count(),
            "sender": f"tenant A: the shape from N processes at nice {FLOOD_NICE}, one request at a time each; "
                      "tenant B: 1-row predicts, one at a time"}


def table(r: dict) -> list[str]:
    from ..common import fmt_time

    lines = [f"## fairness by request shape: tenant B's predict latency, alone and while tenant A sends ({r['sender']})",
             f"{'shape (settings)':>44} {'A body':>9} {'alone p99':>10} {'busy p50':>9} {'busy p99':>9} {'x p99':>6} "
             f"{'met':>4} {'load':>5}  A's answers"]
    for row in r["rows"]:
        name = row["shape"] + (f" x{row['clients']}" if row["clients"] > 1 else "") + (
            " (" + ", ".join(f"{k}={v}" for k, v in row["env"].items()) + ")" if row["env"] else "")
        met = "yes" if row["p99_ratio"] <= r["target_p99_ratio"] else "no"
        lines.append(f"{name:>44} {row['body_bytes'] / 2**20:>7.2f}Mi {fmt_time(row['alone']['p99_s']):>10} "
                     f"{fmt_time(row['busy']['p50_s']):>9} {fmt_time(row['busy']['p99_s']):>9} "
                     f"{row['p99_ratio']:>5.1f}x {met:>4} {row['loadavg']:>5.1f}  {row['a_status']}")
        if set(row["b_status"]) - {"200"}:
            lines.append(f"{'':>44} B answers: {row['b_status']}")
    lines.append(f"target: B's p99 while A sends <= {r['target_p99_ratio']:g}x its p99 alone ({r['cpus']} CPUs)")
    return lines


if __name__ == "__main__":
    import sys

    picked = {s for s in sys.argv[1:] if not s.startswith("--")} or None
    print("\n".join(table(run("--quick" in sys.argv, picked))))
