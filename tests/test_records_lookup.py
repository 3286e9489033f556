"""Learned records are packed per learn request (record_batches) and found through a per-process index of the first
8 bytes of their commitments; forgotten records have a row in ``records``, indexed by the same 8 bytes.  The full
commitment and the model decide."""
from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
import numpy as np
from sqlalchemy import select, update

from app.config import Settings
from app.db.record_batches import SLOT_BITS, RecordIndex, lookups_of
from app.db.tables import Record, RecordBatch
from app.errors import Problem
from app.main import create_app
from app.services.records import commitment, lookup_key

SPEC = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 2, "bounds": {"x_norm": 1.0, "y_abs": 1.0},
        "domain_radius": 5.0, "l2": 0.1, "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}


@given(st.binary(min_size=32, max_size=32))
def test_lookup_key_is_the_signed_big_endian_prefix(digest):
    assert lookup_key(digest.hex()) == int.from_bytes(digest[:8], "big", signed=True)


@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=20))
def test_lookups_of_digests_match_lookup_key(digests):
    assert lookups_of(digests).tolist() == [lookup_key(d.hex()) for d in digests]


@given(st.lists(st.lists(st.integers(-4, 4), min_size=1, max_size=40), min_size=1, max_size=30),
       st.lists(st.integers(-5, 5), min_size=1, max_size=10))
def test_index_finds_exactly_the_equal_lookups(batches, queries):
    """Against a brute-force scan, through every merge of runs; values drawn from a tiny range so that most
    lookups collide."""
    idx = RecordIndex()
    held = []
    for b, values in enumerate(batches, start=1):
        idx.add(b * 3, np.array(values, dtype=np.int64))  # ids increase with gaps, as a sequence gives them
        held += [(v, (b * 3) << SLOT_BITS | slot) for slot, v in enumerate(values)]
        idx.add(b * 3, np.array([99], dtype=np.int64))  # a batch seen again is ignored
    assert idx.size == len(held)
    assert len(idx.runs) <= 2 + int(np.log2(len(held)))  # runs of similar size were merged
    for keys, _ in idx.runs:
        assert np.all(np.diff(keys) >= 0)
    q = np.array(queries, dtype=np.int64)
    expect = sorted((qi, p) for qi, v in enumerate(queries) for w, p in held if w == v)
    assert sorted(idx.candidates(q)) == expect


@pytest.fixture()
def ctx(backend):
    _, url, data_dir = backend  # SQLite and, when configured, PostgreSQL
    app = create_app(Settings(data_dir=Path(data_dir), log_level="WARNING", database_url=url))
    yield app.state.ctx
    app.state.ctx.db.dispose()


def _force_lookup(ctx, model_id: str, held_id: str, like_id: str, tenant_id: str) -> None:
    """Give the stored record ``held_id`` the first 8 bytes of ``like_id``'s commitment: a prefix collision, made
    on purpose (``held_id`` itself can no longer be found; the entry only collides)."""
    with ctx.db.write() as s:
        key = ctx.models._record_key(s, tenant_id)
        held, like = commitment(key, held_id), commitment(key, like_id)
        for bid, digests in s.execute(select(RecordBatch.id, RecordBatch.commitments)
                                      .where(RecordBatch.model_id == model_id)).all():
            for slot in range(len(digests) // 32):
                if digests[32 * slot:32 * slot + 32].hex() == held:
                    forged = bytes.fromhex(like[:16] + held[16:])
                    digests = digests[:32 * slot] + forged + digests[32 * slot + 32:]
                    s.execute(update(RecordBatch).where(RecordBatch.id == bid).values(commitments=digests))
    ctx.models.records.evict(model_id)  # the index is rebuilt from the forged rows


def test_prefix_collisions_neither_clash_nor_mix_up_records(ctx):
    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    ctx.models.learn(t, m, ["a"], [[0.1, 0.2]], [1.0])
    _force_lookup(ctx, m, "a", "b", t)
    ctx.models.learn(t, m, ["b"], [[0.2, 0.1]], [0.0])  # same lookup, different commitment: not a duplicate
    out = ctx.models.unlearn(t, m, ["b"])
    with ctx.db.read() as s:
        key = ctx.models._record_key(s, t)
    assert out["receipts"][0]["record_commitment"] == commitment(key, "b")
    assert ctx.models.record_status(t, "b")["models"][0]["status"] == "forgotten"
    with ctx.db.read() as s:
        rows = s.execute(select(Record.commitment, Record.status).where(Record.model_id == m)).all()
        digests = s.execute(select(RecordBatch.commitments).where(RecordBatch.model_id == m)
                            .order_by(RecordBatch.id)).scalars().all()
    assert rows == [(commitment(key, "b"), "forgotten")]  # the entry sharing b's lookup was left alone
    assert digests[0][:8] == digests[1][:8] and digests[0] != digests[1]  # the collision really was there
    with pytest.raises(Problem) as e:
        ctx.models.learn(t, m, ["b"], [[0.0, 0.0]], [1.0])  # b is found among the colliding entries
    assert e.value.status == 409


def test_same_record_id_in_two_models_of_a_tenant(ctx):
    t = ctx.tenants.create_tenant("t")["id"]
    m1, m2 = ctx.models.create(t, SPEC)["id"], ctx.models.create(t, SPEC)["id"]
    ids = [secrets.token_hex(4) for _ in range(50)]
    X, y = [[0.01 * i, 0.0] for i in range(50)], [float(i % 2) for i in range(50)]
    ctx.models.learn(t, m1, ids, X, y)
    ctx.models.learn(t, m2, ids, X, y)  # same commitments, other model: accepted
    ctx.models.unlearn(t, m1, ids[:3])
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m1, ids[:1])
    assert e.value.status == 409 and e.value.slug == "record-already-forgotten"
    status = {m["model_id"]: m["status"] for m in ctx.models.record_status(t, ids[0])["models"]}
    assert status == {m1: "forgotten", m2: "learned"}
    with pytest.raises(Problem) as e:
        ctx.models.learn(t, m2, ["new", ids[7]], X[:2], y[:2])
    assert e.value.status == 409 and ids[7] in e.value.detail
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m2, ["new"])  # the refused batch learned nothing
    assert e.value.status == 404


def test_batches_larger_than_one_in_chunk(ctx):
    """Learn and unlearn batches beyond the 500-key chunk (SQLite) / one array parameter (PostgreSQL)."""
    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    ids = [f"big-{i}" for i in range(1100)]
    ctx.models.learn(t, m, ids, [[0.0005 * i, 0.1] for i in range(1100)], [float(i % 2) for i in range(1100)])
    with pytest.raises(Problem) as e:  # the clash sits in the third chunk
        ctx.models.learn(t, m, ["fresh-1", "big-1050"], [[0.0, 0.0], [0.1, 0.0]], [1.0, 0.0])
    assert e.value.status == 409 and "big-1050" in e.value.detail
    out = ctx.models.unlearn(t, m, ids[::2][:520])
    assert len(out["receipts"]) == 520
    statuses = {rid: ctx.models.record_status(t, rid)["models"][0]["status"] for rid in (ids[0], ids[1], ids[1038])}
    assert statuses == {ids[0]: "forgotten", ids[1]: "learned", ids[1038]: "forgotten"}


def test_another_process_sees_every_batch(backend):
    """Two service instances on one database (two workers or replicas): each one's index catches up on the
    batches the other wrote, for the duplicate check, unlearn and the audit; a full eviction changes nothing."""
    _, url, data_dir = backend
    apps = [create_app(Settings(data_dir=Path(data_dir), log_level="WARNING", database_url=url,
                                record_index_max_entries=n)) for n in (10**6, 1)]
    one, two = (a.state.ctx for a in apps)
    try:
        t = one.tenants.create_tenant("t")["id"]
        m, m2 = one.models.create(t, SPEC)["id"], one.models.create(t, SPEC)["id"]
        for k in range(4):  # alternate writers; the second keeps at most one model's index (evicts the other)
            svc = (one, two)[k % 2].models
            svc.learn(t, m, [f"r{k}-{i}" for i in range(30)], [[0.01 * i, 0.0] for i in range(30)],
                      [float(i % 2) for i in range(30)])
            svc.learn(t, m2, [f"s{k}"], [[0.0, 0.1]], [1.0])
        for svc in (one.models, two.models):
            for k in range(4):
                with pytest.raises(Problem) as e:
                    svc.learn(t, m, ["new", f"r{k}-7"], [[0.0, 0.0], [0.1, 0.0]], [1.0, 0.0])
                assert e.value.status == 409 and f"r{k}-7" in e.value.detail
        two.models.unlearn(t, m, ["r0-3"])
        with pytest.raises(Problem) as e:
            one.models.unlearn(t, m, ["r0-3"])
        assert e.value.slug == "record-already-forgotten"
        assert one.models.unlearn(t, m, ["r3-29"])["receipts"][0]["learned_step"] == 120
        assert [x["status"] for x in two.models.record_status(t, "r3-29")["models"]] == ["forgotten"]
        assert two.models.record_status(t, "s2")["models"] == [
            {"model_id": m2, "status": "learned", "step": 3, "receipt_id": None}]
    finally:
        for a in apps:
            a.state.ctx.db.dispose()


def test_forgetting_zeroes_only_that_records_example_mac(ctx):
    """Families whose clients send features to unlearn keep an HMAC per example in the batch row; a forget zeroes
    the forgotten record's 32 bytes and leaves the others, which still check the features sent for them."""
    t = ctx.tenants.create_tenant("t")["id"]
    spec = {**SPEC, "algorithm": "memory_pair", "dim": 3,
            "hyperparameters": {"deletion_features": "client", "capacity": 3}}
    m = ctx.models.create(t, spec)["id"]
    rng = np.random.default_rng(4)
    X = rng.uniform(-0.5, 0.5, size=(12, 3))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = [float(i % 2) for i in range(12)]
    ids = [f"mp-{i}" for i in range(12)]
    ctx.models.learn(t, m, ids, X, y)
    ctx.models.unlearn(t, m, ["mp-4"], examples=[("mp-4", X[4].tolist(), y[4])])
    with ctx.db.read() as s:
        macs = s.execute(select(RecordBatch.example_macs).where(RecordBatch.model_id == m)).scalar_one()
    slots = [macs[32 * i:32 * i + 32] for i in range(12)]
    assert slots[4] == bytes(32) and all(any(s) for i, s in enumerate(slots) if i != 4)
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m, ["mp-4"], examples=[("mp-4", X[4].tolist(), y[4])])
    assert e.value.slug == "record-already-forgotten"
    with pytest.raises(Problem) as e:
        ctx.models.unlearn(t, m, ["mp-6"], examples=[("mp-6", X[7].tolist(), y[6])])
    assert e.value.slug == "example-mismatch"
    assert len(ctx.models.unlearn(t, m, ["mp-6"], examples=[("mp-6", X[6].tolist(), y[6])])["receipts"]) == 1


def test_batches_with_steps_out_of_order(ctx):
    """A batch whose steps are not first_step, first_step + 1, ... keeps them all (engines may return any steps)."""
    from app.ids import utcnow
    from app.services.records import commitment_digests

    t = ctx.tenants.create_tenant("t")["id"]
    m = ctx.models.create(t, SPEC)["id"]
    digests = commitment_digests(b"k" * 32, ["p", "q", "r", "s"])
    with ctx.db.write() as s:
        found, probe = ctx.models.records.find(s.connection(), m, digests)
        assert found == {}
        batch_id = ctx.models.records.insert(s.connection(), probe, t, [7, 3, 12, 4], None, utcnow())
    with ctx.db.write() as s:  # the index is not told of the batch: found by catching up
        found, _ = ctx.models.records.find(s.connection(), m, [digests[2], b"\0" * 32, digests[0]])
        steps = s.execute(select(RecordBatch.first_step, RecordBatch.steps).where(RecordBatch.id == batch_id)).one()
    assert {q: (f.step, f.slot, f.batch_id) for q, f in found.items()} == {0: (12, 2, batch_id), 2: (7, 0, batch_id)}
    assert steps[0] == 7 and np.frombuffer(steps[1], "<i8").tolist() == [7, 3, 12, 4]


def test_the_book_keeps_a_bounded_number_of_indexes():
    """Least recently used indexes go beyond max_models (the audit visits every model of a tenant) and beyond
    max_entries lookups in all; the one in use stays, however large."""
    from app.db.record_batches import RecordBook

    book = RecordBook(max_entries=2500, is_postgresql=False, max_models=3)
    for i in range(10):
        book._index(f"m{i}")
    assert list(book._indexes) == ["m7", "m8", "m9"]
    book._index("m8").add(1, np.arange(2000, dtype=np.int64))
    book._index("m7").add(1, np.arange(1000, dtype=np.int64))
    assert list(book._indexes) == ["m9", "m8", "m7"]  # checked when an index is next asked for
    book._index("m7")  # 3000 > 2500: m9, then m8, are dropped
    assert list(book._indexes) == ["m7"]
    book._index("m7").add(2, np.arange(5000, dtype=np.int64))
    assert book._index("m7").size == 6000 and list(book._indexes) == ["m7"]


def test_the_books_running_total_is_the_sum_of_the_indexes_it_holds():
    """The book keeps the lookups it holds as a running total (no O(models) sum per request): it always equals the
    sum over the indexes still in the book; an index dropped from it (evicted, or pushed out) no longer counts, even
    when a request still holding it adds a batch."""
    from app.db.record_batches import RecordBook

    book = RecordBook(max_entries=10_000, is_postgresql=False, max_models=4)
    held = {}
    for i in range(6):
        held[i] = book._index(f"m{i}")
        held[i].add(1, np.arange(100 * (i + 1), dtype=np.int64))
        assert book._total == sum(x.size for x in book._indexes.values())
    assert list(book._indexes) == ["m2", "m3", "m4", "m5"]
    held[0].add(2, np.arange(7000, dtype=np.int64))  # m0 was pushed out: its growth is not the book's
    assert held[0].size == 7100 and book._total == 300 + 400 + 500 + 600
    book.evict("m3")
    assert book._total == 300 + 500 + 600 and held[3].book is None
    book._index("m5").add(2, np.arange(9000, dtype=np.int64))
    assert book._total == 300 + 500 + 9600
    book._index("m5")  # over max_entries: the least recently used go first, the one in use stays
    assert list(book._indexes) == ["m5"] and book._total == 9600
