"""Exact replay at scale (issue 32): ``python -m bench --sections replay``.

Engine level, d = 32, logistic, the synthetic stream of ``bench.common.stream``:

* **forget** -- ``retrain`` and ``sisa`` (its default shards for max_records = n -- 8, 20, 63 at 1e4, 1e5, 1e6
  since 8170511, 8 at every n before; 4 slices) learn n records (requests of 10 000,
  not timed apart) and forget one record at a time: the median of up to ``FORGETS`` forgets of records drawn
  uniformly from the stream (sisa: the cost depends on where the record sits in its shard), each a recomputation
  over the retained examples (``ArrayRetained``, built before the clock starts).  ``path``: ``compiled`` (the
  numba kernel of mechanism/exact_ogd.py) or ``fallback`` (the same loop without numba: ``fast.set_enabled(False)``,
  as before the kernels have loaded).  Beside it, the compiled passive learn of n examples (``passive_olu``), the
  yardstick of the issue's target "a retrain forget costs at most 3x the compiled passive learn of n".
* **d2d learn** -- ``descent_to_delete`` (defaults, max_records = n) learning n records in requests of 1 000, the
  retained examples handed over as the service does (every request reads the whole store).  Its work grows as
  n^2 / 1 000 (each request descends over every record kept), so it is measured at small n and the time at
  ``D2D_TARGET`` records is projected with the measured growth exponent.
* **read** -- the retained-example read rate on its own: unwrapping a data key (``Cipher.open``) and decrypting one
  sealed example (AES-256-GCM), per record, d = 32; and reading n records through ``SqlRetained.chunks`` from
  SQLite (query, unwrap, decrypt, decode).

The same file runs against an older checkout (``cd <export of the older app/ and bench/> && python -m bench
--sections replay``): it only uses the engine's public interface, so "before" and "after" come from one script.
"""
from __future__ import annotations

import math
import sys
import tempfile
import time

import numpy as np

from app.unlearning import ALGORITHMS, ArrayRetained
from app.unlearning.mechanism import fast

from ..common import fmt_time, spec, stream

D = 32
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
FORGETS = 5            # forgets timed per cell (1e6: 2, as the machine is shared)
FORGET_BUDGET_S = 60.0  # per cell: fewer forgets once they have taken this long
CELL_CAP_S = 240.0      # a cell whose projected time (from the last size, linear) is above this is skipped
LEARN_CHUNK = 10_000
D2D_SIZES = (2_000, 4_000, 8_000)
D2D_QUICK = (1_000, 2_000)
D2D_BATCH, D2D_TARGET = 1_000, 100_000
D2D_CAP_S = 400.0


def _hp(algorithm: str, n: int) -> dict:
    return {"max_records": n} if ALGORITHMS[algorithm].needs_retained_data else {}


def _learn(engine, X: np.ndarray, y: np.ndarray, chunk: int = LEARN_CHUNK) -> np.ndarray:
    steps = []
    for a in range(0, len(X), chunk):
        steps.append(engine.learn(X[a : a + chunk], y[a : a + chunk], None))
    return np.concatenate(steps)


def forget_cell(algorithm: str, n: int, path: str, X: np.ndarray, y: np.ndarray, log=print) -> dict:
    """Learn n records, then time single-record forgets (median) on the given path."""
    previous = fast.set_enabled(path == "compiled")
    try:
        engine = ALGORITHMS[algorithm](spec(algorithm, D, _hp(algorithm, n)))
        t0 = time.perf_counter()
        steps = _learn(engine, X, y)
        learn_s = time.perf_counter() - t0
        alive = np.ones(n, dtype=bool)
        rng = np.random.default_rng(1)
        times: list[float] = []
        spent = 0.0
        while len(times) < (FORGETS if n < 1_000_000 else 2) and (len(times) < 1 or spent < FORGET_BUDGET_S):
            i = int(rng.choice(np.flatnonzero(alive)))
            retained = ArrayRetained(steps[alive], X[alive], y[alive])
            t = time.perf_counter()
            engine.forget([int(steps[i])], retained)
            dt = time.perf_counter() - t
            alive[i] = False
            times.append(dt)
            spent += dt
    finally:
        fast.set_enabled(previous)
    row = {"algorithm": algorithm, "n": n, "path": path, "forget_s": float(np.median(times)),
           "forgets": len(times), "learn_s": learn_s}
    log(f"  {algorithm:>8} n={n:>8} {path:>8}: forget {fmt_time(row['forget_s'])} (median of {len(times)}), "
        f"learn {fmt_time(learn_s)}")
    return row


def passive_learn_s(n: int, X: np.ndarray, y: np.ndarray) -> float:
    """The compiled passive learn of n examples (one call, the kernels loaded): the target's yardstick."""
    engine = ALGORITHMS["passive_olu"](spec("passive_olu", D, {}))
    t = time.perf_counter()
    engine.learn(X, y)
    return time.perf_counter() - t


def d2d_learn(sizes: tuple[int, ...], log=print) -> dict:
    """descent_to_delete learning n records in requests of D2D_BATCH; the store is handed over as ArrayRetained."""
    rows = []
    for n in sizes:
        X, y = stream(n, D, seed=3)
        engine = ALGORITHMS["descent_to_delete"](spec("descent_to_delete", D, _hp("descent_to_delete", n)))
        t0 = time.perf_counter()
        for a in range(0, n, D2D_BATCH):
            retained = ArrayRetained(np.arange(1, a + 1), X[:a], y[:a]) if a else None
            engine.learn(X[a : a + D2D_BATCH], y[a : a + D2D_BATCH], retained)
        s = time.perf_counter() - t0
        rows.append({"n": n, "seconds": s, "per_request_s": s / math.ceil(n / D2D_BATCH)})
        log(f"  descent_to_delete learns {n} in requests of {D2D_BATCH}: {fmt_time(s)}")
        if s > D2D_CAP_S / 4:
            break
    out: dict = {"rows": rows, "batch": D2D_BATCH, "target": D2D_TARGET}
    if len(rows) >= 2:
        (n1, s1), (n2, s2) = (rows[-2]["n"], rows[-2]["seconds"]), (rows[-1]["n"], rows[-1]["seconds"])
        k = math.log(s2 / s1) / math.log(n2 / n1)
        out.update(exponent=k, projected_s=s2 * (D2D_TARGET / n2) ** k)
    return out


def read_rate(n: int = 5_000, log=print) -> dict:
    """Per record: unwrap + decrypt of the sealed chunks the store keeps (issue 36: one key per chunk of up to
    ``capacity(d)`` records, no database), then n records read back through SqlRetained on SQLite."""
    from app.crypto import Cipher
    from app.db import retained as rs

    cipher = Cipher(bytes(range(32)))
    X, y = stream(n, D, seed=5)
    cap = rs.capacity(D)
    steps = np.arange(1, n + 1, dtype=np.int64)
    sealed = [rs.seal_chunk(cipher, "m", 0, steps[a:a + cap], X[a:a + cap], y[a:a + cap]) for a in range(0, n, cap)]
    t = time.perf_counter()
    keys = [cipher.open(k["wrapped"], rs.PURPOSE, f"m:{k['chunk_id']}") for _, k in sealed]
    unwrap = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for row, k in sealed:
        rs.open_chunk(cipher, "m", D, row["id"], 0, row["steps"], row["sealed"], k["wrapped"])
    both = (time.perf_counter() - t) / n
    out = {"n": n, "unwrap_s": unwrap, "open_s": both, "decrypt_s": both - unwrap, "keys": len(keys)}
    try:
        out["sqlite_s"] = _sqlite_read(cipher, X, y) / n
    except Exception as e:  # pragma: no cover - an older checkout's store API
        log(f"  (SqlRetained read not measured: {type(e).__name__}: {e})")
    log(f"  read: unwrap {fmt_time(unwrap)}, unwrap+decrypt {fmt_time(both)} per record"
        + (f"; SqlRetained.chunks on SQLite {fmt_time(out['sqlite_s'])} per record" if "sqlite_s" in out else ""))
    return out


def _sqlite_read(cipher, X: np.ndarray, y: np.ndarray) -> float:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from app.db import retained as rs
    from app.db.tables import Base, RetainedChunk, RetainedChunkKey

    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/r.db")
        Base.metadata.create_all(engine, tables=[RetainedChunk.__table__, RetainedChunkKey.__table__])
        with Session(engine) as s:
            store = rs.SqlRetained(s, "m", D, cipher)
            store.add(np.arange(1, len(X) + 1), X, y)
            s.commit()
            t = time.perf_counter()
            got = sum(len(steps) for steps, _, _ in store.chunks(4096))
            dt = time.perf_counter() - t
        engine.dispose()
    assert got == len(X)
    return dt


def run(quick: bool = False, log=print, sizes: tuple[int, ...] | None = None,
        paths: tuple[str, ...] = ("compiled", "fallback"), d2d: bool = True, cap_s: float = CELL_CAP_S) -> dict:
    fast.warm_up()  # the kernels loaded before anything is timed
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    res: dict = {"d": D, "forget": [], "passive_learn": {}, "capped": []}
    history: dict[tuple[str, str], tuple[int, float]] = {}
    for n in sizes:
        X, y = stream(n, D, seed=2)
        res["passive_learn"][n] = passive_learn_s(n, X, y)
        log(f"  passive_olu learns {n} (compiled): {fmt_time(res['passive_learn'][n])}")
        for algorithm in ("retrain", "sisa"):
            for path in paths:
                last = history.get((algorithm, path))
                if last is not None and (last[1] * n / last[0]) > cap_s:
                    res["capped"].append(f"{algorithm} {path} at n = {n}: projected "
                                         f"{fmt_time(last[1] * n / last[0])} > {cap_s:.0f} s")
                    log("  skipped: " + res["capped"][-1])
                    continue
                t = time.perf_counter()
                res["forget"].append(forget_cell(algorithm, n, path, X, y, log))
                history[(algorithm, path)] = (n, time.perf_counter() - t)
    if d2d:
        res["d2d"] = d2d_learn(D2D_QUICK if quick else D2D_SIZES, log)
        res["read"] = read_rate(1_000 if quick else 5_000, log)
    return res


def table(r: dict) -> list[str]:
    lines = [f"## Exact replay at scale (engine level, d = {r['d']}, one record per forget, median)",
             f"{'family':>10} {'n':>9} {'path':>9} {'forget':>10} {'learn n':>10} {'passive learn n':>16} "
             f"{'forget/passive':>15}"]
    for row in r["forget"]:
        p = r["passive_learn"].get(row["n"]) or r["passive_learn"].get(str(row["n"]))
        lines.append(f"{row['algorithm']:>10} {row['n']:>9} {row['path']:>9} {fmt_time(row['forget_s']):>10} "
                     f"{fmt_time(row['learn_s']):>10} {fmt_time(p):>16} {row['forget_s'] / p:>14.1f}x")
    for c in r.get("capped", []):
        lines.append(f"  not run: {c}")
    d = r.get("d2d")
    if d:
        lines += ["", f"descent_to_delete learning in requests of {d['batch']}:",
                  f"{'n':>9} {'time':>10} {'per request':>12}"]
        lines += [f"{row['n']:>9} {fmt_time(row['seconds']):>10} {fmt_time(row['per_request_s']):>12}"
                  for row in d["rows"]]
        if "projected_s" in d:
            lines.append(f"  growth n^{d['exponent']:.2f}; projected at {d['target']}: {fmt_time(d['projected_s'])}")
    rd = r.get("read")
    if rd:
        lines += ["", f"retained read, per record (d = {r['d']}): unwrap {fmt_time(rd['unwrap_s'])}, decrypt "
                      f"{fmt_time(rd['decrypt_s'])}, both {fmt_time(rd['open_s'])} ({1 / rd['open_s']:,.0f} "
                      "records/s)" + (f"; through SqlRetained on SQLite {fmt_time(rd['sqlite_s'])} "
                                      f"({1 / rd['sqlite_s']:,.0f} records/s)" if "sqlite_s" in rd else "")]
    return lines


def main(argv: list[str]) -> None:
    """python -m bench.performance.replay [--quick] [--sizes 10000,100000] [--paths compiled] [--no-d2d] [--json FILE]"""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m bench.performance.replay")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--paths", default="compiled,fallback")
    ap.add_argument("--no-d2d", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--cap", type=float, default=CELL_CAP_S, help="seconds a cell may be projected to take")
    a = ap.parse_args(argv)
    sizes = tuple(int(float(v)) for v in a.sizes.split(",") if v) or None
    out = run(a.quick, sizes=sizes, paths=tuple(a.paths.split(",")), d2d=not a.no_d2d, cap_s=a.cap)
    print("\n".join(table(out)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
