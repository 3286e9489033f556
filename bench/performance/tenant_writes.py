"""One tenant's writes on PostgreSQL, and the deployment-wide tenant limits (issue 37 items 6 and 5):
``python -m bench.performance.tenant_writes [--seconds 4] [--rounds 3] [--before REF]``.

**Writes** (item 6).  One uvicorn process on a fresh PostgreSQL database, every rate limit off; closed-loop clients
(one process each) learn batches of ``BATCH`` examples (d = ``D``) into their own model for ``--seconds``:

* ``one model, 8 clients``: 8 clients, 1 model (the baseline: its writes queue on the model's lock);
* ``one model, 1 client``: the same model, one request at a time;
* ``8 models, 1 tenant``: 8 clients, 8 models of one tenant (target: >= 1.5x the baseline's examples/s);
* ``8 models, 8 tenants``: 8 clients, a model each in its own tenant (what the tenant row's lock does not touch).

Then the database part of a learn alone, with each tree's own code (``_DB_SCRIPT``): threads of one process update
their model's row, add the usage delta and check the quotas, and commit; commits/s with 1 writer on one model, 8 on
8 models of one tenant, 8 on models of 8 tenants: what the tenant's lock costs once the CPU work of a learn is gone.

The cases alternate within each round; the table gives the median over rounds and the ratio to the baseline of the
same server.  ``--before REF`` runs the same against the service at git ref REF (``git archive`` into a temporary
directory, same interpreter): the usage counters on the tenant row, to compare in the same run.

**Limits** (item 5).  (a) Cost per request: the limiter alone, in this process (an HTTP request's few ms on this
machine would hide it): a tenant's requests paced at the default 200/s are admitted and released on the event loop
by the per-process limiter and by the shared one on PostgreSQL; median and mean time per admission (the mean
carries the database call made once per lease) and database calls per admitted request.  (b) Two processes on one
database, one tenant flooding both
(one closed-loop client per process) with ``RATE`` requests/s and a burst of ``RATE``: requests admitted over what one
process alone may admit (burst + rate x seconds), per process and over the deployment (target <= 1.2x).

Nothing is asserted; the machine's load moves every figure: the load average is printed with each table.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ..common import free_port, passive_model, stream, wait_for
from .ingest import _pg_database

ROOT = Path(__file__).resolve().parents[2]
D, BATCH = 16, 10
RATE = 50.0
RATE_COST = 200.0  # OLU_TENANT_RATE_LIMIT's default
LIMITS_OFF = {"OLU_RATE_LIMIT": "0", "OLU_TENANT_RATE_LIMIT": "0", "OLU_TENANT_MAX_IN_FLIGHT": "0",
              "OLU_TENANT_COMPUTE_SHARE": "0", "OLU_COMPUTE_SLOTS": "0", "OPENBLAS_NUM_THREADS": "1"}
ADMIN = "tenant-writes-admin-" + "x" * 24


class _Service:
    def __init__(self, database_url: str, data_dir: str, env: dict, root: Path = ROOT):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "OLU_DATABASE_URL": database_url, "OLU_DATA_DIR": data_dir, "OLU_ADMIN_TOKEN": ADMIN,
                "PYTHONPATH": str(root), **env}
        self.proc = subprocess.Popen(
            [os.environ.get("OLU_BENCH_PYTHON", _python()), "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
            cwd=root, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.url, self.proc)

    def tenant(self, name: str) -> str:
        r = httpx.post(self.url + "/v1/tenants", json={"name": name}, headers={"authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        return r.json()["api_key"]

    def model(self, key: str) -> str:
        r = httpx.post(self.url + "/v1/models", json=passive_model("w", D, 0.01),
                       headers={"authorization": f"Bearer {key}"}, timeout=60)
        r.raise_for_status()
        return r.json()["id"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _python() -> str:
    import sys

    return sys.executable


def _learner(args) -> tuple[int, dict[str, int]]:
    """One closed-loop client: learns of BATCH examples into its model for ``seconds``; examples learned and the
    answers other than 200, by status and problem type."""
    url, key, mid, seconds, seed, offset = args
    X, y = stream(BATCH * 400, D, seed=seed)
    n, i = 0, offset
    refused: dict[str, int] = {}
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            lo = (i * BATCH) % len(X)
            body = {"examples": [{"id": f"r{i}-{j}", "x": X[lo + j].tolist(), "y": float(y[lo + j])}
                                 for j in range(BATCH)]}
            r = c.post(f"/v1/models/{mid}/learn", json=body)
            i += 1
            if r.status_code == 200:
                n += BATCH
            else:  # e.g. a learn that met another on the same model: not counted, named in the table
                kind = f"{r.status_code} {r.json().get('type', '?').rsplit('/', 1)[-1]}"
                refused[kind] = refused.get(kind, 0) + 1
    return n, refused


class _LockWaits:
    """Samples, every 10 ms while a case runs, how many of the database's sessions wait for a lock (row locks:
    ``wait_event_type = 'Lock'``): the writes that queue behind another's lock, whatever the CPU does."""

    def __init__(self, database_url: str):
        from sqlalchemy import create_engine

        self.engine = create_engine(database_url, pool_size=1)
        self.samples: list[int] = []
        self._stop = threading.Event()

    def __enter__(self):
        from sqlalchemy import text

        def run():
            with self.engine.connect() as conn:
                while not self._stop.is_set():
                    self.samples.append(int(conn.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()")).scalar_one()))
                    conn.commit()
                    time.sleep(0.01)

        self.samples, self._thread = [], threading.Thread(target=run, daemon=True)
        self._stop.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0


def _writes(svc: _Service, seconds: float, rounds: int, pool, database_url: str) -> dict[str, tuple]:
    one_key = svc.tenant("one")
    one = [(one_key, svc.model(one_key))]
    t_key = svc.tenant("eight-models")
    tenant8 = [(t_key, svc.model(t_key)) for _ in range(8)]
    tenants8 = []
    for k in range(8):
        key = svc.tenant(f"t{k}")
        tenants8.append((key, svc.model(key)))
    cases = {"one model, 8 clients": one * 8, "one model, 1 client": one, "8 models, 1 tenant": tenant8,
             "8 models, 8 tenants": tenants8}
    rates: dict[str, list[float]] = {k: [] for k in cases}
    others: dict[str, dict[str, int]] = {k: {} for k in cases}
    waits: dict[str, list[float]] = {k: [] for k in cases}
    sampler = _LockWaits(database_url)
    for r in range(rounds):
        for c, (name, pairs) in enumerate(cases.items()):  # record ids unique per round, case and client
            args = [(svc.url, key, mid, seconds, 17 * r + j, 10_000_000 * r + 1_000_000 * c + 100_000 * j)
                    for j, (key, mid) in enumerate(pairs)]
            with sampler:
                got = pool.map(_learner, args)
            waits[name].append(sampler.mean())
            rates[name].append(sum(n for n, _ in got) / seconds)
            for _, refused in got:
                for kind, k in refused.items():
                    others[name][kind] = others[name].get(kind, 0) + k
    sampler.engine.dispose()
    return {k: (statistics.median(v), others[k], statistics.median(waits[k])) for k, v in rates.items()}


def _admit_cost(url: str, seconds: float) -> dict[str, tuple[float, float, float]]:
    """Each limiter admits and releases one tenant's requests paced at ``RATE_COST`` per second (its limit) for
    ``seconds``, on the event loop as the middleware does: (median, mean) seconds per admission, database calls per
    admitted request."""
    import asyncio

    from app.api.fairness import TenantLimiter
    from app.api.shared_limits import SharedTenantLimiter
    from app.db.migrate import upgrade_to_head
    from app.db.session import Database

    db = Database(url)
    upgrade_to_head(db.engine)
    limits = {"rate": RATE_COST, "burst": RATE_COST, "max_in_flight": 4, "compute_share": 1.0, "compute_burst": 2.0}
    limiters = {"per process": TenantLimiter(**limits),
                "over the deployment": SharedTenantLimiter(db, **limits, lease_seconds=0.05)}

    async def run(limiter) -> tuple[float, float, float]:
        times, admitted = [], 0
        start = time.monotonic()
        k = 0
        while time.monotonic() - start < seconds:
            k += 1
            t0 = time.perf_counter()
            refusal = await limiter.admit_async("ten_cost")
            times.append(time.perf_counter() - t0)
            if refusal is None:
                admitted += 1
                limiter.release("ten_cost")
            await asyncio.sleep(max(0.0, start + k / RATE_COST - time.monotonic()))
        trips = getattr(limiter, "round_trips", 0)
        if isinstance(limiter, SharedTenantLimiter):
            await limiter.close()
        return statistics.median(times), statistics.fmean(times), trips / max(1, admitted)

    out = {name: asyncio.run(run(limiter)) for name, limiter in limiters.items()}
    db.dispose()
    return out


def _flood(args) -> tuple[int, int, float]:
    url, key, seconds = args
    ok = refused = 0
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            code = c.get("/v1/tenant").status_code
            ok += code == 200
            refused += code == 429
        return ok, refused, time.monotonic() - start


def _two_processes(url: str, data: str, seconds: float, pool) -> dict[str, float]:
    out = {}
    for name, scope in (("per process", "process"), ("over the deployment", "deployment")):
        env = {**LIMITS_OFF, "OLU_TENANT_RATE_LIMIT": str(RATE), "OLU_TENANT_RATE_LIMIT_BURST": str(RATE),
               "OLU_TENANT_REFUSAL_DELAY": "0", "OLU_TENANT_LIMITS_SCOPE": scope, "OLU_AUTH_FAILURE_LIMIT": "0"}
        a = _Service(url, data, env)
        b = _Service(url, data, env)
        try:
            key = a.tenant(f"flood-{scope}")
            got = pool.map(_flood, [(a.url, key, seconds), (b.url, key, seconds)])
        finally:
            a.stop()
            b.stop()
        admitted = sum(g[0] for g in got)
        out[name] = admitted / (RATE + RATE * max(g[2] for g in got))
    return out


# the database part of a learn alone, run with a tree's own code (PYTHONPATH): the model row's update, the usage
# delta (``bump``, whatever its signature there) and the quota check (``check_locked``), committed; threads of one
# process, each on its own model, for SECONDS; prints the commits per second of each case as JSON
_DB_SCRIPT = r"""
import inspect, json, sys, threading, time
from datetime import datetime, timezone
from sqlalchemy import text
from app.config import Settings
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.services import quotas as q

url, seconds = sys.argv[1], float(sys.argv[2])
db = Database(url)
upgrade_to_head(db.engine)
quotas = q.Quotas(db, Settings())
with_model = "model_id" in inspect.signature(q.bump).parameters
with db.engine.begin() as c:
    c.execute(text("CREATE TABLE bench_models (id text PRIMARY KEY, n bigint NOT NULL)"))
    for t in range(9):
        c.execute(text("INSERT INTO tenants (id, name, record_key, log_size, created_at) "
                       "VALUES (:t, 'b', :k, 0, :now)"),
                  {"t": f"ten_{t}", "k": b"k", "now": datetime.now(timezone.utc)})
    for m in range(24):
        c.execute(text("INSERT INTO bench_models (id, n) VALUES (:m, 0)"), {"m": f"mdl_{m}"})

def writer(tid, mid, stop, out):
    n = 0
    while not stop.is_set():
        with db.write() as s:
            s.execute(text("UPDATE bench_models SET n = n + 1 WHERE id = :m"), {"m": mid})
            if with_model:
                q.bump(s, tid, mid, records=1, stored=48)
            else:
                q.bump(s, tid, records=1, stored=48)
            quotas.check_locked(s, tid, {"records": 1, "bytes": 48})
        n += 1
    out.append(n)

cases = {"one model, 1 writer": [("ten_8", "mdl_16")],
         "8 models, 1 tenant": [("ten_0", f"mdl_{m}") for m in range(8)],
         "8 models, 8 tenants": [(f"ten_{m}", f"mdl_{8 + m}") for m in range(8)]}
rates = {k: [] for k in cases}
for _ in range(3):
    for name, pairs in cases.items():
        stop, out = threading.Event(), []
        threads = [threading.Thread(target=writer, args=(t, m, stop, out)) for t, m in pairs]
        for th in threads:
            th.start()
        time.sleep(seconds)
        stop.set()
        for th in threads:
            th.join()
        rates[name].append(sum(out) / seconds)
db.dispose()
print(json.dumps(rates))
"""


def _db_writes(root: Path, seconds: float) -> dict[str, float]:
    import json

    url, drop = _pg_database()
    if url is None:
        raise SystemExit(drop)
    try:
        done = subprocess.run([_python(), "-c", _DB_SCRIPT, url, str(seconds)], cwd=root, capture_output=True,
                              check=False, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=600)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        rates = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        drop()
    return {k: statistics.median(v) for k, v in rates.items()}


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", default=None, help="a git ref whose service to measure too (e.g. main)")
    p.add_argument("--skip-limits", action="store_true")
    p.add_argument("--skip-writes", action="store_true")
    args = p.parse_args()
    pool = mp.get_context("fork").Pool(8)
    trees = [("this tree", ROOT)]
    tmp = tempfile.TemporaryDirectory()
    if args.before:
        before = Path(tmp.name) / "before"
        before.mkdir()
        subprocess.run(f"git archive {args.before} | tar -x -C {before}", shell=True, cwd=ROOT, check=True)
        trees.append((f"before ({args.before})", before))
    print(f"# tenant_writes: commit {_commit(ROOT)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, batches of {BATCH} examples at d = {D}, {args.seconds:g} s x {args.rounds} rounds")
    for label, root in [] if args.skip_writes else trees:
        url, drop = _pg_database()
        if url is None:
            raise SystemExit(drop)
        try:
            svc = _Service(url, str(Path(tmp.name) / f"data-{label[:4]}"), LIMITS_OFF, root=root)
            try:
                got = _writes(svc, args.seconds, args.rounds, pool, url)
            finally:
                svc.stop()
        finally:
            drop()
        base = got["one model, 8 clients"][0]
        print(f"\n## One tenant's writes on PostgreSQL: {label} (load {_load()})")
        print("| clients and models | examples/s (median) | vs one model, 8 clients | sessions waiting for a lock "
              "(mean) | answers other than 200 |\n|---|---:|---:|---:|---|")
        for name, (v, refused, wait) in got.items():
            print(f"| {name} | {v:,.0f} | {v / base:.2f}x | {wait:.2f} | "
                  f"{', '.join(f'{k}: {n}' for k, n in refused.items())} |")
    if not args.skip_writes:
        got = {label: _db_writes(root, args.seconds) for label, root in trees}
        print(f"\n## The database part of a learn alone (model row, usage delta, quota check, commit; threads of one "
              f"process, medians of 3 rounds; load {_load()})")
        print("| writers | " + " | ".join(f"{label}: commits/s | vs one model" for label in got) + " |\n|---|"
              + "---:|---:|" * len(got))
        for name in next(iter(got.values())):
            print(f"| {name} | " + " | ".join(f"{v[name]:,.0f} | {v[name] / v['one model, 1 writer']:.2f}x"
                                              for v in got.values()) + " |")
    if not args.skip_limits:
        url, drop = _pg_database()
        try:
            data = str(Path(tmp.name) / "data-limits")
            cost = _admit_cost(url, max(args.seconds, 5.0))
            print(f"\n## Cost of the tenant limits per request: admit + release on the event loop, {RATE_COST:g} "
                  f"requests/s paced at the limit (load {_load()})")
            print("| tenant limits | median per request | mean per request | database calls per request |\n"
                  "|---|---:|---:|---:|")
            for name, (median, mean, trips) in cost.items():
                print(f"| {name} | {median * 1e6:.1f} us | {mean * 1e6:.1f} us | {trips:.3f} |")
            two = _two_processes(url, data, max(args.seconds, 5.0), pool)
            print(f"\n## Two processes, one tenant flooding both, {RATE:g} requests/s, burst {RATE:g} (load {_load()})")
            print("| scope | admitted / (burst + rate x seconds) |\n|---|---:|")
            for name, v in two.items():
                print(f"| {name} | {v:.2f}x |")
        finally:
            drop()
    pool.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
