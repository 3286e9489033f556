"""The cluster of compose.yaml as local processes, its traffic, and the pure checker of what it left behind.

- ``compose_service`` reads a service of compose.yaml (its command and environment, interpolated as
  ``docker compose`` does from an environment the caller gives) and ``local_argv`` maps it onto this machine:
  ``uvicorn``/``olu`` become ``python -m uvicorn``/``python -m app.cli`` from this checkout, the container host
  names (``postgres``, ``nats``) and ports become the local PostgreSQL throwaway database, the local NATS server
  and a free port.
- ``RoundRobin`` stands in for the nginx proxy of compose.yaml: requests go to the replicas in turn, a refused
  connection (a dead replica) moves on to the next one, as ``proxy_next_upstream error`` does.
- ``HttpDriver`` and ``EventProducer`` send learns, forgets, predicts and audits to the same models over HTTP and
  through the broker; they record what was acknowledged.
- ``check(snapshot)`` is pure: it takes what the traffic recorded and what the replicas answered afterwards and
  returns the problems found, so a test can corrupt a copy and see the checker notice.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

from .procs import REPO, ServiceProcess

COMPOSE = REPO / "compose.yaml"
NATS_URL = "nats://127.0.0.1:4222"
_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                  r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


class MissingVariable(ValueError):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation: $$, $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("plain")
        op, arg, val = m.group("op"), m.group("arg") or "", env.get(name)
        unset = val is None or (op is not None and op.startswith(":") and val == "")
        if op in (":-", "-") and unset:
            return arg
        if op in (":?", "?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        return val if val is not None else ""
    return _VAR.sub(sub, value)


def load_compose(path: Path = COMPOSE) -> dict:
    return yaml.safe_load(path.read_text())


def compose_service(compose: dict, name: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of a service, interpolated with ``env``."""
    svc = compose["services"][name]
    command = [interpolate(str(a), env) for a in svc["command"]]
    environment = {k: interpolate(str(v), env) for k, v in (svc.get("environment") or {}).items()}
    return command, environment


def local_argv(command: list[str], port: int | None = None) -> list[str]:
    """The container's command run from this checkout: host 127.0.0.1, the given port, the local NATS server."""
    exe = {"uvicorn": [sys.executable, "-m", "uvicorn"], "olu": [sys.executable, "-m", "app.cli"]}[command[0]]
    out, args = list(exe), iter(command[1:])
    for a in args:
        if a == "--app-dir":
            out += [a, str(REPO)]
            next(args)
        elif a == "--host":
            out += [a, "127.0.0.1"]
            next(args)
        elif a == "--port":
            out += [a, str(port)]
            next(args)
        else:
            out.append(re.sub(r"^nats://nats:4222$", NATS_URL, a))
    return out


def local_env(environment: dict[str, str], database_url: str, data_dir: Path) -> dict[str, str]:
    """The service's environment with the compose database (host ``postgres``) replaced by the local throwaway one;
    each process gets its own data directory, as each container has its own file system."""
    from sqlalchemy.engine import make_url

    url = make_url(environment["OLU_DATABASE_URL"])
    assert url.host == "postgres" and url.drivername == "postgresql+psycopg", url
    data_dir.mkdir(parents=True, exist_ok=True)
    return {**environment, "OLU_DATABASE_URL": database_url.replace("postgresql://", "postgresql+psycopg://", 1),
            "OLU_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}


class ComposeProc(ServiceProcess):
    """A ServiceProcess whose command line is the one compose.yaml gives (mapped by ``local_argv``)."""

    def __init__(self, argv_of_port, env, log_path, http: bool = True):
        super().__init__(env, log_path)
        self.argv = argv_of_port(self.port)
        self.http = http

    def launch(self) -> "ComposeProc":
        env = {**os.environ, **self.env}
        env.pop("CI", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class RoundRobin:
    """The proxy's stand-in: each request goes to the next replica; a refused connection tries the next one."""

    def __init__(self, urls: list[str], key: str):
        self.urls, self.i, self.lock = urls, 0, threading.Lock()
        self.clients = [httpx.Client(base_url=u, headers={"authorization": f"Bearer {key}"}, timeout=30) for u in urls]

    def request(self, method: str, path: str, **kw) -> tuple[int, httpx.Response]:
        for _ in range(3 * len(self.urls)):
            with self.lock:
                self.i = (self.i + 1) % len(self.urls)
                i = self.i
            try:
                return i, self.clients[i].request(method, path, **kw)
            except httpx.ConnectError:
                time.sleep(0.05)
        raise httpx.ConnectError("no replica answered")

    def close(self) -> None:
        for c in self.clients:
            c.close()


# 429: the tenant's in-flight and rate limits hold for the deployment on PostgreSQL (app/api/shared_limits.py), and
# a SIGKILLed replica's slots stay counted until they expire (about 5 s): a client retries after Retry-After
RETRY_STATUSES = {409, 429, 502, 503, 504}


class HttpDriver:
    """Learns (unique ids), forgets of its own acknowledged records, predicts and audits, over the round robin.

    A write whose replica died mid-way, or that was answered 409/503, is retried with the same Idempotency-Key
    (as a client behind the proxy would) until it is answered; ``uncertain`` keeps the writes never answered."""

    def __init__(self, rr: RoundRobin, models: list[str], x_rows, seed: int, name: str):
        self.rr, self.models, self.X, self.rng, self.name = rr, models, x_rows, random.Random(seed), name
        self.learns: list[tuple[str, list[str], dict]] = []     # (model, ids, answer)
        self.unlearns: list[tuple[str, list[str], dict]] = []
        self.uncertain: list[tuple[str, str, list[str]]] = []   # (kind, model, ids)
        self.checkpoints: list[dict] = []
        self.errors: list[str] = []
        self.retries = self.resolved = 0
        self.retry_reasons: Counter = Counter()
        self.n = 0
        self.bodies: dict[str, dict] = {}  # learn bodies by first id, to resend an uncertain learn

    def resolve(self) -> None:
        """Send each write that was never answered again with its Idempotency-Key: a write that was applied
        replays its stored answer, one that was not is applied now; either way it is then acknowledged."""
        left = []
        for kind, mid, ids in self.uncertain:
            body = self.bodies[ids[0]] if kind == "learn" else {"ids": ids}
            out = self._write(f"/v1/models/{mid}/{kind}", body, f"{kind[0].upper()}-{ids[0]}")
            if out is None:
                left.append((kind, mid, ids))  # reported by check()
            else:
                self.resolved += 1
                (self.learns if kind == "learn" else self.unlearns).append((mid, ids, out))
        self.uncertain = left

    def _write(self, path: str, body: dict, idem: str) -> dict | None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                _, r = self.rr.request("POST", path, json=body, headers={"Idempotency-Key": idem})
            except httpx.TransportError as e:
                self.retries += 1
                self.retry_reasons[type(e).__name__] += 1
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                return r.json()
            if r.status_code in RETRY_STATUSES:
                self.retries += 1
                slug = r.json().get("type", "").rsplit("/", 1)[-1]
                self.retry_reasons[f"{r.status_code} {slug}"] += 1
                # a claim left by a killed replica: taken over after OLU_IDEMPOTENCY_STALE_SECONDS
                time.sleep(0.5 if slug == "idempotency-request-in-progress" else 0.1)
                continue
            self.errors.append(f"{path} -> {r.status_code} {r.text[:300]}")
            return None
        return None

    def step(self) -> None:
        mid = self.rng.choice(self.models)
        ids = [f"{self.name}-{self.n + k}" for k in range(self.rng.randint(1, 3))]
        body = {"examples": [{"id": i, "x": self.X[(self.n + k) % len(self.X)].tolist(), "y": float(k % 2)}
                             for k, i in enumerate(ids)]}
        self.n += len(ids)
        self.bodies[ids[0]] = body
        out = self._write(f"/v1/models/{mid}/learn", body, f"L-{ids[0]}")
        if out is None:
            self.uncertain.append(("learn", mid, ids))
        else:
            self.learns.append((mid, ids, out))
        mine = [i for m, ids_, _ in self.learns if m == mid for i in ids_]
        gone = {i for m, ids_, _ in self.unlearns for i in ids_} | {i for k, m, ids_ in self.uncertain for i in ids_}
        left = [i for i in mine if i not in gone]
        if len(left) > 3 and self.rng.random() < 0.5:
            ids = self.rng.sample(left, 1)
            out = self._write(f"/v1/models/{mid}/unlearn", {"ids": ids}, f"U-{ids[0]}")
            if out is None:
                self.uncertain.append(("unlearn", mid, ids))
            else:
                self.unlearns.append((mid, ids, out))
        try:
            if self.rng.random() < 0.4:
                _, r = self.rr.request("POST", f"/v1/models/{mid}/predict", json={"x": [self.X[0].tolist()]})
                if r.status_code not in (200, 429, 503):
                    self.errors.append(f"predict -> {r.status_code} {r.text[:300]}")
            if self.rng.random() < 0.4:
                i, r = self.rr.request("GET", "/v1/audit/checkpoint")
                if r.status_code == 200:
                    self.checkpoints.append({"replica": i, **r.json()})
                elif r.status_code not in (429, 503):  # refused or not ready: a read to try again, not an error
                    self.errors.append(f"checkpoint -> {r.status_code} {r.text[:300]}")
        except httpx.TransportError:
            self.retries += 1  # a read that met a dying replica: nothing to record

    def run(self, stop: threading.Event, pause: float = 0.0) -> None:
        while not stop.is_set():
            try:
                self.step()
                time.sleep(pause)
            except Exception as e:  # noqa: BLE001 -- reported by the test, not lost in a thread
                self.errors.append(repr(e))
                return


def learn_event(eid, ids, X, y) -> dict:
    return {"id": eid, "kind": "learn", "body": {"examples": [{"id": i, "x": list(map(float, x)), "y": float(v)}
                                                             for i, x, v in zip(ids, X, y)]}}


class EventProducer:
    """Learn and forget events for the same models through JetStream; an event is acknowledged when the stream
    acked its publication."""

    def __init__(self, tenant_id: str, stream: str, models: list[str], x_rows, seed: int, pace: float):
        self.tenant_id, self.stream, self.models, self.X = tenant_id, stream, models, x_rows
        self.rng, self.pace = random.Random(seed), pace
        self.events: list[tuple[str, dict]] = []  # acknowledged: (model, event)
        self.errors: list[str] = []

    def _next(self, k: int) -> tuple[str, dict]:
        mid = self.rng.choice(self.models)
        learned = [i for m, e in self.events if m == mid and e["kind"] == "learn" for i in
                   (x["id"] for x in e["body"]["examples"])]
        gone = {i for m, e in self.events if e["kind"] == "unlearn" for i in e["body"]["ids"]}
        left = [i for i in learned if i not in gone]
        if len(left) > 3 and self.rng.random() < 0.35:
            return mid, {"id": f"ev{k}", "kind": "unlearn", "body": {"ids": self.rng.sample(left, 1)}}
        ids = [f"b{k}-{j}" for j in range(self.rng.randint(1, 3))]
        return mid, learn_event(f"ev{k}", ids, [self.X[(k + j) % len(self.X)] for j in range(len(ids))],
                                [j % 2 for j in range(len(ids))])

    def run(self, stop: threading.Event) -> None:
        async def go():
            import nats

            nc = await nats.connect(NATS_URL)
            js = nc.jetstream()
            k = 0
            while not stop.is_set():
                mid, ev = self._next(k)
                await js.publish(f"olu.{self.tenant_id}.{mid}.events", json.dumps(ev).encode(), stream=self.stream)
                self.events.append((mid, ev))
                k += 1
                await asyncio.sleep(self.rng.uniform(0, 2 * self.pace))
            await nc.close()
        try:
            asyncio.run(go())
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e))


# ---- the checker ---------------------------------------------------------------------------------------------

def check(s: dict) -> list[str]:
    """Every problem with a cluster run's snapshot (see tests/test_cluster.py ``collect``); [] when it is sound."""
    from app.receipts.verify import verify_bundle

    from .helpers import verify_receipt

    p: list[str] = []
    keys = s["keys"]
    receipts = [r for m in s["models"].values() for r in m["receipts"]]
    by_id = {r["id"]: r for r in receipts}
    # no receipt is duplicated: one per id, one per record, log indices 0..n-1, each signed
    if len(by_id) != len(receipts):
        p.append("a receipt id is stored twice")
    dup = [c for c, n in Counter(r["record_commitment"] for r in receipts).items() if n > 1]
    if dup:
        p.append(f"{len(dup)} records have two receipts")
    if sorted(r["log_index"] for r in receipts) != list(range(len(receipts))):
        p.append("the tenant log's indices are not exactly 0..n-1")
    bad = [r["id"] for r in receipts if not verify_receipt(r, keys)]
    if bad:
        p.append(f"receipts whose signature fails: {bad[:3]}")
    published: dict[str, dict] = {}
    owner: dict[str, str] = {}
    for body in s["results"]:
        for r in body.get("receipts", []):
            if published.setdefault(r["id"], r) != r:
                p.append(f"receipt {r['id']} published with two bodies")
            if owner.setdefault(r["id"], body["event_id"]) != body["event_id"]:
                p.append(f"receipt {r['id']} published for two events")
            if by_id.get(r["id"]) != r:
                p.append(f"published receipt {r['id']} differs from the stored one, or is not stored")
    # no acknowledged write is lost
    applied = {row[0]: row for row in s["stream_rows"]}
    learned: dict[str, set] = {m: set() for m in s["models"]}
    forgotten: dict[str, set] = {m: set() for m in s["models"]}
    for mid, ev in s["events"]:
        row = applied.get(ev["id"])
        if row is None or row[2] != "applied":
            p.append(f"acknowledged event {ev['id']} not applied: {row}")
            continue
        if ev["kind"] == "learn":
            learned[mid].update(x["id"] for x in ev["body"]["examples"])
        else:
            forgotten[mid].update(ev["body"]["ids"])
    if len(applied) != len(s["stream_rows"]) or set(applied) - {e["id"] for _, e in s["events"]}:
        p.append("an event was recorded twice, or one never published was recorded")
    for mid, ids, out in s["http_learns"]:
        learned[mid].update(ids)
    for mid, ids, out in s["http_unlearns"]:
        forgotten[mid].update(ids)
        for rid, rc in zip(ids, out["receipts"]):
            if by_id.get(rc["id"]) != rc:
                p.append(f"acknowledged receipt {rc['id']} of {rid} lost or changed")
    if s["http_uncertain"]:
        p.append(f"writes never answered: {s['http_uncertain'][:3]}")
    for mid, m in s["models"].items():
        status = s["status"][mid]
        lost = [i for i in learned[mid] if status.get(i, {}).get("status") not in ("learned", "forgotten")]
        if lost:
            p.append(f"{mid}: acknowledged learns lost: {sorted(lost)[:5]}")
        unforgot = [i for i in forgotten[mid] if status.get(i, {}).get("status") != "forgotten"]
        if unforgot:
            p.append(f"{mid}: acknowledged forgets not forgotten: {sorted(unforgot)[:5]}")
        extra = [i for i, st in status.items() if st.get("status") == "forgotten" and i not in forgotten[mid]]
        if extra:
            p.append(f"{mid}: forgotten without an acknowledged forget: {extra[:5]}")
        model = m["model"]
        if not model["step"] == model["n_records"] == len(learned[mid]):
            p.append(f"{mid}: step {model['step']}, n_records {model['n_records']}, learned {len(learned[mid])}")
        if model["n_forgotten"] != len(forgotten[mid]) or len(m["receipts"]) != len(forgotten[mid]):
            p.append(f"{mid}: n_forgotten {model['n_forgotten']}, receipts {len(m['receipts'])}, "
                     f"forgets {len(forgotten[mid])}")
        # each model's steps have no gaps: the learn answers (HTTP and broker) tile 1..step
        ranges = sorted([(o["first_step"], o["last_step"]) for mm, _, o in s["http_learns"] if mm == mid]
                        + [(b["first_step"], b["last_step"]) for b in
                           {b["event_id"]: b for b in s["results"]}.values()  # re-publications count once
                           if b.get("kind") == "learn" and b["model_id"] == mid])
        # each applied write moved the version once: HTTP answers and the broker's transactions are 2..version
        versions = [o["version"] for mm, _, o in s["http_learns"] + s["http_unlearns"] if mm == mid] + \
            sorted({row[3] for row in s["stream_rows"] if row[5] == mid and row[2] == "applied"})
        if sorted(versions) != list(range(2, model["version"] + 1)):
            p.append(f"{mid}: write versions are not exactly 2..{model['version']}")
        want = 1
        for a, b in ranges:
            if a != want:
                p.append(f"{mid}: steps gap or overlap at {want} (next range {a}..{b})")
                break
            want = b + 1
        if want != model["step"] + 1:
            p.append(f"{mid}: the learn ranges end at {want - 1}, the model's step is {model['step']}")
        # every replica sees the same model
        for i, view in s["views"].items():
            mv = view["models"][mid]
            if (mv["step"], mv["version"], mv["n_forgotten"]) != (model["step"], model["version"], model["n_forgotten"]):
                p.append(f"{mid}: replica {i} sees another state {mv}")
        # the ledger's rho is the sum over the receipts; its deletion entries are the receipts
        rho = sum(r["mechanism"]["rho"] for r in m["receipts"])
        if abs(m["ledger"]["rho_spent"] - rho) > 1e-9 * max(1.0, rho):
            p.append(f"{mid}: ledger rho_spent {m['ledger']['rho_spent']} != sum over the receipts {rho}")
        entries = sorted(e["receipt_id"] for e in m["ledger"]["entries"] if e["kind"] == "deletion")
        if entries != sorted(r["id"] for r in m["receipts"]):
            p.append(f"{mid}: ledger deletion entries differ from the receipts")
    # the transparency log: checkpoints of one size agree on the root, whichever replica signed them, and every
    # pair of sizes has a consistency proof that verifies offline against the two signed checkpoints
    roots: dict[int, set] = {}
    for cp in s["checkpoints"]:
        roots.setdefault(cp["tree_size"], set()).add(cp["root_hash"])
    forks = {n: r for n, r in roots.items() if len(r) > 1}
    if forks:
        p.append(f"checkpoints of one size with different roots: {sorted(forks)[:5]}")
    final = {view["checkpoint"]["tree_size"] for view in s["views"].values()}
    if final != {len(receipts)}:
        p.append(f"the replicas' final checkpoints have sizes {final}, the log holds {len(receipts)}")
    by_size = {cp["tree_size"]: cp for cp in s["checkpoints"]}
    for key, proof in s["proofs"].items():
        m_, n_ = map(int, key.split(":"))
        cp_m = {k: v for k, v in by_size[m_].items() if k != "replica"}
        cp_n = {k: v for k, v in by_size[n_].items() if k != "replica"}
        report = verify_bundle({"receipts": [], "consistency": {"from": cp_m, "to": cp_n, "hashes": proof}}, keys)
        if not report.ok:
            p.append(f"consistency {m_} -> {n_} fails: {report.failures()[:2]}")
    if len(s["proofs"]) < 1 and len(by_size) > 2:
        p.append("no consistency proof was checked")
    return p


def signing_seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()
