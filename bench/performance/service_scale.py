"""Section ``service_scale`` (issue 36 item 6): the service at 10^5-10^7 records through HTTP, beside the engine.

``python -m bench --sections service_scale [--sizes 100000,1000000] [--backends sqlite,postgresql] [--quick]``, or
``python -m bench.performance.service_scale [--sizes ...] [--backends ...] [--json PATH]`` (the JSON is rewritten
after every (backend, size) cell, so a run stopped part way keeps what it measured).

Per database and size n: one service process (``python -m uvicorn app.main:app``, the default settings but for the
admin token; SQLite in a fresh data directory, or a fresh PostgreSQL database created and dropped), one tenant per
model, d = 32: ``sisa`` (default shards) and ``retrain`` with ``max_records`` = n, ``exact_ridge`` (loss squared,
keeps no data: its forgets resend the record) and ``passive_olu`` (the floor).  Each learns the same n records in
msgpack batches of 10^4, the models in turn batch by batch (a change of load on the shared machine hits all alike):
its ingest is n / the sum of its request times.  Then ``forgets`` single-record forgets drawn uniformly, one request
at a time, the models in turn: p50 and p99 (nearest rank: with 21 forgets the p99 is the slowest).

Beside them, in this process, the engine of each model's spec (read back from the service: its filled-in
hyperparameters) learns the same records in the same batches (timed: its ingest) and forgets the same records
(``ArrayRetained``: the records still held, or the forgotten record alone for a family that is handed its features):
p50 and p99.  Targets (issue 36 item 2, checked on every backend and size): a forget through HTTP <= 2 x (the
engine's forget + the HTTP forget floor, passive_olu's forget through HTTP) for sisa and retrain; sisa's ingest
>= 0.5 x passive_olu's.

Families that keep the data (sisa, retrain) run up to ``retained_cap`` records (default 10^6: at 10^7 the engine
side alone holds 2.6 GB of records and copies them per forget, and the SQLite file grows by ~3 GB per model); above
it only exact_ridge and passive_olu run, and the table says so (``--families sisa,exact_ridge,passive_olu
--retained-cap 10000000`` runs sisa at 10^7).  ``cap_s`` (``--cap-s``) stops a cell's learning after the round that
passes that many seconds: the cell's forgets and its engine then work on the records learned, and the table names
where it stopped (docs/performance.md §17: where a 2-core run stops).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, text

from app.unlearning import engine_class

from ..common import machine, stream
from .ingest import _pg_database
from .service_store import TARGET_FORGET, TARGET_INGEST, create, engine_run, engine_spec, learn_all, \
    start_service, tenant_client

D = 32
BATCH = 10_000
FORGETS = 21
SIZES = (100_000, 1_000_000)
QUICK = {"sizes": (3_000,), "batch": 1_000, "forgets": 5}
FAMILIES = ("sisa", "retrain", "exact_ridge", "passive_olu")
SIZED = {"sisa", "retrain"}  # keep the data: max_records = n, run up to the retained cap
RETAINED_CAP = 1_000_000
FLOOR = "passive_olu"


def model_body(algorithm: str, n: int) -> dict:
    hp = {"max_records": n} if algorithm in SIZED else {}
    return {"name": f"{algorithm}-{n}", "algorithm": algorithm,
            "loss": "squared" if algorithm == "exact_ridge" else "logistic", "dim": D,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.01,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": hp}


def p99(times: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    s = sorted(times)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def resends(view: dict) -> bool:
    """Whether the model forgets the features the client resends (its engine's attribute, as the service reads it)."""
    spec = engine_spec(view)
    return bool(getattr(engine_class(spec.algorithm)(spec), "needs_deletion_features", False))


def unlearn_body(resend: bool, i: int, X: np.ndarray, y: np.ndarray) -> dict:
    """By id, or with the record's features and label for a model that forgets what the client resends."""
    if not resend:
        return {"ids": [f"r{i}"]}
    return {"ids": [f"r{i}"], "examples": [{"id": f"r{i}", "x": X[i].tolist(), "y": float(y[i])}]}


def http_forgets(targets, views, picks, X, y) -> list[list[float]]:
    out: list[list[float]] = [[] for _ in targets]
    resend = [resends(v) for v in views]
    for i in picks:
        for j, ((c, mid), view) in enumerate(zip(targets, views)):
            payload = unlearn_body(resend[j], i, X, y)
            t0 = time.perf_counter()
            r = c.post(f"/v1/models/{mid}/unlearn", json=payload)
            out[j].append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"unlearn {view['algorithm']}: {r.status_code} {r.text[:400]}")
    return out


def database_bytes(data_dir: str, pg_url: str | None) -> int:
    if pg_url is None:
        return sum(f.stat().st_size for f in Path(data_dir).glob("olu.db*"))
    eng = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with eng.connect() as c:
            return int(c.execute(text("SELECT pg_database_size(current_database())")).scalar())
    finally:
        eng.dispose()


def cell(backend: str, n: int, families: tuple[str, ...], batch: int, forgets: int, cap_s: float | None = None,
         log=print, server_env: dict | None = None) -> dict:
    """One database and size: every family through HTTP (learning stopped by ``cap_s``: the rest of the cell, the
    engine included, then works on the records learned), then the engine of each."""
    X, y = stream(n, D, seed=36)
    pg_url, drop = (None, None)
    if backend == "postgresql":
        pg_url, drop = _pg_database()
        if pg_url is None:
            return {"backend": backend, "n": n, "skipped": drop}
    t_cell = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        srv, admin = start_service(tmp, {**(server_env or {}), **({"OLU_DATABASE_URL": pg_url} if pg_url else {})})
        try:
            clients = [tenant_client(srv.url, admin) for _ in families]
            views = [create(c, model_body(a, n)) for c, a in zip(clients, families)]
            targets = [(c, v["id"]) for c, v in zip(clients, views)]
            log(f"[{backend} n={n:,}] created: " + "; ".join(f"{v['algorithm']} {v['hyperparameters']}"
                                                          for v in views))
            spent, learned = learn_all(targets, X, y, batch, cap_s=cap_s, log=lambda s: log(f"[{backend} n={n:,}]{s}"))
            X, y = X[:learned], y[:learned]
            picks = [int(i) for i in np.random.default_rng(36).choice(learned, size=forgets, replace=False)]
            http = http_forgets(targets, views, picks, X, y)
            db_bytes = database_bytes(tmp, pg_url)
            for c in clients:
                c.close()
        finally:
            srv.stop()
            if drop is not None:
                drop()
    http_s = time.perf_counter() - t_cell
    log(f"[{backend} n={n:,}] HTTP done in {http_s:.0f} s; engine ...")
    rows = {}
    for a, v, s, t in zip(families, views, spent, http):
        eng = engine_run(v, X, y, picks, batch)
        rows[a] = {"hyperparameters": v["hyperparameters"], "http_ingest_per_s": learned / s,
                   "http_forget_p50_s": statistics.median(t), "http_forget_p99_s": p99(t), "http_forget_s": t,
                   "engine_ingest_per_s": eng["ingest_per_s"], "engine_forget_p50_s": statistics.median(eng["forget_s"]),
                   "engine_forget_p99_s": p99(eng["forget_s"]), "engine_forget_s": eng["forget_s"]}
    floor = rows[FLOOR]["http_forget_p50_s"]
    for a, row in rows.items():
        if a != FLOOR:
            row["forget_vs_engine_plus_floor"] = row["http_forget_p50_s"] / (row["engine_forget_p50_s"] + floor)
            row["ingest_vs_floor"] = row["http_ingest_per_s"] / rows[FLOOR]["http_ingest_per_s"]
    return {"backend": backend, "n": n, "learned": learned, "d": D, "batch": batch, "forgets": forgets, "families": rows,
            "db_bytes": db_bytes, "seconds": time.perf_counter() - t_cell, "machine": machine()}


def targets(r: dict) -> list[dict]:
    """Issue 36 item 2's targets in every cell that has sisa / retrain."""
    out = []
    for c in r["cells"]:
        fams = c.get("families", {})
        for a in ("sisa", "retrain"):
            if a in fams:
                v = fams[a]["forget_vs_engine_plus_floor"]
                out.append({"backend": c["backend"], "n": c["n"], "target": f"{a} forget HTTP / (engine + floor)",
                            "goal": f"<= {TARGET_FORGET}", "measured": v, "met": v <= TARGET_FORGET})
        if "sisa" in fams:
            v = fams["sisa"]["ingest_vs_floor"]
            out.append({"backend": c["backend"], "n": c["n"], "target": "sisa ingest / passive_olu ingest (HTTP)",
                        "goal": f">= {TARGET_INGEST}", "measured": v, "met": v >= TARGET_INGEST})
    return out


def run(quick: bool = False, backends=("sqlite", "postgresql"), sizes=None, forgets: int | None = None,
        batch: int | None = None, retained_cap: int = RETAINED_CAP, families=FAMILIES, json_path: Path | None = None,
        cap_s: float | None = None, log=print, server_env: dict | None = None) -> dict:
    """``server_env``: settings for the service beyond the defaults (named in the result and the table)."""
    sizes = tuple(sizes or (QUICK["sizes"] if quick else SIZES))
    batch = batch or (QUICK["batch"] if quick else BATCH)
    forgets = forgets or (QUICK["forgets"] if quick else FORGETS)
    r = {"d": D, "batch": batch, "forgets": forgets, "retained_cap": retained_cap, "cap_s": cap_s, "sizes": list(sizes),
         "server_env": dict(server_env or {}),
         "backends": list(backends), "machine": machine(), "cells": []}
    for n in sizes:
        fams = tuple(a for a in families if a not in SIZED or n <= retained_cap)
        if FLOOR not in fams:
            fams += (FLOOR,)
        for backend in backends:
            r["cells"].append(cell(backend, n, fams, batch, forgets, cap_s, log, server_env))
            if n > retained_cap:
                r["cells"][-1]["capped"] = sorted(set(families) & SIZED)
            r["targets"] = targets(r)
            if json_path is not None:
                json_path.write_text(json.dumps(r, indent=1, default=str) + "\n")
    r["targets"] = targets(r)
    return r


def _ms(v: float) -> str:
    return f"{v * 1e3:.3f}" if v < 1e-3 else f"{v * 1e3:,.1f}" if v < 10 else f"{v:,.1f} s"


def table(r: dict) -> list[str]:
    m = r["machine"]
    lines = [f"## Service at scale through HTTP vs the engine (d = {r['d']}, msgpack batches of {r['batch']:,}, "
             f"{r['forgets']} single-record forgets; {m['date_utc']} UTC, {m['nproc']} cores, load "
             f"{' '.join(f'{x:.1f}' for x in m['load_avg'])})",
             *([f"Settings beyond the defaults: {', '.join(f'{k}={v}' for k, v in r['server_env'].items())}"]
               if r.get("server_env") else []),
             "| database | n | model | ingest HTTP (records/s) | ingest engine | forget p50 / p99 HTTP (ms) | "
             "forget p50 / p99 engine (ms) | HTTP / (engine + floor) | HTTP ingest / floor's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in r["cells"]:
        if "skipped" in c:
            lines.append(f"| {c['backend']} | {c['n']:,} | (not run: {c['skipped']}) | | | | | | |")
            continue
        size = f"{c['n']:,}" if c.get("learned", c["n"]) == c["n"] else f"{c['learned']:,} of {c['n']:,}"
        for a, row in c["families"].items():
            ratio = row.get("forget_vs_engine_plus_floor")
            lines.append(
                f"| {c['backend']} | {size} | {a} | {row['http_ingest_per_s']:,.0f} | "
                f"{row['engine_ingest_per_s']:,.0f} | {_ms(row['http_forget_p50_s'])} / {_ms(row['http_forget_p99_s'])} | "
                f"{_ms(row['engine_forget_p50_s'])} / {_ms(row['engine_forget_p99_s'])} | "
                + ("(the floor)" if ratio is None else f"{ratio:.2f}") + " | "
                + ("1" if a == FLOOR else f"{row['ingest_vs_floor']:.2f}") + " |")
        extra = f"; sisa/retrain not run above the cap of {r['retained_cap']:,}" if c.get("capped") else ""
        if c.get("learned", c["n"]) < c["n"]:
            extra += f"; learning stopped by the {r['cap_s']:.0f} s cap at {c['learned']:,} records (all figures at that n)"
        lines.append(f"| {c['backend']} | {c['n']:,} | database {c['db_bytes'] / 1e6:,.0f} MB, cell "
                     f"{c['seconds']:.0f} s, load {' '.join(f'{x:.1f}' for x in c['machine']['load_avg'])}{extra} "
                     "| | | | | | |")
    for t in r.get("targets", []):
        mark = "MET" if t["met"] else "MISSED"
        lines.append(f"  [{mark:>6}] {t['backend']} n={t['n']:,}: {t['target']} {t['goal']}: {t['measured']:.2f}")
    return lines


def main() -> None:  # pragma: no cover - a measurement
    ap = argparse.ArgumentParser(prog="python -m bench.performance.service_scale")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--forgets", type=int, default=FORGETS)
    ap.add_argument("--retained-cap", type=int, default=RETAINED_CAP)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--cap-s", type=float, default=None, help="stop a cell's learning after this many seconds")
    ap.add_argument("--env", action="append", default=[], metavar="OLU_NAME=VALUE",
                    help="a service setting beyond the defaults (repeatable; named in the table)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    r = run(a.quick, tuple(a.backends.split(",")), tuple(int(float(s)) for s in a.sizes.split(",")),
            a.forgets, None, a.retained_cap, tuple(a.families.split(",")), a.json, a.cap_s,
            log=lambda s: print(s, flush=True), server_env=dict(e.split("=", 1) for e in a.env))
    print("\n".join(table(r)))


if __name__ == "__main__":  # pragma: no cover
    main()
