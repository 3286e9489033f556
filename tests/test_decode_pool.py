"""Large learn bodies are decoded in the decode pool's process (issue 37, F5-G; app/api/decode_pool.py), with the
same answers as when decoded in the server's own process: the same learn, the same refusals, the same
idempotency fingerprint (a retry replays)."""
from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

import app.api.models as model_routes
from app.api.decode_pool import _answer, decode_learn

from .helpers import create_model, unit_rows


def _warm(pool) -> None:
    """Wait for the pool's first process (``DecodePool.warm``: until it answers, optional work stays in the server)."""
    import time

    deadline = time.monotonic() + 120
    while not pool.warm():
        assert time.monotonic() < deadline, "the decode pool did not start"
        time.sleep(0.05)


def _bodies(n: int, d: int, prefix: str) -> dict[str, tuple[bytes, str]]:
    X = unit_rows(n, d, seed=len(prefix))
    ids = [f"{prefix}{i}" for i in range(n)]
    y = [float(i % 2) for i in range(n)]
    return {
        "examples": (json.dumps({"examples": [{"id": f"e-{i}", "x": x, "y": v} for i, x, v in
                                              zip(ids, X.tolist(), y)]}).encode(), "application/json"),
        "columnar": (json.dumps({"ids": [f"c-{i}" for i in ids], "x": X.tolist(), "y": y}).encode(),
                     "application/json"),
        "msgpack": (msgpack.packb({"ids": [f"m-{i}" for i in ids], "x": X.astype("<f8").tobytes(),
                                   "y": np.asarray(y).astype("<f8").tobytes()}), "application/msgpack"),
    }


@pytest.fixture
def pool_only(server, monkeypatch):
    """Every learn body above 1 KiB goes to the pool; decoding one in the server's process fails the test."""
    ctx = server.app.state.ctx
    assert ctx.decode_pool is not None
    monkeypatch.setattr(ctx.settings, "decode_process_bytes", 1024)

    def here(*_a, **_k):
        raise AssertionError("a large body was decoded in the server's process")

    monkeypatch.setattr(model_routes, "parse_learn_body", here)
    return ctx


def test_large_learn_bodies_are_decoded_in_the_pool(tenant, pool_only, monkeypatch):
    from app.api import decode_pool

    received = []

    class Watched(decode_pool.Chunks):  # what the route hands the pool: the body's chunks, not joined bytes
        def __init__(self, chunks):
            super().__init__(chunks)
            received.append(self.size)
    monkeypatch.setattr(model_routes, "Chunks", Watched)

    def elsewhere(*_a, **_k):
        raise AssertionError("a pooled body's commitments were computed again")

    monkeypatch.setattr(pool_only.models.core, "commitments", elsewhere)  # they come with the decoded body
    _, c = tenant
    mid = create_model(c, dim=8)["id"]
    step = 0
    for shape, (raw, ctype) in _bodies(40, 8, "p").items():
        assert len(raw) > 1024
        headers = {"content-type": ctype, "idempotency-key": f"k-{shape}"}
        r = c.post(f"/v1/models/{mid}/learn", content=raw, headers=headers)
        assert r.status_code == 200, (shape, r.text)
        assert r.json()["accepted"] == 40 and r.json()["first_step"] == step + 1
        step = r.json()["last_step"]
        again = c.post(f"/v1/models/{mid}/learn", content=raw, headers=headers)  # same fingerprint: a replay
        assert again.json() == r.json() and again.headers.get("idempotent-replayed") == "true", shape
    assert c.get(f"/v1/models/{mid}").json()["n_records"] == 120
    assert pool_only.decode_pool.started >= 1
    assert len(received) == 6  # each of the 3 bodies and its replay reached the pool as chunks, never joined here


def test_refusals_from_the_pool_are_the_in_process_ones(tenant, server, pool_only, monkeypatch):
    _, c = tenant
    mid = create_model(c, dim=8)["id"]
    X = unit_rows(60, 8).tolist()
    bad = {
        "not json": b'{"ids": ["a"], "x": [[0.1, ' + b" " * 2048,
        "a string among numbers": json.dumps({"ids": [f"s{i}" for i in range(60)], "x": [["a"] + r[1:] for r in X],
                                              "y": [0.0] * 60}).encode(),
        "ragged rows": json.dumps({"ids": [f"r{i}" for i in range(60)], "x": [r[: 1 + i % 8] for i, r in
                                                                             enumerate(X)], "y": [0.0] * 60}).encode(),
        "example without y": json.dumps({"examples": [{"id": f"y{i}", "x": r} for i, r in enumerate(X)]}).encode(),
    }
    answers = {}
    for name, raw in bad.items():
        assert len(raw) > 1024
        r = c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": "application/json"})
        assert r.status_code in (400, 413, 422), (name, r.text)
        answers[name] = (r.status_code, r.json())
    monkeypatch.undo()  # the same bodies decoded in the server's process
    for name, raw in bad.items():
        r = c.post(f"/v1/models/{mid}/learn", content=raw, headers={"content-type": "application/json"})
        assert (r.status_code, r.json()) == answers[name], name
    assert c.get(f"/v1/models/{mid}").json()["n_records"] == 0


def test_decode_learn_sends_rows_back_as_arrays():
    from app.services.records import commitment_digests

    X = unit_rows(5, 3)
    raw = json.dumps({"examples": [{"id": f"a{i}", "x": x, "y": 1} for i, x in enumerate(X.tolist())]}).encode()
    out = decode_learn(raw, "application/json", fingerprint=True)
    assert out[0] == "examples" and isinstance(out[2], np.ndarray) and np.array_equal(out[2], X)
    batch = _answer(out)
    assert batch.ids == [f"a{i}" for i in range(5)] and batch.F is None and batch.digests is None
    keyed = _answer(decode_learn(raw, "application/json", fingerprint=False, key=b"k" * 32))
    assert list(keyed.digests) == commitment_digests(b"k" * 32, batch.ids)  # the commitments, computed there
    assert json.loads(batch.model.model_dump_json())["examples"][0]["y"] == 1.0


def test_large_predict_evaluate_and_unlearn_bodies_are_decoded_in_the_pool(tenant, server, monkeypatch):
    _, c = tenant
    mid = create_model(c, dim=8)["id"]
    X = unit_rows(400, 8, seed=3)
    ex = [{"id": f"q{i}", "x": x, "y": float(i % 2)} for i, x in enumerate(X.tolist())]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    predict = json.dumps({"x": X.tolist()}).encode()
    evaluate = json.dumps({"x": X.tolist(), "y": [float(i % 2) for i in range(400)]}).encode()
    forget = json.dumps({"ids": [f"q{i}" for i in range(300)]}, indent=64).encode()
    assert min(map(len, (predict, evaluate, forget))) > max(16_384, 1024)
    json_type = {"content-type": "application/json"}
    here = {"predict": c.post(f"/v1/models/{mid}/predict", content=predict, headers=json_type).json(),
            "evaluate": c.post(f"/v1/models/{mid}/evaluate", content=evaluate, headers=json_type).json()}

    def refuse(*_a, **_k):
        raise AssertionError("a large body was decoded in the server's process")

    monkeypatch.setattr(server.app.state.ctx.settings, "decode_process_bytes", 1024)
    monkeypatch.setattr(model_routes, "parse_json_body", refuse)  # predict's and evaluate's (decode_inputs)
    monkeypatch.setattr(server.app.state.ctx.models.core, "commitments", refuse)  # the forget's: from the pool
    assert c.post(f"/v1/models/{mid}/predict", content=predict, headers=json_type).json() == here["predict"]
    pooled = c.post(f"/v1/models/{mid}/evaluate", content=evaluate, headers=json_type).json()
    assert {k: v for k, v in pooled.items() if k != "evaluated_at"} == {
        k: v for k, v in here["evaluate"].items() if k != "evaluated_at"}
    bad = c.post(f"/v1/models/{mid}/predict", content=json.dumps({"x": [[0.1] * 7] * 800}).encode(),
                 headers=json_type)
    assert bad.status_code == 422 and "invalid-dimension" in bad.json()["type"]
    bad = c.post(f"/v1/models/{mid}/unlearn", content=json.dumps({"ids": [1] * 400}, indent=64).encode(),
                 headers=json_type)
    assert bad.status_code == 422 and "string_type" in bad.text
    headers = {**json_type, "idempotency-key": "pool-forget"}
    r = c.post(f"/v1/models/{mid}/unlearn", content=forget, headers=headers)
    assert r.status_code in (200, 202), r.text
    again = c.post(f"/v1/models/{mid}/unlearn", content=forget, headers=headers)  # the same fingerprint: a replay
    assert again.status_code == r.status_code and again.json() == r.json()
    assert again.headers.get("idempotent-replayed") == "true"
    monkeypatch.undo()  # the same key with the same body decoded in the server's process: the same fingerprint
    same = c.post(f"/v1/models/{mid}/unlearn", content=forget, headers=headers)
    assert same.json() == r.json() and same.headers.get("idempotent-replayed") == "true"


def test_the_pool_moves_large_rows_as_raw_bytes_and_replaces_a_dead_process():
    """The pool's own transport (decode_pool._Worker): a body goes down as the chunks the server received (never
    joined in its process), rows of megabytes come back bit for bit into their array (not pickled), a process is
    reused, and one that died answers 503 not-ready, changes nothing, and is replaced."""
    import os
    import signal

    from app.api.decode_pool import ARRAY_BYTES, Chunks, DecodePool
    from app.errors import Problem

    rng = np.random.default_rng(5)
    X = rng.standard_normal((20_000, 16))
    y = rng.integers(0, 2, 20_000).astype("<f8")
    assert X.nbytes >= ARRAY_BYTES
    raw = msgpack.packb({"ids": [f"r{i}" for i in range(20_000)], "x": X.astype("<f8").tobytes(), "y": y.tobytes()})
    pool = DecodePool(1)
    try:
        pieces = Chunks([raw[a:a + 65_536] for a in range(0, len(raw), 65_536)])  # as the server received it
        assert len(pieces) == len(raw)
        for body in (raw, pieces):
            batch = pool.learn_body(body, "application/msgpack", False)
            assert np.array_equal(np.asarray(batch.X), X) and np.asarray(batch.X).dtype == np.float64
            assert list(batch.ids[:2]) == ["r0", "r1"] and len(batch.ids) == 20_000
        assert pool.started == 1
        worker = pool._idle.queue[0]
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.join(5)
        with pytest.raises(Problem) as e:
            pool.learn_body(raw, "application/msgpack", False)
        assert e.value.status == 503 and e.value.slug == "not-ready"
        assert pool.started == 0
        again = pool.learn_body(raw, "application/msgpack", False)  # a fresh process
        assert np.array_equal(np.asarray(again.X), X) and pool.started == 1
    finally:
        pool.shutdown()


def test_a_decoder_failure_in_the_pool_is_an_error_not_a_dead_process(monkeypatch):
    """A decoder that raises (a bug, not a refusal) is raised in the server as an error; the process lives on."""
    from app.api import decode_pool as dp

    pool = dp.DecodePool(1)
    try:
        with pytest.raises(RuntimeError, match="decoding in the pool failed"):
            pool._run("decode_json", b"{}", kind="no-such-kind", content_type="application/json", fingerprint=False)
        assert pool.started == 1 and pool._idle.qsize() == 1  # the same process serves the next body
        x, features, y = pool.inputs("predict", b'{"x": [[0.5, 0.25]]}', "application/json")
        assert np.asarray(x).tolist() == [[0.5, 0.25]] and y is None
    finally:
        pool.shutdown()


def test_hashed_predicts_are_hashed_in_the_pool_with_the_same_answers(tenant, server, monkeypatch):
    """A hashed model's predict body above the loop's size, and its evaluate bodies, are decoded, validated and hashed
    into sparse rows in the pool (their Python work off the server's GIL: fairness bench, hashed predict): the same
    scores, bit for bit, and the same refusals as hashed in the server's process."""
    import app.services.prediction as prediction_service

    ctx = server.app.state.ctx
    _, c = tenant
    spec = {"type": "hashed", "dim": 1000, "categorical": ["c"], "numeric": {"n": [0, 1]},
            "unknown_fields": "refuse"}
    mid = create_model(c, dim=1000, features=spec)["id"]
    learn = [{"id": f"h{i}", "features": {"c": f"v{i % 13}", "n": (i % 10) / 10}, "y": float(i % 2)}
             for i in range(40)]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": learn}).status_code == 200
    rows = [{"c": [f"v{i % 13}", f"w{i % 5}"], "n": (i % 10) / 10} for i in range(300)]
    bodies = {
        "dictionaries": {"features": rows},
        "an unknown field": {"features": rows[:200] + [{"zz": "a"}] + rows[:10]},
        "out of range": {"features": rows[:250] + [{"n": 5.0}]},
        "more than the batch": {"features": rows + rows},
        "dense rows for a hashed model": {"x": [[0.01] * 1000] * 3},
    }
    monkeypatch.setattr(ctx.settings, "max_batch", 500)
    raw = {name: json.dumps(b).encode() for name, b in bodies.items()}
    raw["not json"] = b'{"features": [{"c": "a"}, ' + b" " * 5000
    assert min(map(len, raw.values())) > prediction_service.Prediction.INLINE_BODY_BYTES  # a worker's, not the loop's
    targets = {name: mid for name in raw} | {"no such model": "mdl_nosuchmodel"}
    raw["no such model"] = raw["dictionaries"]
    labels = [float(i % 2) for i in range(300)]
    raw["evaluate"] = json.dumps({"features": rows, "y": labels}).encode()
    raw["evaluate, an unknown field"] = json.dumps({"features": rows[:299] + [{"zz": "a"}], "y": labels}).encode()

    def answers() -> dict:
        out = {}
        for name, body in raw.items():
            route = "evaluate" if name.startswith("evaluate") else "predict"
            r = c.post(f"/v1/models/{targets.get(name, mid)}/{route}", content=body,
                       headers={"content-type": "application/json"})
            out[name] = (r.status_code, {k: v for k, v in r.json().items() if k != "evaluated_at"})
        return out

    pool = ctx.decode_pool
    monkeypatch.setattr(ctx, "decode_pool", None)
    here = answers()
    assert here["dictionaries"][0] == 200 and len(here["dictionaries"][1]["scores"]) == 300
    assert [here[k][0] for k in ("an unknown field", "out of range", "more than the batch",
                                 "dense rows for a hashed model", "not json", "no such model", "evaluate",
                                 "evaluate, an unknown field")] == [422, 422, 413, 422, 422, 404, 200, 422]
    monkeypatch.setattr(ctx, "decode_pool", pool)

    def refuse(*_a, **_k):
        raise AssertionError("a hashed predict body was decoded or hashed in the server's process")

    monkeypatch.setattr(model_routes, "parse_json_body", refuse)
    monkeypatch.setattr(prediction_service, "sparse_rows", refuse)
    _warm(pool)
    started = pool.started
    pooled = answers()
    for name in raw:
        if name in ("more than the batch", "no such model", "not json"):
            continue  # decoded in the pool but not hashed there (too many rows), or never hashed
        assert pooled[name] == here[name], name
    monkeypatch.undo()
    assert pool.started >= max(1, started)
    monkeypatch.setattr(ctx.settings, "max_batch", 500)
    assert answers() == here  # the refusals the pool passed on to the server's own checks, unchanged


def test_many_ids_are_committed_in_the_pool_with_the_same_digests(tenant, server, monkeypatch):
    """A learn's or an unlearn's commitments of at least POOLED_IDS ids are computed in the pool (their HMAC loop
    off the server's GIL), equal to the server's own; fewer ids, and ids holding a newline, stay here."""
    import os

    from app.api import decode_pool as dp
    from app.services import records

    ctx = server.app.state.ctx
    pool = ctx.decode_pool
    assert ctx.models.core.commitments == pool.commitments
    _warm(pool)
    key = os.urandom(32)
    ids = [f"id-{i}-é" + "x" * (i % 300) for i in range(dp.POOLED_IDS + 5)]
    mine = records.commitment_digests(key, ids)
    calls: list = []
    run = pool._run
    monkeypatch.setattr(pool, "_run", lambda name, *a, **k: calls.append(name) or run(name, *a, **k))
    assert list(pool.commitments(key, ids)) == mine and calls == ["hash_ids"]
    assert pool.commitments(key, ids[:10]) == mine[:10] and calls == ["hash_ids"]
    odd = ids[:-1] + ["a\nb"]
    assert pool.commitments(key, odd) == records.commitment_digests(key, odd) and calls == ["hash_ids"]
    # through the API: a learn and a forget of POOLED_IDS records, their commitments from the pool
    _, c = tenant
    mid = create_model(c, dim=4)["id"]
    X = unit_rows(dp.POOLED_IDS, 4, seed=5)
    names = [f"r{i}" for i in range(dp.POOLED_IDS)]
    labels = [float(i % 2) for i in range(len(names))]
    r = c.post(f"/v1/models/{mid}/learn", json={"ids": names, "x": X.tolist(), "y": labels})
    assert r.status_code == 200, r.text
    assert calls == ["hash_ids", "hash_ids"]
    missing = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"never{i}" for i in range(dp.POOLED_IDS)]})
    assert missing.status_code == 404
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": names}, headers={"prefer": "wait=1"})
    assert r.status_code == 200, r.text
    assert len(r.json()["receipts"]) == dp.POOLED_IDS and calls.count("hash_ids") == 4
    assert c.get(f"/v1/models/{mid}").json()["n_forgotten"] == dp.POOLED_IDS


def test_a_cold_pool_leaves_optional_work_here_until_its_first_process_answers():
    """``warm``: while the pool's first process starts (1-3 s of imports), the work the pool only speeds up for the
    others (commitments, a hashed model's small bodies) is done in the server, never waiting for it; then there."""
    from app.api.decode_pool import POOLED_IDS, DecodePool
    from app.services.records import commitment_digests

    pool = DecodePool(1)
    try:
        calls: list = []
        run = pool._run
        pool._run = lambda name, *a, **k: calls.append(name) or run(name, *a, **k)
        ids = [f"i{i}" for i in range(POOLED_IDS)]
        key = b"k" * 32
        assert pool.commitments(key, ids) == commitment_digests(key, ids)  # cold: computed here; the pool starts
        assert "hash_ids" not in calls
        _warm(pool)
        assert calls[0] == "ping"
        assert list(pool.commitments(key, ids)) == commitment_digests(key, ids) and calls[-1] == "hash_ids"
    finally:
        pool.shutdown()


def test_packed_digests_read_as_the_list_they_pack():
    from app.db.record_batches import PackedDigests, lookups_of, packed_digests

    digests = [bytes([i]) * 32 for i in range(7)]
    p = PackedDigests(b"".join(digests))
    assert len(p) == 7 and list(p) == digests and p[-1] == digests[-1] and p[3] == digests[3]
    assert list(p[2:5]) == digests[2:5] and list(p[5:2]) == [] and p[::2] == digests[::2]
    assert packed_digests(p[1:4]) == b"".join(digests[1:4]) and packed_digests(digests) == p.packed
    assert digests[4] in p and p.index(digests[6]) == 6
    assert (lookups_of(p) == lookups_of(digests)).all()
    with pytest.raises(IndexError):
        p[7]
    with pytest.raises(ValueError):
        PackedDigests(b"x" * 33)


def test_a_pool_that_cannot_start_is_not_retried_on_every_request(monkeypatch):
    """``warm`` after a failed start: no new process for WARM_RETRY_S (each try spawns one), the work stays here."""
    import time

    from app.api import decode_pool as dp

    pool = dp.DecodePool(1)
    tries: list = []

    def broken(name, *_a, **_k):
        tries.append(name)
        raise dp.Problem(503, "not-ready", "no process")

    monkeypatch.setattr(pool, "_run", broken)
    assert pool.warm() is False
    deadline = time.monotonic() + 10
    while pool._warming and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tries == ["ping"] and pool._retry_at > time.monotonic()
    assert [pool.warm() for _ in range(20)] == [False] * 20 and tries == ["ping"]
    monkeypatch.setattr(pool, "_retry_at", 0.0)  # the wait is over: one more try
    pool.warm()
    while pool._warming and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tries == ["ping", "ping"]


def test_a_models_hashed_spec_is_read_once(tenant, server, monkeypatch):
    """``Prediction.hashed_spec`` (asked for every predict body too large for the event loop, dense models too)
    reads a model's spec once: later large predicts make no read beyond the predict's own."""
    from app.services.prediction import Prediction

    prediction = server.app.state.ctx.models.prediction
    reads: list = []
    lookup = Prediction._lookup
    monkeypatch.setattr(Prediction, "_lookup", lambda self, *a, **k: reads.append(a) or lookup(self, *a, **k))
    _, c = tenant
    mid = create_model(c, dim=8)["id"]
    X = unit_rows(100, 8, seed=4)
    assert c.post(f"/v1/models/{mid}/learn", json={"ids": [f"s{i}" for i in range(100)], "x": X.tolist(),
                                                   "y": [float(i % 2) for i in range(100)]}).status_code == 200
    body = json.dumps({"x": X.tolist()}).encode()
    assert len(body) > prediction.INLINE_BODY_BYTES
    answers = [c.post(f"/v1/models/{mid}/predict", content=body, headers={"content-type": "application/json"})
               for _ in range(3)]
    assert [r.status_code for r in answers] == [200] * 3
    assert server.app.state.ctx.decode_pool is not None  # (hashed_spec is asked only with a pool)
    assert len(reads) == 4  # the spec once, then one read per predict
    assert prediction.hashed_spec(*reads[0][:2]) is None and len(reads) == 4  # kept: a dense model
