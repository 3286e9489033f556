"""Fair for every request shape (issue 37 item 1, findings F5-F and F5-G).

- F5-F: a feature-dictionary request is as large as the dense rows it becomes (rows x the model's hashed dim), not
  as its body: a predict is encoded and scored in chunks (its peak memory does not grow with the batch) and is
  answered on the event loop only when that real size is small; a learn whose encoded rows would exceed
  OLU_MAX_REQUEST_MEMORY is refused 413 before it is encoded, and a hashed model's max_learn_batch is filled in at
  creation so that a learn of that many fits.
- F5-G: an unlearn body is decoded and validated on a worker thread in the tenant's turn of the fair scheduler (it
  was decoded by an async dependency on the event loop), and a forget of ids never learned is answered 404 without
  checking the model's engine out (a checkout may replay its state log).

Peak memory is counted with tracemalloc (numpy reports its buffers to it); no wall-clock assertion.
"""
from __future__ import annotations

import asyncio
import json
import threading
import tracemalloc

import numpy as np
import pytest

import app.api.models as model_routes
from app.services.prediction import Prediction
from app import features as features_module
from app.features import featurize, featurize_many, normalize_spec

from .helpers import create_model

BIG_DIM = 100_000
MEMORY = 1 << 30  # the default OLU_MAX_REQUEST_MEMORY the session's server runs with
SPEC = {"type": "hashed", "dim": BIG_DIM, "categorical": ["c"], "numeric": {"n": [0, 1]}}


def _hashed(c, dim: int = BIG_DIM) -> dict:
    return create_model(c, dim=dim, bounds={"x_norm": 1.0}, features={**SPEC, "dim": dim})


def _learn(c, mid: str, n: int, prefix: str = "r"):
    ex = [{"id": f"{prefix}{i}", "features": {"c": f"v{i % 7}", "n": (i % 10) / 10}, "y": float(i % 2)}
          for i in range(n)]
    return c.post(f"/v1/models/{mid}/learn", json={"examples": ex})


def _peak(fn):
    """(result, peak bytes traced while ``fn`` ran), every thread of the process included (the server's too)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _problem(r, status: int, slug: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"].endswith("/" + slug), body
    return body


# ---- F5-F: feature dictionaries ------------------------------------------------------------------------------------

def test_featurize_many_by_chunks_is_the_one_shot_encoding(monkeypatch):
    spec = normalize_spec({"type": "hashed", "dim": 37, "categorical": ["c", "t"], "numeric": {"n": [-2, 3]}}, 37)
    rng = np.random.default_rng(5)
    rows = [{"c": f"v{int(rng.integers(0, 50))}", "t": [f"w{int(k)}" for k in rng.integers(0, 9, size=6)],
             "n": float(rng.uniform(-2, 3))} for _ in range(53)]
    for x_norm in (100.0, 0.7):  # inside the ball, and clipped onto it in place
        whole = featurize_many(spec, rows, x_norm)
        monkeypatch.setattr(features_module, "CHUNK_BYTES", 8 * 37 * 4)  # 4 rows per chunk
        assert features_module.chunk_rows(37) == 4
        chunked = featurize_many(spec, rows, x_norm)
        monkeypatch.undo()
        assert np.array_equal(whole, chunked)
        for i in (0, 3, 4, 52):  # each row is exactly featurize of it
            assert np.array_equal(chunked[i], featurize(spec, rows[i], x_norm))
        assert np.all(np.linalg.norm(chunked, axis=1) <= x_norm)


def test_hashed_predict_is_scored_in_chunks_within_its_memory(tenant):
    _, c = tenant
    mid = _hashed(c)["id"]
    assert _learn(c, mid, 20).status_code == 200
    rows = [{"c": f"v{i % 7}"} for i in range(1000)]  # ~14 KB of JSON, 800 MB as dense rows at once
    r, peak = _peak(lambda: c.post(f"/v1/models/{mid}/predict", json={"features": rows}))
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == 1000
    assert peak < 100 << 20, peak  # chunks of 8 MiB of rows (and the body's objects), not 800 MB
    # the same answers as one input at a time
    for i in (0, 6, 999):
        one = c.post(f"/v1/models/{mid}/predict", json={"features": [rows[i]]}).json()
        assert one["scores"][0] == r.json()["scores"][i] and one["predictions"][0] == r.json()["predictions"][i]
    # a refused dictionary is named by its place in the whole request, past the first chunk
    bad = rows[:30] + [{"nope": "x"}]
    p = _problem(c.post(f"/v1/models/{mid}/predict", json={"features": bad}), 422, "unknown-feature")
    assert p["index"] == 30


def test_hashed_predict_goes_to_a_worker_by_its_real_size(tenant, server, monkeypatch):
    tenant_id, c = tenant
    sched = server.app.state.ctx.scheduler
    assert sched is not None
    turns: list = []
    slot = sched.slot

    def recorded(tid):
        turns.append(tid)
        return slot(tid)

    big, small = _hashed(c)["id"], _hashed(c, dim=16)["id"]
    for mid in (big, small):
        assert _learn(c, mid, 20).status_code == 200
    monkeypatch.setattr(sched, "slot", recorded)
    inline = server.backend == "sqlite"  # PostgreSQL reads keep the worker-thread hop
    # a prediction scores a dictionary's tokens (sparse rows), not its 10^5 dense values: one row is the loop's at any
    # hashed dim; more rows than INLINE_HASHED_ROWS (each hashed in Python) go to a worker in the tenant's turn
    for mid in (big, small):
        assert c.post(f"/v1/models/{mid}/predict", json={"features": [{"c": "v1"}]}).status_code == 200
    assert turns == ([] if inline else [tenant_id] * 2)
    turns.clear()
    rows = Prediction.INLINE_HASHED_ROWS + 1
    r = c.post(f"/v1/models/{big}/predict", json={"features": [{"c": f"v{i}"} for i in range(rows)]})
    assert r.status_code == 200 and len(r.json()["predictions"]) == rows
    assert turns == [tenant_id]


def test_hashed_model_learn_batch_fits_the_request_memory(tenant):
    _, c = tenant
    m = _hashed(c)
    assert m["hyperparameters"]["max_learn_batch"] <= MEMORY // (8 * BIG_DIM)  # 1 342 rows of 10^5 float64
    small = _hashed(c, dim=16)
    assert (small["hyperparameters"].get("max_learn_batch") or 10_000) > 1_342  # the memory bound does not bind


def test_hashed_learn_past_request_memory_is_413_before_encoding(tenant):
    _, c = tenant
    mid = _hashed(c)["id"]
    before = c.get(f"/v1/models/{mid}").json()
    n = MEMORY // (8 * BIG_DIM) + 100  # 1 442 dictionaries, 20 KB of JSON, 1.15 GB once encoded
    r, peak = _peak(lambda: _learn(c, mid, n))
    p = _problem(r, 413, "batch-too-large")
    assert "OLU_MAX_REQUEST_MEMORY" in p["detail"] and p["limit"] == MEMORY and p["max_rows"] == 1_342
    assert peak < 100 << 20, peak  # refused before a row was encoded
    after = c.get(f"/v1/models/{mid}").json()
    assert (after["version"], after["n_records"]) == (before["version"], before["n_records"])
    assert c.get("/v1/operations", params={"model_id": mid}).json()["items"] == []


# ---- F5-G: unlearn bodies and the cheap 404 ----------------------------------------------------------------------

def test_unlearn_body_is_decoded_on_a_worker_in_the_tenants_turn(tenant, server, monkeypatch):
    tenant_id, c = tenant
    mid = create_model(c)["id"]
    ex = [{"id": f"u{i}", "x": [0.1 * i, 0.2, 0.0, 0.1], "y": float(i % 2)} for i in range(4)]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    sched = server.app.state.ctx.scheduler
    seen: list = []
    parse = model_routes.parse_json_body

    def recorded(model, raw, content_type):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((on_loop, threading.current_thread() is threading.main_thread(), sched.running(tenant_id)))
        return parse(model, raw, content_type)

    monkeypatch.setattr(model_routes, "parse_json_body", recorded)
    monkeypatch.setattr(model_routes, "INLINE_BODY_BYTES", 16)
    body = json.dumps({"ids": ["u0"]}, indent=8)  # above the (lowered) inline bound
    r = c.post(f"/v1/models/{mid}/unlearn", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert seen == [(False, False, 1)]  # off the event loop, holding the tenant's slot
    # malformed bodies: the same answers on the worker as on the loop
    for content, kind in ((b'{"ids": ["u1", ' + b" " * 64, "json_invalid"),
                          (json.dumps({"ids": [7]}, indent=8).encode(), "string_type")):
        off = c.post(f"/v1/models/{mid}/unlearn", content=content, headers={"content-type": "application/json"})
        monkeypatch.setattr(model_routes, "INLINE_BODY_BYTES", 1 << 20)
        on = c.post(f"/v1/models/{mid}/unlearn", content=content, headers={"content-type": "application/json"})
        monkeypatch.setattr(model_routes, "INLINE_BODY_BYTES", 16)
        assert off.status_code == 422 and kind in off.text, off.text
        assert (off.status_code, off.json()) == (on.status_code, on.json())
    assert sched.busy == 0 and sched.waiting() == 0


@pytest.mark.parametrize("prefer", [None, "respond-async"])
def test_forget_of_ids_never_learned_does_no_replay(tenant, server, monkeypatch, prefer):
    _, c = tenant
    mid = create_model(c)["id"]
    ex = [{"id": f"k{i}", "x": [0.1, 0.2 * (i % 3), 0.0, 0.1], "y": float(i % 2)} for i in range(6)]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    registry = server.app.state.ctx.models.core.registry
    checkouts: list = []
    checkout = registry.checkout

    def counted(*args, **kwargs):
        checkouts.append(args[0])
        return checkout(*args, **kwargs)

    monkeypatch.setattr(registry, "checkout", counted)
    headers = {"prefer": prefer} if prefer else {}
    for ids in (["never"], ["k0", "never-1", "never-2"]):
        r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ids}, headers=headers)
        _problem(r, 404, "record-not-found")
    assert checkouts == []  # neither the request path nor the operation's start checked the engine out
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["k1", "k2"]}, headers=headers)
    assert r.status_code == (202 if prefer else 200), r.text
    assert checkouts  # a real forget does
