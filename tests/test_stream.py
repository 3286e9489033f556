"""``olu consume`` against the real NATS JetStream server at 127.0.0.1:4222 (skipped, with the reason, without it).

Each test uses its own streams (the events stream and a stream capturing what the consumer publishes back),
named after the test and deleted afterwards; the consumer runs as a real process (``python -m app.cli consume``)
on the same database and data directory as the API under test.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from .conftest import free_port
from .helpers import all_receipts, create_model, unit_rows, verify_receipt

REPO = Path(__file__).resolve().parents[1]
NATS_URL = "nats://127.0.0.1:4222"


def _nats_up() -> str | None:
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install nats-py, or the 'stream' extra)"
    try:
        socket.create_connection(("127.0.0.1", 4222), timeout=2).close()
    except OSError:
        return "no NATS server with JetStream at 127.0.0.1:4222"
    return None


pytestmark = pytest.mark.skipif(_nats_up() is not None, reason=str(_nats_up()))


def _run(coro):
    return asyncio.run(coro)


class Broker:
    """The test's own streams: ``events`` (olu.<tenant>.*.events) and ``out`` (what the consumer publishes)."""

    def __init__(self, tenant_id: str):
        tag = secrets.token_hex(4).upper()
        self.tenant_id, self.events, self.out = tenant_id, f"TEV_{tag}", f"TOUT_{tag}"
        self.reply_prefix = f"reply.{tag.lower()}"

    async def _conn(self):
        import nats

        nc = await nats.connect(NATS_URL)
        return nc, nc.jetstream()

    def create(self, keep_republished: bool = False) -> "Broker":
        """``keep_republished``: the out stream keeps re-publications (else JetStream drops them by Nats-Msg-Id)."""
        from nats.js.api import RetentionPolicy

        async def go():
            nc, js = await self._conn()
            await js.add_stream(name=self.events, subjects=[f"olu.{self.tenant_id}.*.events"],
                                retention=RetentionPolicy.WORK_QUEUE)  # as docs/streaming.md recommends
            await js.add_stream(name=self.out, subjects=[f"olu.{self.tenant_id}.*.results", f"olu.{self.tenant_id}.dead",
                                                         f"{self.reply_prefix}.>"],
                                duplicate_window=0.1 if keep_republished else 120.0)
            await nc.close()
        _run(go())
        return self

    def events_left(self) -> int:
        async def go():
            nc, js = await self._conn()
            info = await js.stream_info(self.events)
            await nc.close()
            return info.state.messages
        return _run(go())

    def delete(self) -> None:
        async def go():
            nc, js = await self._conn()
            for name in (self.events, self.out):
                try:
                    await js.delete_stream(name)
                except Exception:  # noqa: BLE001
                    pass
            await nc.close()
        _run(go())

    def publish(self, events: list[tuple[str, object, dict | None]]) -> None:
        """(model id, event dict or raw bytes, headers) in order, each acknowledged by the stream."""
        async def go():
            nc, js = await self._conn()
            for mid, ev, headers in events:
                data = ev if isinstance(ev, bytes) else json.dumps(ev).encode()
                await js.publish(f"olu.{self.tenant_id}.{mid}.events", data, headers=headers, stream=self.events)
            await nc.close()
        _run(go())

    def published(self) -> list[tuple[str, dict, dict]]:
        """Everything the consumer published back: (subject, JSON body, headers), in order."""
        async def go():
            from nats.js.errors import NotFoundError

            nc, js = await self._conn()
            info = await js.stream_info(self.out)
            out = []
            for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
                try:
                    m = await js.get_msg(self.out, seq=seq)
                except NotFoundError:
                    continue
                out.append((m.subject, json.loads(m.data), m.headers or {}))
            await nc.close()
            return out
        return _run(go())

    def wait_published(self, n: int, timeout: float = 180, consumer: "ConsumerProc | None" = None) -> list:
        deadline = time.monotonic() + timeout
        while True:
            got = self.published()
            if len({(s, b.get("event_id")) for s, b, _ in got}) >= n:  # re-publications count once
                return got
            if consumer is not None and consumer.proc.poll() is not None:
                raise AssertionError(f"consumer exited {consumer.proc.returncode}:\n{consumer.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(got)} of {n} results published: {got[-3:]}\n"
                                     f"{consumer.log() if consumer else ''}")
            time.sleep(0.1)


class ConsumerProc:
    def __init__(self, server, key: str, broker: Broker, log_path: Path, *extra: str, metrics_port: int | None = None):
        self.args = [sys.executable, "-m", "app.cli", "consume", "--stream", broker.events, "--nats-url", NATS_URL,
                     "--batch", "50", "--ack-wait", "5", *extra]
        if metrics_port is not None:
            self.args += ["--metrics-port", str(metrics_port)]
        self.env = {**os.environ, "OLU_DATA_DIR": str(server.data_dir), "OLU_DATABASE_URL": server.database_url,
                    "OLU_STREAM_API_KEY": key, "PYTHONPATH": str(REPO)}
        self.env.pop("CI", None)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ConsumerProc":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> int:
        if self.proc and self.proc.poll() is None:
            time.sleep(0.05)
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError("consumer ignored SIGTERM")
        return self.proc.returncode


class _Server:
    """What ConsumerProc needs of a server: its database and data directory."""

    def __init__(self, data_dir, database_url):
        self.data_dir, self.database_url = data_dir, database_url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory):
    """This module's own API server (in process) with its own data directory; on SQLite its own database file.

    Not the session's server: its SQLite file is read by other tests' code in this process, and a process that
    closes any descriptor of a SQLite file loses its POSIX locks on it, after which a consumer process, believing
    itself the last connection, may checkpoint and remove the WAL that the server still writes to."""
    from .conftest import start_server

    data_dir = tmp_path_factory.mktemp(f"stream-{request.param}")
    url = f"sqlite:///{data_dir / 'olu.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    srv, (uv, thread) = start_server(url, data_dir, request.param)
    yield srv
    uv.should_exit = True
    thread.join(timeout=10)
    srv.app.state.ctx.db.dispose()


@pytest.fixture
def setup(server, tmp_path):
    """(server, tenant id, all-scopes key, client, broker) with the broker's streams deleted afterwards."""
    tenant_id, key = server.new_tenant("stream")
    broker = Broker(tenant_id).create()
    with server.client(key) as c:
        yield server, tenant_id, key, c, broker
    broker.delete()


def learn_event(eid: str, ids: list[str], X, y, **kw) -> dict:
    return {"id": eid, "kind": "learn", "body": {"examples": [{"id": i, "x": list(map(float, x)), "y": float(v)}
                                                             for i, x, v in zip(ids, X, y)]}, **kw}


def unlearn_event(eid: str, ids: list[str], **kw) -> dict:
    return {"id": eid, "kind": "unlearn", "body": {"ids": ids}, **kw}


def _stream_rows(database_url: str, tenant_id: str) -> list[tuple]:
    from sqlalchemy import create_engine, text

    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return list(c.execute(text("SELECT event_id, kind, outcome, version, seq FROM stream_events "
                                       "WHERE tenant_id = :t ORDER BY seq"), {"t": tenant_id}))
    finally:
        eng.dispose()


DIM = 3
X = unit_rows(400, DIM, seed=11)


def test_happy_path_learn_unlearn_receipts_published_and_metrics(setup, tmp_path):
    server, tenant_id, key, c, broker = setup
    mid = create_model(c, dim=DIM)["id"]
    events = []
    for k in range(5):
        ids = [f"r{2 * k}", f"r{2 * k + 1}"]
        events.append((mid, learn_event(f"L{k}", ids, X[2 * k:2 * k + 2], [0, 1]), None))
    # columnar body, as the HTTP endpoint accepts it
    events.append((mid, {"id": "L5", "kind": "learn", "model_id": mid,
                         "body": {"ids": ["r10", "r11"], "x": X[10:12].tolist(), "y": [1.0, 0.0]}}, None))
    # msgpack, x and y as raw little-endian float64 bytes (the HTTP endpoint's msgpack body)
    import msgpack

    events.append((mid, msgpack.packb({"id": "L6", "kind": "learn", "body": {
        "ids": ["r12", "r13"], "x": np.ascontiguousarray(X[12:14], "<f8").tobytes(),
        "y": np.asarray([0.0, 1.0], "<f8").tobytes()}}, use_bin_type=True), {"Content-Type": "application/msgpack"}))
    events.append((mid, unlearn_event("U0", ["r3", "r7"], reply_to=f"{broker.reply_prefix}.mine"), None))
    events.append((mid, unlearn_event("U1", ["r0"]), None))
    broker.publish(events)
    port = free_port()
    cons = ConsumerProc(server, key, broker, tmp_path / "consumer.log", metrics_port=port).start()
    try:
        got = broker.wait_published(len(events), consumer=cons)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        assert cons.terminate() == 0, cons.log()
    by_event = {b["event_id"]: (subj, b, h) for subj, b, h in got}
    assert len(got) == len(events) == len(by_event)
    # learn acknowledgements: steps in event order, consecutive
    steps = [(by_event[f"L{k}"][1]["first_step"], by_event[f"L{k}"][1]["last_step"]) for k in range(7)]
    assert [s for pair in steps for s in pair] == [s for k in range(7) for s in (2 * k + 1, 2 * k + 2)]
    assert all(by_event[f"L{k}"][0] == f"olu.{tenant_id}.{mid}.results" for k in range(7))
    assert by_event["U0"][0] == f"{broker.reply_prefix}.mine"  # the event's own reply subject
    model = c.get(f"/v1/models/{mid}").json()
    assert model["step"] == 14 and model["n_forgotten"] == 3
    stored = {r["id"]: r for r in all_receipts(c, mid)}
    published = [r for e in ("U0", "U1") for r in by_event[e][1]["receipts"]]
    assert sorted(r["id"] for r in published) == sorted(stored)  # every receipt published, once
    keys = c.get("/v1/keys").json()["keys"]
    for r in published:
        assert r == stored[r["id"]] and verify_receipt(r, keys)
    rows = _stream_rows(server.database_url, tenant_id)
    assert {r[0] for r in rows} == {f"L{k}" for k in range(7)} | {"U0", "U1"} and {r[2] for r in rows} == {"applied"}
    # one write per transaction: the version counts the transactions that applied events (learns batched)
    assert model["version"] == 1 + len({r[3] for r in rows})
    assert len({r[3] for r in rows}) < len(events)  # consecutive learn events shared a transaction
    assert 'olu_stream_events_applied_total{kind="learn"} 7.0' in metrics
    assert 'olu_stream_events_applied_total{kind="unlearn"} 2.0' in metrics
    assert "olu_stream_lag_messages" in metrics
    # work-queue retention: the applied events (their features included) are no longer in the broker's stream
    assert broker.events_left() == 0


def test_bad_events_are_dead_lettered_and_change_nothing(setup, tmp_path):
    server, tenant_id, key, c, broker = setup
    mid = create_model(c, dim=DIM)["id"]
    with server.client(key) as kc:
        r = server.admin().post(f"/v1/tenants/{tenant_id}/keys", json={"scopes": ["predict"]})
        assert r.status_code == 201, r.text
        predict_key = r.json()["api_key"]
    before = c.get(f"/v1/models/{mid}").json()
    far = (X[0] / np.linalg.norm(X[0]) * 5.0).tolist()  # ||x|| = 5 > the declared x_norm 1
    bad = [
        (mid, b"{not json", None, "validation-error"),
        (mid, {"kind": "learn", "body": {"examples": []}}, None, "validation-error"),  # no id
        (mid, learn_event("B-dim", ["d0"], [[0.1, 0.2]], [1]), None, "invalid-dimension"),
        ("mdl_doesnotexist", learn_event("B-model", ["m0"], X[:1], [1]), None, "model-not-found"),
        (mid, learn_event("B-scope", ["s0"], X[:1], [1]), {"Olu-Api-Key": predict_key}, "forbidden"),
        (mid, learn_event("B-bounds", ["o0"], [far], [1]), None, "out-of-bounds-input"),
        (mid, {"id": "B-kind", "kind": "retrain", "body": {}}, None, "validation-error"),
        (mid, unlearn_event("B-unknown", ["never-learned"]), None, "record-not-found"),
        (mid, {"id": "B-body", "kind": "learn", "body": {"examples": [{"id": "z", "x": [1, "a", 2], "y": 1}]}},
         None, "validation-error"),
        (mid, learn_event("B-nokey", ["k0"], X[:1], [1]), {"Olu-Api-Key": "olu_bad_key"}, "unauthorized"),
    ]
    good = (mid, learn_event("G0", ["g0", "g1"], X[20:22], [0, 1]), None)
    # a good event between bad ones in one learn run: only the bad one in the batch is refused
    events = [(m, e, h) for m, e, h, _ in bad[:3]] + [good] + [(m, e, h) for m, e, h, _ in bad[3:]]
    broker.publish(events)
    cons = ConsumerProc(server, key, broker, tmp_path / "consumer.log").start()
    try:
        got = broker.wait_published(len(events), consumer=cons)
    finally:
        assert cons.terminate() == 0
    dead = [(s, b) for s, b, h in got if s == f"olu.{tenant_id}.dead"]
    assert sorted(b["type"].rsplit("/", 1)[-1] for _, b in dead) == sorted(slug for *_, slug in bad)
    for _, b in dead:  # RFC 9457 shape, with the event named
        assert {"type", "title", "status", "detail", "stream_seq"} <= set(b) and b["status"] in (401, 403, 404, 409, 422)
    model = c.get(f"/v1/models/{mid}").json()
    assert model["step"] == 2 and model["version"] == before["version"] + 1 and model["n_forgotten"] == 0
    applied = [b for s, b, h in got if b.get("status") == "applied"]
    assert [b["event_id"] for b in applied] == ["G0"]


def test_duplicate_event_ids_are_applied_once(setup, tmp_path):
    server, tenant_id, key, c, broker = setup
    mid = create_model(c, dim=DIM)["id"]
    e0 = learn_event("E0", ["a0", "a1"], X[:2], [0, 1])
    e1 = unlearn_event("E1", ["a0"])
    other = learn_event("E0", ["b0"], X[2:3], [1])  # the same id, another event: refused, not applied
    broker.publish([(mid, e0, None), (mid, e0, None), (mid, e1, None), (mid, e1, None), (mid, other, None)])
    cons = ConsumerProc(server, key, broker, tmp_path / "consumer.log").start()
    try:
        got = broker.wait_published(3, consumer=cons)  # results: E0 and E1 (re-publications de-duplicated), reuse
        time.sleep(1.0)
        # the same events published again later, after the consumer acked them: recognised, not applied
        broker.publish([(mid, e0, None), (mid, e1, None)])
        deadline = time.monotonic() + 30
        while _stream_rows(server.database_url, tenant_id) and time.monotonic() < deadline:
            info = _consumer_pending(broker, f"olu-{tenant_id}")
            if info == 0:
                break
            time.sleep(0.2)
    finally:
        assert cons.terminate() == 0
    got = broker.published()
    model = c.get(f"/v1/models/{mid}").json()
    assert model["step"] == 2 and model["n_forgotten"] == 1 and model["version"] == 3
    rows = _stream_rows(server.database_url, tenant_id)
    assert sorted(r[0] for r in rows) == ["E0", "E1"]
    receipts = [r["id"] for s, b, h in got for r in b.get("receipts", [])]
    assert len(receipts) == len(set(receipts)) == 1 == len(all_receipts(c, mid))
    reused = [b for s, b, h in got if b.get("type", "").endswith("/event-id-reused")]
    assert len(reused) == 1 and reused[0]["stream_seq"] == 5


def _consumer_in_flight(broker: Broker, durable: str) -> int:
    async def go():
        nc, js = await broker._conn()
        info = await js.consumer_info(broker.events, durable)
        await nc.close()
        return info.num_ack_pending
    return _run(go())


def _consumer_pending(broker: Broker, durable: str) -> int:
    async def go():
        nc, js = await broker._conn()
        info = await js.consumer_info(broker.events, durable)
        await nc.close()
        return info.num_pending + info.num_ack_pending
    return _run(go())


def test_sigterm_finishes_the_batch_and_stops(setup, tmp_path):
    server, tenant_id, key, c, broker = setup
    mid = create_model(c, dim=DIM)["id"]
    cons = ConsumerProc(server, key, broker, tmp_path / "consumer.log").start()
    try:
        broker.publish([(mid, learn_event(f"S{k}", [f"s{k}"], X[k:k + 1], [k % 2]), None) for k in range(200)])
        broker.wait_published(1, consumer=cons)
    finally:
        assert cons.terminate() == 0, cons.log()
    # whatever was applied was acked and published: nothing pending, nothing applied without its result
    rows = _stream_rows(server.database_url, tenant_id)
    published = {b["event_id"] for s, b, h in broker.published()}
    assert {r[0] for r in rows} == published
    # it says so in a final line (issue 40), with what it applied
    last = cons.log().strip().splitlines()[-1]
    assert last.startswith("olu consume: stopped: ") and f"{len(rows)} applied" in last, cons.log()
    assert c.get(f"/v1/models/{mid}").json()["step"] == len(rows)


# ---- crash test -----------------------------------------------------------------------------------------------
KILLS = 10
N_EVENTS = 300


class Producer:
    """A bounded stream of learn and unlearn events for one model: each unlearn forgets records learned by an
    earlier event; published at a steady pace while the consumer is killed."""

    def __init__(self, broker: Broker, mid: str, seed: int):
        self.broker, self.mid, self.rng = broker, mid, random.Random(seed)
        self.events: list[dict] = []
        learned: list[str] = []
        n = 0
        for k in range(N_EVENTS):
            if len(learned) > 4 and self.rng.random() < 0.3:
                ids = self.rng.sample(learned, self.rng.randint(1, 2))
                for i in ids:
                    learned.remove(i)
                self.events.append(unlearn_event(f"ev{k}", ids))
            else:
                ids = [f"c{n + j}" for j in range(self.rng.randint(1, 3))]
                self.events.append(learn_event(f"ev{k}", ids, [X[(n + j) % len(X)] for j in range(len(ids))],
                                               [(n + j) % 2 for j in range(len(ids))]))
                n += len(ids)
                learned += ids
        self.done = threading.Event()

    def run(self) -> None:
        async def go():
            nc, js = await self.broker._conn()
            for ev in self.events:
                await js.publish(f"olu.{self.broker.tenant_id}.{self.mid}.events", json.dumps(ev).encode(),
                                 stream=self.broker.events)
                await asyncio.sleep(self.rng.uniform(0.0, 0.06))
            await nc.close()
        try:
            _run(go())
        finally:
            self.done.set()


def _crash(server, tenant_id, key, c, broker, tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    mid = create_model(c, dim=DIM)["id"]
    producer = Producer(broker, mid, seed)
    t = threading.Thread(target=producer.run, daemon=True)
    t.start()
    log = tmp_path / "consumer.log"
    kills, busy_kills = 0, 0
    from sqlalchemy import create_engine, text

    eng = create_engine(server.database_url.replace("postgresql://", "postgresql+psycopg://", 1))

    def recorded() -> int:
        with eng.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM stream_events WHERE tenant_id = :t"),
                                {"t": tenant_id}).scalar_one()

    cons = ConsumerProc(server, key, broker, log, "--batch", "8").start()
    try:
        while kills < KILLS:
            # wait until this consumer process is applying events, then kill it at a random point of its work
            before, deadline = recorded(), time.monotonic() + 20
            while recorded() == before and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.15))
            try:
                busy_kills += _consumer_in_flight(broker, f"olu-{tenant_id}") > 0
            except Exception:  # noqa: BLE001
                pass
            cons.kill()
            kills += 1
            cons = ConsumerProc(server, key, broker, log, "--batch", "8").start()
        t.join(timeout=60)
        assert producer.done.is_set()
        n_results = len(producer.events)
        got = broker.wait_published(n_results, timeout=60, consumer=cons)
    finally:
        cons.terminate()
        eng.dispose()
    replays = sum(1 for s, b, h in got if h.get("Olu-Replayed") == "true")
    note = f"(seed {seed}, {kills} kills, {busy_kills} with messages in flight, {replays} results re-published)"
    print(note)
    assert busy_kills >= 1, f"no kill hit the consumer at work {note}"
    first_copy: dict = {}
    for s, b, h in got:  # a re-published result is the stored one, byte for byte
        assert first_copy.setdefault((s, b["event_id"]), b) == b, note
    rows = _stream_rows(server.database_url, tenant_id)
    assert sorted(r[0] for r in rows) == sorted(e["id"] for e in producer.events), note  # each recorded once
    assert {r[2] for r in rows} == {"applied"}, f"an event was dead-lettered {note}"
    learned = sum(len(e["body"]["examples"]) for e in producer.events if e["kind"] == "learn")
    forgotten = [i for e in producer.events if e["kind"] == "unlearn" for i in e["body"]["ids"]]
    model = c.get(f"/v1/models/{mid}").json()
    assert model["step"] == model["n_records"] == learned, note
    assert model["n_forgotten"] == len(forgotten), note
    assert model["version"] == 1 + len({r[3] for r in rows}), f"a write was applied twice or unrecorded {note}"
    stored = {r["id"]: r for r in all_receipts(c, mid)}
    assert len(stored) == len(forgotten), note
    published = {}
    for s, b, h in got:
        for r in b.get("receipts", []):
            assert published.setdefault(r["id"], r) == r, note
    assert set(published) == set(stored), f"a receipt was not published, or one never stored was {note}"
    by_record = {}
    for r in stored.values():
        assert by_record.setdefault(r["record_commitment"], r["id"]) == r["id"], f"two receipts for a record {note}"
    return kills


def test_crash_sigkill_consumer_applies_every_event_exactly_once(server, tmp_path):
    tenant_id, key = server.new_tenant("crash")
    broker = Broker(tenant_id).create(keep_republished=True)
    try:
        with server.client(key) as c:
            assert _crash(server, tenant_id, key, c, broker, tmp_path) >= 10
    finally:
        broker.delete()



def test_two_consumer_processes_keep_each_models_order(setup, tmp_path):
    """Two processes share the durable consumer: every model's events are applied in stream order (an unlearn
    never overtakes the learn of its record; steps and versions grow with the stream sequence)."""
    server, tenant_id, key, c, broker = setup
    mids = [create_model(c, dim=DIM)["id"] for _ in range(3)]
    events, n = [], 0
    for k in range(90):
        mid = mids[k % 3]
        if k >= 9 and k % 5 == 0:  # forget the record learned by this model's event three rounds before
            events.append((mid, unlearn_event(f"o{k}", [f"x{k - 9}"]), None))
        else:
            events.append((mid, learn_event(f"o{k}", [f"x{k}"], X[k:k + 1], [k % 2]), None))
    cons = [ConsumerProc(server, key, broker, tmp_path / f"consumer{i}.log", "--batch", "4").start()
            for i in range(2)]
    try:
        broker.publish(events[:10])
        broker.wait_published(1, consumer=cons[0])  # the durable consumer exists; both processes are fetching
        broker.publish(events[10:])
        got = broker.wait_published(len(events), consumer=cons[0])
    finally:
        for p in cons:
            assert p.terminate() == 0
    dead = [b for s, b, h in got if s.endswith(".dead")]
    assert not dead, dead[:3]
    rows = _stream_rows(server.database_url, tenant_id)
    assert len(rows) == len(events)
    order = {e["id"]: i for i, (_, e, _) in enumerate(events)}
    model_of = {e["id"]: m for m, e, _ in events}
    for mid in mids:
        mine = sorted((r for r in rows if model_of[r[0]] == mid), key=lambda r: r[4])
        assert [order[r[0]] for r in mine] == sorted(order[r[0]] for r in mine)
        versions = [r[3] for r in mine]
        assert versions == sorted(versions)
    steps = {b["event_id"]: b["first_step"] for s, b, h in got if b.get("kind") == "learn"}
    for mid in mids:
        learned = [e["id"] for m, e, _ in events if m == mid and e["kind"] == "learn"]
        assert [steps[i] for i in learned] == sorted(steps[i] for i in learned)
