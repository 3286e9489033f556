"""Engine cost at scale, every family (issue 32 item 3): ``python -m bench --sections scale_n``.

Engine level, d = 32, logistic (exact_ridge: its classifier loss), the synthetic rule of ``bench.common.stream``
generated in chunks of 10^6 rows (one n x d float64 array for the largest n: 2.5 GB at 10^7; the smaller streams
are its prefixes), every family of ``app.unlearning.ALGORITHMS`` with its defaults and the production noise source.
For each family and n = 10^4, 10^5, 10^6, 10^7:

* **learn**: a fresh engine (``max_records = n`` where it keeps records, so ``sisa`` takes its default shards for
  n) learns the n records in requests of 10 000 (rewind_to_delete: one request, its ``initial_size = n``), the
  data-holding families handed the records held so far as the service does (a view, no copy); reported per example.
* **forget**: the median of up to ``FORGETS`` single-record forgets (``CHEAP_FORGETS`` where they are cheap) of records drawn uniformly from the stream
  (fewer once they have taken ``FORGET_BUDGET_S``), each handed the records still held (the copy is not timed).
* **memory**: the state blob (``pack_state(engine.state())``, the secret-state row) per record, the retained
  examples' bytes per record where the family keeps them (steps, x, y as float64), and the growth of the process's
  resident set (VmRSS) across the learn, per record (the stream itself is allocated before).
* **accuracy at 10^6**: held-out accuracy (20 000 records of the same rule) after learning, after forgetting 10
  records (the timed forgets and one request for the rest) and after forgetting 100 (one more request); the
  ``retrain`` row is the exact retrain's accuracy.

Cap (per family): a size whose projected cell time (learn + forgets; the last cell extrapolated with the growth
exponent of the last two, at least linear, ``bench.common.projected_time``) is above ``CAP_S`` is not run, nor any
larger; a learn that passes ``CAP_S`` while running is stopped there.  Both are listed under ``capped`` with the
reason.  Beside the engine: the retained-example read rate on its own (``bench.replay.read_rate``: unwrap and
decrypt per record, and ``SqlRetained`` on SQLite) and the database bytes per record (``bench.memory.db_bytes``:
the service learning into a fresh SQLite database, every table with its indexes, plus a bare ``SqlRetained`` store
of n sealed records: the SQLite file size per record).

``python -m bench.performance.scale_n --from-json FILE --docs`` rewrites the generated part of docs/performance.md from a saved
result without measuring.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from app.db.state_codec import pack_state
from app.unlearning import ALGORITHMS, ArrayRetained, CapacityExhausted
from app.unlearning.mechanism import fast, fast_dgauss

from ..common import fmt_time, machine, projected_time, spec
from .scale_n_docs import (ACC_AT, BEGIN, END, N_TEST, ROOT, TARGETS_BEGIN, TARGETS_END,  # noqa: F401 (the API)
                           plot, ratios, table, target_rows, write_docs)

D = 32
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (2_000, 20_000)
CAP_S = 60.0           # per (family, n) cell: learn + forgets, projected or while learning
FORGETS = 3
FORGET_BUDGET_S = 30.0
CHEAP_FORGETS = 9      # more forgets where they are cheap: their median over up to this many (below the 10 of the
CHEAP_BUDGET_S = 0.5   # accuracy step at ACC_AT, which forgets up to 10, then 100, in all)
CHUNK = 10_000
GEN_CHUNK = 1_000_000


MAX_DELETIONS = 128    # restart / dp tree: room for the 100 accuracy forgets and the timed ones


def _hp(algorithm: str, n: int) -> dict:
    cls = ALGORITHMS[algorithm]
    hp: dict = {"max_records": n} if cls.needs_retained_data else {}
    if algorithm == "rewind_to_delete":
        hp["initial_size"] = max(2, n)
    if algorithm in ("passive_olu_restart", "online_dp_tree"):
        hp.update(max_deletions=MAX_DELETIONS, horizon=max(2, n))
    return hp


def chunked_stream(n: int, d: int, seed: int = 7, n_test: int = N_TEST):
    """The rule of bench.common.stream (unit-ball rows, labels of a noisy linear rule), generated GEN_CHUNK rows at
    a time into one array; the first n_test rows of an extra chunk are the held-out set."""
    w = np.random.default_rng([seed, 0]).standard_normal(d)
    X = np.empty((n + n_test, d))
    y = np.empty(n + n_test)
    for k, a in enumerate(range(0, n + n_test, GEN_CHUNK)):
        b = min(n + n_test, a + GEN_CHUNK)
        rng = np.random.default_rng([seed, k + 1])
        Xc = rng.standard_normal((b - a, d))
        Xc *= 0.95 / np.maximum(1.0, np.linalg.norm(Xc, axis=1, keepdims=True))
        X[a:b] = Xc
        y[a:b] = (Xc @ w + 0.3 * rng.standard_normal(b - a) > 0).astype(np.float64)
    return X[:n], y[:n], X[n:], y[n:]


_STEPS = np.zeros(0, dtype=np.int64)


def _view(n: int, X: np.ndarray, y: np.ndarray) -> ArrayRetained:
    """The first n records as a RetainedData without a copy (steps 1..n are already in order; the steps are a
    slice of one array, so handing the store over costs nothing, as the service's lazy SqlRetained does not)."""
    global _STEPS
    if len(_STEPS) < n:
        _STEPS = np.arange(1, max(n, 2 * len(_STEPS)) + 1, dtype=np.int64)
    r = ArrayRetained.__new__(ArrayRetained)
    r.steps, r.X, r.y = _STEPS[:n], X[:n], y[:n]
    return r


def _held(held: np.ndarray, X: np.ndarray, y: np.ndarray) -> ArrayRetained:
    if held.all():
        return _view(len(held), X, y)
    r = ArrayRetained.__new__(ArrayRetained)
    idx = np.flatnonzero(held)
    r.steps, r.X, r.y = idx.astype(np.int64) + 1, X[idx], y[idx]
    return r


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _accuracy(engine, Xt: np.ndarray, yt: np.ndarray) -> float:
    return float(np.mean(np.asarray(engine.predict(Xt)[0], dtype=np.float64) == yt))


def cell(algorithm: str, n: int, X: np.ndarray, y: np.ndarray, Xt, yt, cap_s: float, log=print) -> dict:
    cls = ALGORITHMS[algorithm]
    keeps = cls.needs_retained_data
    s = spec(algorithm, D, _hp(algorithm, n))
    engine = cls(s)
    chunk = n if algorithm == "rewind_to_delete" else CHUNK
    r0 = rss()
    c0 = time.process_time()
    t0 = time.perf_counter()
    learned = 0
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        engine.learn(X[a:b], y[a:b], _view(a, X, y) if keeps else None)
        learned = min(n, a + chunk)
        if time.perf_counter() - t0 > cap_s and learned < n:
            break
    learn_s = time.perf_counter() - t0
    learn_cpu_s = time.process_time() - c0
    row: dict = {"n": n, "learned": learned, "learn_s": learn_s, "learn_per_example_s": learn_s / learned,
                 "learn_cpu_s": learn_cpu_s, "learn_cpu_per_example_s": learn_cpu_s / learned,
                 "rss_growth_per_record": (rss() - r0) / learned}
    if "shards" in s.hyperparameters:
        row["shards"] = s.hyperparameters["shards"]
    if learned < n:
        row["stopped"] = f"learning passed the cap of {cap_s:.0f} s after {learned} of {n} records"
        log(f"  {algorithm:>20} n={n:>9}: {row['stopped']}")
        return row
    row["state_bytes_per_record"] = len(pack_state(engine.state())) / n
    row["retained_bytes_per_record"] = 8.0 * (D + 2) if keeps else 0.0
    held = np.ones(n, dtype=bool)
    rng = np.random.default_rng(n)
    times, mechs = [], set()
    acc: dict = {}
    if n == ACC_AT:
        acc["before"] = _accuracy(engine, Xt, yt)

    def forget(idx: np.ndarray) -> float:
        retained = _held(held, X, y) if keeps else None
        if getattr(engine, "needs_deletion_features", False) and not keeps:  # the client resends the examples
            retained = ArrayRetained(idx + 1, X[idx], y[idx])
        t = time.perf_counter()
        certs = engine.forget([int(i) + 1 for i in idx], retained)
        dt = time.perf_counter() - t
        mechs.update(c.mechanism for c in certs)
        held[idx] = False
        return dt

    try:
        # at least FORGETS (within the budget); a cheap family's median is taken over up to CHEAP_FORGETS, so that one
        # slow first call does not make it (exact_ridge's ~30 us forget read 122 us as the median of 3 under load; sisa's
        # cost depends on where the record sits in its shard)
        while ((len(times) < FORGETS and (not times or sum(times) < FORGET_BUDGET_S))
               or (len(times) < CHEAP_FORGETS and sum(times) < CHEAP_BUDGET_S)):
            times.append(forget(np.array([rng.choice(np.flatnonzero(held) if not held.all() else n)])))
        if n == ACC_AT:
            for total in (10, 100):
                more = total - int((~held).sum())
                forget(np.sort(rng.choice(np.flatnonzero(held), size=more, replace=False)))
                acc[f"after_{total}"] = _accuracy(engine, Xt, yt)
    except CapacityExhausted as e:
        row["capacity"] = str(e)
    row.update(forget_s=float(np.median(times)) if times else None, forgets=len(times),
               mechanism="/".join(sorted(mechs)) or None)
    if acc:
        row["accuracy"] = acc
    log(f"  {algorithm:>20} n={n:>9}: learn {row['learn_per_example_s'] * 1e6:.2f} us/example "
        f"({fmt_time(learn_s)}; CPU {row['learn_cpu_per_example_s'] * 1e6:.2f} us/example), forget {fmt_time(row['forget_s'])} (median of {len(times)})"
        + (f", accuracy {acc}" if acc else ""), flush=True)
    return row


def sealed_store_bytes(n: int) -> dict:
    """SQLite file bytes per record of a bare SqlRetained store holding n sealed records (d = 32)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from app.crypto import Cipher
    from app.db import retained as rs
    from app.db.tables import Base, RetainedChunk, RetainedChunkKey

    X, y, _, _ = chunked_stream(n, D, seed=9, n_test=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.db"
        engine = create_engine(f"sqlite:///{path}")
        Base.metadata.create_all(engine, tables=[RetainedChunk.__table__, RetainedChunkKey.__table__])
        with engine.connect() as c:
            c.exec_driver_sql("VACUUM")
        empty = path.stat().st_size
        with Session(engine) as s:
            store = rs.SqlRetained(s, "m", D, Cipher(bytes(range(32))))
            for a in range(0, n, 10_000):
                store.add(np.arange(a + 1, min(n, a + 10_000) + 1), X[a:a + 10_000], y[a:a + 10_000])
            s.commit()
        with engine.connect() as c:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        engine.dispose()
        return {"n": n, "bytes_per_record": (path.stat().st_size - empty) / n, "raw_bytes_per_record": 8.0 * (D + 1)}


def service_db_bytes(n: int, families: tuple[str, ...] = ("passive_olu", "retrain")) -> dict:
    """The service (in process, no HTTP) learns n records in requests of 1 000 into a fresh SQLite database: bytes
    of every table with its indexes (``bench.memory._db_bytes``, dbstat) per record.  passive_olu keeps no
    records (deletion log, commitments); retrain keeps them sealed (the retained-example rows on top)."""
    from app.config import Settings
    from app.main import create_app

    from .memory import _db_bytes

    out: dict = {"n": n, "d": D, "backends": {"sqlite": {}}}
    X, y, _, _ = chunked_stream(n, D, seed=12, n_test=0)
    for algorithm in families:
        tmp = tempfile.mkdtemp(prefix="olu-scale-n-")
        ctx = create_app(Settings(data_dir=Path(tmp))).state.ctx
        try:
            t = ctx.tenants.create_tenant("mem")
            m = ctx.models.create(t["id"], {"name": "m", "algorithm": algorithm, "loss": "logistic", "dim": D,
                                            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0,
                                            "l2": 0.01, "privacy": {"epsilon": 1.0, "delta": 1e-6},
                                            "hyperparameters": {}})
            before = _db_bytes(ctx.db)
            for i in range(0, n, 1000):
                ctx.models.learn(t["id"], m["id"], [f"record-{j:08d}" for j in range(i, min(n, i + 1000))],
                                 X[i:i + 1000], y[i:i + 1000])
            after = _db_bytes(ctx.db)
            per = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after
                   if after.get(k, 0) - before.get(k, 0) > 0}
            out["backends"]["sqlite"][algorithm] = {"per_example_bytes": per, "total_per_example": sum(per.values())}
        except Exception as e:  # noqa: BLE001 - reported in the table
            out.setdefault("errors", {})[algorithm] = f"{type(e).__name__}: {e}"
        finally:
            ctx.db.dispose()
    return out


def _commit() -> str:
    """HEAD's short hash, with "+changes" when tracked files differ from it."""
    try:
        def git(*a: str) -> str:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=10,
                                  check=False).stdout
        head = git("rev-parse", "--short", "HEAD").strip() or "?"
        return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no").strip() else "")
    except Exception:  # noqa: BLE001
        return "?"


def run(quick: bool = False, log=print, sizes: tuple[int, ...] | None = None, families: list[str] | None = None,
        cap_s: float | None = None) -> dict:
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    cap_s = cap_s or (10.0 if quick else CAP_S)
    fast.warm_up()
    fast_dgauss.warm_up()
    res: dict = {"d": D, "sizes": list(sizes), "cap_seconds": cap_s, "machine": machine(), "commit": _commit(),
                 "families": {}}
    X_all, y_all, Xt, yt = chunked_stream(max(sizes), D)
    for algorithm in ALGORITHMS:
        if families and algorithm not in families:
            continue
        rows, capped, history = [], None, []
        for n in sizes:
            projected = projected_time(history, n)
            if projected > cap_s:
                capped = f"n = {n} not run: projected {fmt_time(projected)} > cap {cap_s:.0f} s"
                log(f"  {algorithm:>20} {capped}")
                break
            try:
                row = cell(algorithm, n, X_all, y_all, Xt, yt, cap_s, log)
            except Exception as e:  # noqa: BLE001 - reported in the table, the other families still run
                row = {"n": n, "stopped": f"failed: {type(e).__name__}: {e}", "learned": 0}
                log(f"  {algorithm:>20} n={n:>9}: {row['stopped']}")
            rows.append(row)
            if "stopped" in row:
                capped = f"n = {n}: {row['stopped']}"
                break
            history.append((n, row["learn_s"] + (row["forget_s"] or 0.0) * row["forgets"]))
        res["families"][algorithm] = {"rows": rows, "capped": capped}
    del X_all, y_all
    from . import replay

    res["read"] = replay.read_rate(1_000 if quick else 5_000, log)
    res["sealed_store"] = sealed_store_bytes(2_000 if quick else 20_000)
    res["database"] = service_db_bytes(1_000 if quick else 10_000)
    res["ratios"] = ratios(res)
    return res


def main(argv: list[str]) -> None:
    """python -m bench.performance.scale_n [--quick] [--sizes 1e4,1e5] [--families a,b] [--cap S] [--json FILE]
    [--from-json FILE] [--docs]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.performance.scale_n")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--families", default="")
    ap.add_argument("--cap", type=float, default=0.0)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "scale_n.json"))
    ap.add_argument("--from-json", default="", help="render a saved result (this module's JSON, or python -m "
                    "bench's results.json) instead of measuring")
    ap.add_argument("--docs", action="store_true", help="rewrite the generated part of docs/performance.md")
    a = ap.parse_args(argv)
    if a.from_json:
        out = json.loads(Path(a.from_json).read_text())
        out = out.get("scale_n", out)  # python -m bench's results.json holds the section under its name
    else:
        sizes = tuple(int(float(v)) for v in a.sizes.split(",") if v) or None
        fams = [f for f in a.families.split(",") if f] or None
        out = run(a.quick, sizes=sizes, families=fams, cap_s=a.cap or None)
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print("\n".join(table(out)))
    if a.docs:
        print(f"wrote {write_docs(out)}")


if __name__ == "__main__":
    main(sys.argv[1:])
