"""The production topology of compose.yaml, started as local processes and killed under load (issue 23).

``test_compose_static_rules`` checks the compose file itself (no secret literal, sizes configurable, healthchecks
on /healthz, routing on /readyz).  ``test_cluster_survives_sigkills`` reads compose.yaml and starts what it
describes for ``migrate``, ``api`` (3 replicas) and ``consumer`` (2 workers) as local processes on a throwaway
PostgreSQL database and the local NATS JetStream server (a stream of its own per run); a round robin in the test
stands in for the nginx proxy.  HTTP clients and a broker producer send learns, forgets, predicts and audits to the
same models at once while replicas and consumers are killed with SIGKILL and restarted; then ``check`` (in
tests/cluster_harness.py) verifies that no acknowledged write was lost, no receipt is duplicated, each model's
steps have no gaps, the tenant's transparency log is consistent as every replica saw it (consistency proofs between
checkpoints verify offline) and the ledger's rho is the sum over the receipts; corrupted copies of the collected
data show that each check can fail.

Short profile by default (CI); the long one: ``python -m tests.test_cluster --long`` (or OLU_CLUSTER_PROFILE=long).
"""
from __future__ import annotations

import copy
import os
import random
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from .cluster_harness import (ComposeProc, EventProducer, HttpDriver, MissingVariable, RoundRobin, check,
                              compose_service, interpolate, load_compose, local_argv, local_env, signing_seed)
from .conftest import ADMIN_TOKEN
from .helpers import all_receipts, create_model, unit_rows
from .test_stream import Broker, _nats_up

PROFILES = {  # kills, HTTP client threads, models, seconds between events (mean) and between an HTTP client's
    # rounds, seconds between kills
    "short": dict(kills=12, clients=2, models=3, pace=0.08, pause=0.03, gap=(1.5, 3.5)),
    "long": dict(kills=40, clients=3, models=4, pace=0.03, pause=0.0, gap=(1.5, 4.0)),
}
X = unit_rows(200, 3, seed=23)
SECRET_NAME = ("KEY", "TOKEN", "PASSWORD", "SECRET")


# ---- the compose file's static rules --------------------------------------------------------------------------

def _values(compose: dict):
    for name, svc in compose["services"].items():
        for k, v in (svc.get("environment") or {}).items():
            yield name, k, str(v)


def test_compose_static_rules():
    compose = load_compose()
    services = compose["services"]
    assert {"postgres", "nats", "migrate", "api", "consumer", "proxy"} <= set(services)
    # no secret literal: every secret-named variable is an interpolation from the operator's environment
    for name, k, v in _values(compose):
        if any(w in k for w in SECRET_NAME):
            assert v.startswith("${") and v.endswith("}") and ":?" in v, f"{name}.{k} = {v!r} is not passed in"
    assert "OLU_ENCRYPTION_KEY" in services["api"]["environment"] and "OLU_SIGNING_KEY" in services["consumer"][
        "environment"]
    with pytest.raises(MissingVariable, match="OLU_SIGNING_KEY"):  # a missing secret refuses to start
        compose_service(compose, "api", {"POSTGRES_PASSWORD": "p", "OLU_ENCRYPTION_KEY": "k", "OLU_ADMIN_TOKEN": "t"})
    # replicas and consumers configurable, 3 and 2 by default
    assert services["api"]["deploy"]["replicas"] == "${OLU_REPLICAS:-3}"
    assert services["consumer"]["deploy"]["replicas"] == "${OLU_CONSUMERS:-2}"
    assert interpolate(services["api"]["deploy"]["replicas"], {"OLU_REPLICAS": "7"}) == "7"
    # liveness healthcheck on /healthz; the proxy's routing on /readyz with retries on the next replica
    assert "/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    # the proxy writes its configuration at start, with the resolver of its network from /etc/resolv.conf (docker's
    # 127.0.0.11 or podman's gateway), in a form nginx 1.22 (Debian's, the stand-in) reads as 1.27 does
    script = services["proxy"]["command"][-1]
    assert services["proxy"]["command"][:2] == ["sh", "-c"] and "/etc/resolv.conf" in script
    conf = script[script.index("<<'CONF'\n") + 8:script.index("\nCONF\n")]
    assert "resolver @RESOLVER@" in conf and "127.0.0.11" not in conf and " resolve " not in conf
    assert "configs" not in compose  # podman-compose ignores the section: nothing may depend on it
    assert "location = /readyz" in conf and "/readyz" in " ".join(services["proxy"]["healthcheck"]["test"])
    directives = [line.split("#")[0] for line in conf.splitlines()]
    # next replica on errors and 502/503 for idempotent requests only: nginx never re-sends a POST it has sent
    assert "proxy_next_upstream error timeout http_502 http_503" in conf
    assert not any("non_idempotent" in d for d in directives)
    assert "X-Forwarded-For $$proxy_add_x_forwarded_for" in conf
    assert services["api"]["environment"]["OLU_TRUSTED_PROXIES"] == "${OLU_PROXY_SUBNET:-172.28.0.0/24}"
    assert compose["networks"]["edge"]["ipam"]["config"][0]["subnet"] == "${OLU_PROXY_SUBNET:-172.28.0.0/24}"
    # one-shot migration before the replicas and workers; the replicas do not migrate themselves
    assert services["migrate"]["command"] == ["olu", "migrate"] and services["migrate"]["restart"] == "no"
    for svc in ("api", "consumer"):
        assert services[svc]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[svc]["environment"]["OLU_AUTO_MIGRATE"] == "false"
    assert services["postgres"]["image"] == "postgres:15" and "-js" in services["nats"]["command"]


def test_compose_interpolation_and_local_mapping(tmp_path):
    env = {"A": "x", "E": ""}
    assert interpolate("$$A ${A} $A ${B:-d} ${E:-d} ${E-d} ${B-d}", env) == "$A x x d d  d"
    with pytest.raises(MissingVariable):
        interpolate("${E:?empty}", env)
    cmd, environment = compose_service(load_compose(), "api", {
        "POSTGRES_PASSWORD": "pw", "OLU_ENCRYPTION_KEY": "e", "OLU_SIGNING_KEY": "s", "OLU_ADMIN_TOKEN": "t"})
    argv = local_argv(cmd, 1234)
    assert argv[:3] == [sys.executable, "-m", "uvicorn"] and "--no-proxy-headers" in argv
    assert argv[argv.index("--port") + 1] == "1234" and argv[argv.index("--host") + 1] == "127.0.0.1"
    local = local_env(environment, "postgresql://postgres@127.0.0.1:5432/x", tmp_path / "d")
    assert local["OLU_DATABASE_URL"] == "postgresql+psycopg://postgres@127.0.0.1:5432/x"
    assert local["OLU_SIGNING_KEY"] == "s" and environment["OLU_DATABASE_URL"].endswith("pw@postgres:5432/olu")


# ---- the cluster ----------------------------------------------------------------------------------------------

class Cluster:
    def __init__(self, database_url: str, work: Path, profile: dict):
        self.url, self.work, self.profile = database_url, work, profile
        self.compose = load_compose()
        self.env = {"POSTGRES_PASSWORD": secrets.token_hex(8), "OLU_ENCRYPTION_KEY": signing_seed(),
                    "OLU_SIGNING_KEY": signing_seed(), "OLU_ADMIN_TOKEN": ADMIN_TOKEN, "OLU_LOG_LEVEL": "WARNING",
                    "OLU_STREAM_ACK_WAIT": "5", "OLU_IDEMPOTENCY_STALE_SECONDS": "15"}
        self.replicas: list[ComposeProc] = []
        self.consumers: list[ComposeProc] = []

    def _proc(self, service: str, name: str, http: bool) -> ComposeProc:
        cmd, environment = compose_service(self.compose, service, self.env)
        env = local_env(environment, self.url, self.work / name)
        return ComposeProc(lambda port: local_argv(cmd, port), env, self.work / f"{name}.log", http=http)

    def migrate(self) -> None:
        p = self._proc("migrate", "migrate", http=False)
        out = subprocess.run(p.argv, env={**os.environ, **p.env}, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr

    def start_api(self, n: int = 3) -> None:
        self.replicas = [self._proc("api", f"api{i}", http=True).launch() for i in range(n)]
        for r in self.replicas:
            r.wait_ready(120)

    def start_consumers(self, stream: str, key: str, n: int = 2) -> None:
        self.env.update(OLU_STREAM=stream, OLU_STREAM_API_KEY=key)
        self.consumers = [self._proc("consumer", f"consumer{i}", http=False).launch() for i in range(n)]

    def stop(self) -> None:
        for p in self.replicas + self.consumers:
            p.stop()

    def logs(self) -> str:
        return "".join(p.log_path.read_text(errors="replace")[-1500:] for p in self.replicas + self.consumers)


def _sql_rows(database_url: str, tenant_id: str) -> list[tuple]:
    from sqlalchemy import create_engine, text

    eng = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with eng.connect() as c:
            return [tuple(r) for r in c.execute(text(
                "SELECT event_id, kind, outcome, version, seq, model_id FROM stream_events WHERE tenant_id = :t"),
                {"t": tenant_id})]
    finally:
        eng.dispose()


def collect(cl: Cluster, key: str, tenant_id: str, mids, drivers, producer, broker, rng) -> dict:
    """What the traffic recorded and what every replica answers now, as plain data for ``check``."""
    clients = [r.client(key) for r in cl.replicas]
    c0 = clients[0]
    published = broker.published()
    s = {"keys": c0.get("/v1/keys").json()["keys"], "models": {}, "views": {}, "status": {m: {} for m in mids},
         "events": list(producer.events), "stream_rows": _sql_rows(cl.url, tenant_id),
         "results": [b for subj, b, h in published if subj.endswith(".results")],
         "dead": [b for subj, b, h in published if subj.endswith(".dead")],
         "http_learns": [x for d in drivers for x in d.learns], "http_unlearns": [x for d in drivers for x in d.unlearns],
         "http_uncertain": [x for d in drivers for x in d.uncertain],
         "checkpoints": [cp for d in drivers for cp in d.checkpoints], "proofs": {}}
    for m in mids:
        s["models"][m] = {"model": c0.get(f"/v1/models/{m}").json(), "receipts": all_receipts(c0, m),
                          "ledger": c0.get(f"/v1/models/{m}/ledger").json()}
    for i, c in enumerate(clients):
        cp = c.get("/v1/audit/checkpoint").json()
        s["views"][i] = {"checkpoint": cp, "models": {m: c.get(f"/v1/models/{m}").json() for m in mids}}
        s["checkpoints"].append({"replica": i, **cp})
    ids = {i for _, ids_, _ in s["http_learns"] for i in ids_} | {
        x["id"] for _, e in s["events"] if e["kind"] == "learn" for x in e["body"]["examples"]}
    for n, rid in enumerate(sorted(ids)):
        r = clients[n % len(clients)].get(f"/v1/audit/records/{rid}")
        for entry in (r.json()["models"] if r.status_code == 200 else []):
            if entry["model_id"] in s["status"]:
                s["status"][entry["model_id"]][rid] = entry
    sizes = sorted({cp["tree_size"] for cp in s["checkpoints"] if cp["tree_size"] > 0})
    if len(sizes) > 24:
        sizes = sorted({sizes[0], sizes[-1], *rng.sample(sizes[1:-1], 22)})
    for a_i, a in enumerate(sizes):
        for n, b in enumerate(sizes[a_i + 1:]):
            r = clients[(a_i + n) % len(clients)].get("/v1/audit/consistency", params={"from_size": a, "to_size": b})
            assert r.status_code == 200, r.text
            s["proofs"][f"{a}:{b}"] = r.json()["hashes"]
    for c in clients:
        c.close()
    return s


def _wait_applied(cl: Cluster, tenant_id: str, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(_sql_rows(cl.url, tenant_id)) < n:
        assert time.monotonic() < deadline, f"{len(_sql_rows(cl.url, tenant_id))} of {n} events applied\n{cl.logs()}"
        assert all(p.alive() for p in cl.consumers), cl.logs()
        time.sleep(0.5)


def run_cluster(database_url: str, work: Path, profile: dict, seed: int | None = None) -> tuple[dict, dict]:
    """Start, load, kill and restart, settle, collect.  Returns (snapshot, figures)."""
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    rng, started = random.Random(seed), time.monotonic()
    cl = Cluster(database_url, work, profile)
    cl.migrate()
    cl.start_api(3)
    broker = None
    try:
        tenant_id, key = cl.replicas[0].new_tenant("cluster")
        with cl.replicas[0].client(key) as c:
            mids = [create_model(c, dim=3, name=f"cluster-{i}")["id"] for i in range(profile["models"])]
        broker = Broker(tenant_id).create(keep_republished=True)
        cl.start_consumers(broker.events, key, 2)
        rr = RoundRobin([r.url for r in cl.replicas], key)
        drivers = [HttpDriver(rr, mids, X, seed + k, f"h{k}") for k in range(profile["clients"])]
        producer = EventProducer(tenant_id, broker.events, mids, X, seed, profile["pace"])
        stop = threading.Event()
        threads = [threading.Thread(target=d.run, args=(stop, profile["pause"]), daemon=True) for d in drivers]
        threads.append(threading.Thread(target=producer.run, args=(stop,), daemon=True))
        for t in threads:
            t.start()
        victims = ["api", "consumer"] * (profile["kills"] // 2) + ["api"] * (profile["kills"] % 2)
        rng.shuffle(victims)
        kills, restarts = {"api": 0, "consumer": 0}, []
        phases = {"start": round(time.monotonic() - started, 1)}
        t_load = time.monotonic()
        for v in victims:
            time.sleep(rng.uniform(*profile["gap"]))
            group = cl.replicas if v == "api" else cl.consumers
            p = rng.choice(group)
            p.kill()
            kills[v] += 1
            p.launch()
            if v == "api":
                t = time.monotonic()
                p.wait_ready(120)
                restarts.append(time.monotonic() - t)
        time.sleep(rng.uniform(*profile["gap"]))
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a traffic thread hung"
        errors = [e for w in drivers + [producer] for e in w.errors]
        assert not errors, errors[:5]
        phases["load_and_kills"] = round(time.monotonic() - t_load, 1)
        phases["api_ready_after_restart_max"] = round(max(restarts, default=0), 1)
        t = time.monotonic()
        for d in drivers:
            d.resolve()
        _wait_applied(cl, tenant_id, len(producer.events), timeout=180)
        phases["settle"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        snap = collect(cl, key, tenant_id, mids, drivers, producer, broker, rng)
        phases["collect"] = round(time.monotonic() - t, 1)
        rr.close()
    finally:
        cl.stop()
        if broker is not None:
            broker.delete()
    figures = {"seed": seed, "sigkills_api": kills["api"], "sigkills_consumer": kills["consumer"],
               "acked_http_learns": len(snap["http_learns"]), "acked_http_unlearns": len(snap["http_unlearns"]),
               "http_writes_resolved_after_the_load": sum(d.resolved for d in drivers),
               "http_retries": dict(sum((d.retry_reasons for d in drivers), Counter())), "acked_events": len(snap["events"]),
               "event_results_published": len(snap["results"]),
               "dead_letters": dict(Counter(b.get("type", "").rsplit("/", 1)[-1] + " " + str(b.get("detail"))[:120]
                                            for b in snap["dead"])),
               "receipts": sum(len(m["receipts"]) for m in snap["models"].values()),
               "records": sum(m["model"]["n_records"] for m in snap["models"].values()),
               "checkpoints": len(snap["checkpoints"]), "consistency_proofs": len(snap["proofs"]),
               "seconds": round(time.monotonic() - started, 1), **phases}
    return snap, figures


def corruptions(s: dict) -> list[tuple[str, str, dict]]:
    """(what, a word the checker's problem must contain, corrupted copy): one per property checked."""
    out = []
    mid = next(m for m in s["models"] if s["models"][m]["receipts"])
    c = copy.deepcopy(s)
    learned = next(ids[0] for m, ids, _ in c["http_learns"] if m == mid)
    c["status"][mid].pop(learned)
    out.append(("an acknowledged learn lost", "lost", c))
    c = copy.deepcopy(s)
    c["models"][mid]["receipts"].append(dict(c["models"][mid]["receipts"][0]))
    out.append(("a receipt duplicated", "twice", c))
    c = copy.deepcopy(s)
    o = next(o for m, _, o in c["http_learns"] if m == mid and o["first_step"] > 1)
    o["first_step"] += 1
    out.append(("a step gap", "gap", c))
    c = copy.deepcopy(s)
    sizes = sorted({cp["tree_size"] for cp in c["checkpoints"] if cp["tree_size"] > 0})
    other = next(cp["root_hash"] for cp in c["checkpoints"] if cp["tree_size"] == sizes[0])
    for cp in c["checkpoints"]:
        if cp["tree_size"] == sizes[-1]:
            cp["root_hash"] = other  # a replica that served a forked log
    out.append(("a forked transparency log", "consistency", c))
    c = copy.deepcopy(s)
    c["models"][mid]["ledger"]["rho_spent"] *= 1.001
    out.append(("the ledger's rho off the receipts' sum", "rho", c))
    return out


def _assert_sound_and_checkable(snap: dict, figures: dict) -> None:
    problems = check(snap)
    assert not problems, f"{problems[:8]} {figures}"
    assert figures["sigkills_api"] + figures["sigkills_consumer"] >= 10
    assert figures["acked_http_unlearns"] and figures["receipts"] and figures["consistency_proofs"], figures
    for what, word, bad in corruptions(snap):  # negative controls: each check can fail
        found = check(bad)
        assert any(word in p for p in found), f"the checker missed {what}: {found}"


@pytest.mark.skipif(_nats_up() is not None, reason=str(_nats_up()))
def test_cluster_survives_sigkills(postgres_url, tmp_path):
    profile = PROFILES[os.environ.get("OLU_CLUSTER_PROFILE", "short")]
    snap, figures = run_cluster(postgres_url, tmp_path, profile)
    print(figures)
    _assert_sound_and_checkable(snap, figures)


def main(argv: list[str]) -> int:
    """``python -m tests.test_cluster [--long]``: the cluster test outside pytest, on a throwaway database of
    OLU_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test)."""
    import tempfile

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from app.unlearning.mechanism import fast, fast_dgauss

    fast.warm_up()  # as the test session does: the replicas then load the kernels from numba's cache
    fast_dgauss.warm_up()
    profile = PROFILES["long" if "--long" in argv else os.environ.get("OLU_CLUSTER_PROFILE", "short")]
    base = make_url(os.environ.get("OLU_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
                    .replace("postgresql://", "postgresql+psycopg://", 1))
    name = f"olu_cluster_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        with tempfile.TemporaryDirectory() as work:
            snap, figures = run_cluster(base.set(database=name).render_as_string(hide_password=False)
                                        .replace("postgresql+psycopg://", "postgresql://", 1), Path(work), profile)
            print(figures, flush=True)
            _assert_sound_and_checkable(snap, figures)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    print("cluster: all checks passed; every negative control was caught")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
