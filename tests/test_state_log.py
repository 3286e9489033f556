"""Writes proportional to the change (issue 36 item 1): a model's state as a sealed base and a log of sealed deltas.

* Reading version v gives the same bits: an engine rebuilt from the base and the deltas (another process, or this
  one after eviction) has the very state and published parameters of the engine that wrote them, and of a fresh
  engine that learned the same records; ``learn_replays_exactly`` holds for the families that claim it (and the
  claim would be false for a family with noise: negative control).
* A write is whole or absent: a learn that fails in its write transaction after logging its delta leaves no delta.
* Erasure on the new layout: after a forget the log is folded and its rows are gone; no file of the data directory
  holds a byte of the forgotten example (the WAL included), and neither does anything the service key opens (the
  base, any delta, every retained chunk) -- for exact_ridge, whose learn deltas carry examples, and for the families
  whose retained examples are chunked.
* Compaction, key rotation (the delta keys are re-wrapped) and migration 0015's downgrade (the log folded into the
  base) keep the state.
"""
from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from app.config import Settings
from app.db import state_log
from app.db.retained import open_chunk
from app.main import create_app
from app.unlearning import ALGORITHMS, engine_class

from .forensics import needles_of, scan

D = 200  # exact_ridge's state at d = 200 is 330 kB (165 kB stored: A's upper triangle): its learns are logged as deltas
RIDGE = {"name": "ridge", "algorithm": "exact_ridge", "loss": "squared", "dim": D,
         "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 10.0, "l2": 0.05,
         "privacy": {"epsilon": 1.0, "delta": 1e-6}}


@pytest.fixture
def svc(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    app = create_app(Settings(data_dir=data, log_level="WARNING"))
    ctx = app.state.ctx
    tenant = ctx.tenants.create_tenant("log")["id"]
    yield ctx, tenant, data
    ctx.db.dispose()


def _rows(n: int, d: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    X *= 0.9 / np.linalg.norm(X, axis=1, keepdims=True)
    return X, rng.uniform(-0.9, 0.9, size=n)


def _log(data, model_id: str) -> list[tuple[int, str]]:
    with sqlite3.connect(data / "olu.db") as conn:
        return conn.execute("SELECT version, kind FROM model_state_deltas WHERE model_id = ? ORDER BY version",
                            (model_id,)).fetchall()


def _opened(ctx, data) -> bytes:
    """Everything the service key opens in the database: every model's base, every delta, every retained chunk."""
    cipher = ctx.models.registry.cipher
    out = []
    with sqlite3.connect(data / "olu.db") as conn:
        for mid, blob in conn.execute("SELECT model_id, blob FROM model_states"):
            out.append(cipher.open(bytes(blob), "state", mid))
        for mid, v, kind, sealed, wrapped in conn.execute(
                "SELECT d.model_id, d.version, d.kind, d.sealed, k.wrapped FROM model_state_deltas d JOIN "
                "model_state_delta_keys k USING (model_id, version)"):
            out.append(state_log.open_delta(cipher, mid, v, kind, sealed, wrapped))
        dims = {m: int(json.loads(s)["dim"]) for m, s in conn.execute("SELECT id, spec_json FROM models")}
        for mid, cid, grp, steps, sealed, wrapped in conn.execute(
                "SELECT c.model_id, c.id, c.grp, c.steps, c.sealed, k.wrapped FROM retained_chunks c JOIN "
                "retained_chunk_keys k ON k.chunk_id = c.id"):
            c = open_chunk(cipher, mid, dims[mid], cid, grp, steps, sealed, wrapped)
            out += [c.X.tobytes(), c.y.tobytes()]
    return b"|".join(out)


def _found(needles: dict, data: bytes) -> list[str]:
    return [name for name, b in needles.items() if b in data]


def test_learns_are_logged_and_a_rebuilt_engine_has_the_same_bits(svc):
    ctx, t, data = svc
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(12, D, 1)
    for i in range(12):
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
    log = _log(data, m)
    # the first learn writes a base: the empty model's stored state (zero sums: 1 byte a word, narrow_words.py) is
    # below state_store.DELTA_MIN; every later one is logged
    assert [k for _, k in log] == ["learn"] * 11 and [v for v, _ in log] == list(range(3, 14))
    registry = ctx.models.registry
    cached = registry._cache[m][1]
    registry.evict(m)
    with ctx.db.read() as s:
        from app.services.model_core import _SELECT_MODEL
        row = s.connection().execute(_SELECT_MODEL, {"mid": m, "tid": t}).mappings().one()
        rebuilt = registry.checkout(m, row["version"], row["spec_json"],
                                    lambda: state_log.load(s, registry.cipher, m))
    fresh = engine_class("exact_ridge")(cached.spec)
    fresh.learn(X, y)
    for other in (rebuilt, fresh):
        assert all(np.array_equal(a, b) for a, b in zip(cached.state().values(), other.state().values()))
        assert np.array_equal(cached.published(), other.published())
    # the bytes stored count the base and the log (the quota's figure)
    with sqlite3.connect(data / "olu.db") as conn:
        stored, = conn.execute("SELECT bytes_stored FROM models WHERE id = ?", (m,)).fetchone()
        base, = conn.execute("SELECT length(blob) FROM model_states WHERE model_id = ?", (m,)).fetchone()
        logged, = conn.execute("SELECT sum(length(sealed)) FROM model_state_deltas WHERE model_id = ?", (m,)).fetchone()
    assert stored >= base + logged and logged < base / 5  # the base stores A's upper triangle: ~165 kB at d = 200


def _replays(cls, s, X, y) -> bool:
    """Whether batches learned one after another equal their concatenation in one learn, bit for bit (what a
    rebuild from learn deltas does: state_store.rebuild)."""
    one, many = cls(s), cls(s)
    one.learn(X, y)
    for a, b in ((0, 1), (1, 7), (7, len(y))):
        many.learn(X[a:b], y[a:b])
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(one.state().values(),
                                                                             many.state().values()))


def test_learn_replays_exactly_where_a_family_claims_it():
    """Every family instance that claims ``learn_replays_exactly`` (an instance attribute: exact_ridge claims it,
    its private publication does not, since a learn may draw a release's noise) replays bit for bit."""
    from bench.common import spec

    from .golden_run import FAMILIES  # every family, with the knobs some require

    X, y = _rows(30, 20, 4)
    claimed = []
    assert {a for a, _ in FAMILIES} == set(ALGORITHMS)
    for algorithm, hp in FAMILIES:
        cls = ALGORITHMS[algorithm]
        s = spec(algorithm, 20, hp)
        if cls(s).learn_replays_exactly:
            claimed.append(algorithm)
            assert _replays(cls, s, X, (y > 0).astype(float) if s.n_classes else y), algorithm
    assert "exact_ridge" in claimed
    private = spec("exact_ridge", 20).with_hyperparameters({"publication": "private", "release_horizon": 8})
    assert not ALGORITHMS["exact_ridge"](private).learn_replays_exactly


def test_the_replay_check_fails_for_a_learn_that_depends_on_its_batches():
    """Negative control of the check above: a learn with a per-call side effect does not replay exactly."""
    from bench.common import spec

    base = ALGORITHMS["exact_ridge"]

    class Batchy(base):
        def learn(self, X, y, retained=None):
            steps = super().learn(X, y, retained)
            self.B[0, 0] += 1  # one more per call: three calls differ from one
            return steps

    s = spec("exact_ridge", 20)
    X, y = _rows(30, 20, 4)
    assert not _replays(Batchy, s, X, (y > 0).astype(float))


def test_a_failed_write_leaves_no_delta(svc, monkeypatch):
    ctx, t, data = svc
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(3, D, 2)
    ctx.models.learn(t, m, ["a"], X[:1], y[:1])
    before = _log(data, m)

    def boom(*_a, **_k):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(ctx.models.core.quotas, "check_locked", boom)  # after the delta's insert
    with pytest.raises(RuntimeError):
        ctx.models.learn(t, m, ["b"], X[1:2], y[1:2])
    monkeypatch.undo()
    assert _log(data, m) == before
    ctx.models.learn(t, m, ["b"], X[1:2], y[1:2])
    ctx.models.registry.evict(m)
    ctx.models.learn(t, m, ["c"], X[2:3], y[2:3])  # rebuilt from the log: the records a, b, c
    fresh = engine_class("exact_ridge")(ctx.models.registry._cache[m][1].spec)
    fresh.learn(X, y)
    assert np.array_equal(fresh.published(), ctx.models.registry._cache[m][1].published())


def test_forget_folds_the_log_and_no_byte_of_the_example_stays(svc):
    """exact_ridge logs each learn's example (sealed): the forget folds the log into a new base and deletes the
    deltas and their keys in its transaction, then the WAL is cut; afterwards neither the files (plain scan) nor
    anything the service key opens holds the forgotten example."""
    ctx, t, data = svc
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(6, D, 3)
    for i in range(6):
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
    needles = needles_of(X[2], y[2], "r2")
    needles.pop("id")  # the id is never stored raw (commitments): not this test's point
    assert _found(needles, _opened(ctx, data)), "control: a learn delta carries the example"
    ctx.models.unlearn(t, m, ["r2"], examples=[("r2", X[2].tolist(), float(y[2]))])
    assert _log(data, m) == []
    with sqlite3.connect(data / "olu.db") as conn:
        assert conn.execute("SELECT count(*) FROM model_state_delta_keys WHERE model_id = ?", (m,)).fetchone() == (0,)
    wal = data / "olu.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    assert scan([data], needles) == []
    assert _found(needles, _opened(ctx, data)) == []
    # the other examples were folded into the base: the model still holds them exactly
    fresh = engine_class("exact_ridge")(ctx.models.registry._cache[m][1].spec)
    keep = [i for i in range(6) if i != 2]
    fresh.learn(X[keep], y[keep])
    assert np.array_equal(fresh.state()["A"], ctx.models.registry._cache[m][1].state()["A"])


@pytest.mark.parametrize("algorithm,hp", [("sisa", {"shards": 3}), ("retrain", {}), ("active_olu", {})])
def test_a_forgotten_retained_example_is_in_no_chunk_the_key_opens(svc, algorithm, hp):
    ctx, t, data = svc
    body = {**RIDGE, "algorithm": algorithm, "dim": 4, "loss": "logistic", "hyperparameters": hp}
    m = ctx.models.create(t, body)["id"]
    X, _ = _rows(40, 4, 5)
    y = (np.arange(40) % 2).astype(float)
    for a in range(0, 40, 10):
        ctx.models.learn(t, m, [f"r{i}" for i in range(a, a + 10)], X[a:a + 10], y[a:a + 10])
    needles = {k: v for k, v in needles_of(X[13]).items() if k in ("x<f8", "x[0]<f8", "x[1]<f8")}
    assert _found(needles, _opened(ctx, data)), "control: the chunk holds the example"
    ctx.models.unlearn(t, m, ["r13"])
    assert _found(needles, _opened(ctx, data)) == [] and scan([data], needles) == []
    assert _found({k: v for k, v in needles_of(X[14]).items() if k == "x<f8"}, _opened(ctx, data))  # the rest stay


def test_compaction_bounds_the_log_and_keeps_the_state(svc, monkeypatch):
    from app import state_store

    monkeypatch.setattr(state_store, "MAX_DELTAS", 3)
    ctx, t, data = svc
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(9, D, 6)
    lengths = []
    for i in range(9):
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
        lengths.append(len(_log(data, m)))
    assert max(lengths) == 3 and lengths == [0, 1, 2, 3, 0, 1, 2, 3, 0]  # the first: a base (the empty state is small)
    ctx.models.registry.evict(m)
    ctx.models.learn(t, m, ["z"], X[:1] * 0.5, y[:1])
    fresh = engine_class("exact_ridge")(ctx.models.registry._cache[m][1].spec)
    fresh.learn(np.vstack([X, X[:1] * 0.5]), np.append(y, y[0]))
    assert np.array_equal(fresh.published(), ctx.models.registry._cache[m][1].published())


def test_a_large_state_of_another_family_logs_page_patches(svc):
    """memory_pair at d = 1 000 (168 kB): a learn changes the iterate and one curvature pair, a few pages."""
    ctx, t, data = svc
    body = {**RIDGE, "algorithm": "memory_pair", "dim": 1000, "loss": "logistic"}
    m = ctx.models.create(t, body)["id"]
    X, _ = _rows(8, 1000, 7)
    y = (np.arange(8) % 2).astype(float)
    for i in range(8):
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
    kinds = [k for _, k in _log(data, m)]
    assert kinds and set(kinds) == {"patch"}
    with sqlite3.connect(data / "olu.db") as conn:
        base, = conn.execute("SELECT length(blob) FROM model_states WHERE model_id = ?", (m,)).fetchone()
        biggest, = conn.execute("SELECT max(length(sealed)) FROM model_state_deltas WHERE model_id = ?", (m,)).fetchone()
    assert biggest < base / 4
    cached = ctx.models.registry._cache[m][1]
    ctx.models.registry.evict(m)
    with ctx.db.read() as s:
        from app.services.model_core import _SELECT_MODEL
        row = s.connection().execute(_SELECT_MODEL, {"mid": m, "tid": t}).mappings().one()
        rebuilt = ctx.models.registry.checkout(m, row["version"], row["spec_json"],
                                               lambda: state_log.load(s, ctx.models.registry.cipher, m))
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(cached.state().values(), rebuilt.state().values()))


def test_key_rotation_rewraps_the_delta_keys(tmp_path):
    import base64
    import os

    from app.crypto import Cipher, parse_key
    from app.db.reseal import reseal_all

    k1, k2 = (base64.b64encode(os.urandom(32)).decode() for _ in range(2))
    data = tmp_path / "data"
    data.mkdir()
    ctx = create_app(Settings(data_dir=data, log_level="WARNING", encryption_key=k1)).state.ctx
    t = ctx.tenants.create_tenant("rot")["id"]
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(4, D, 8)
    for i in range(4):  # the first writes a base (the empty state is small), the next three are logged
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
    assert reseal_all(ctx.db, Cipher(parse_key(k2), [parse_key(k1)]))["delta_keys"] == 3
    assert reseal_all(ctx.db, Cipher(parse_key(k2)))["delta_keys"] == 0
    with ctx.db.read() as s:
        stored = state_log.load(s, Cipher(parse_key(k2)), m)  # the new key alone opens the log
    assert len(stored.deltas) == 3
    ctx.db.dispose()


def test_migration_0015_downgrade_folds_the_log(tmp_path):
    from alembic import command

    from app.db.migrate import alembic_config

    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, log_level="WARNING")
    ctx = create_app(settings).state.ctx
    t = ctx.tenants.create_tenant("mig")["id"]
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(4, D, 9)
    for i in range(4):
        ctx.models.learn(t, m, [f"r{i}"], X[i:i + 1], y[i:i + 1])
    published = ctx.models.registry._cache[m][1].published()
    cipher = ctx.models.registry.cipher
    ctx.db.dispose()
    cfg = alembic_config(f"sqlite:///{data / 'olu.db'}")
    cfg.attributes["cipher"] = cipher
    command.downgrade(cfg, "0014")
    with sqlite3.connect(data / "olu.db") as conn:
        version, = conn.execute("SELECT version FROM model_states WHERE model_id = ?", (m,)).fetchone()
        assert version == conn.execute("SELECT version FROM models WHERE id = ?", (m,)).fetchone()[0]
    ctx = create_app(settings).state.ctx  # up again; the base alone is the state
    try:
        ctx.models.learn(t, m, ["z"], X[:1] * 0.5, y[:1])
        fresh = engine_class("exact_ridge")(ctx.models.registry._cache[m][1].spec)
        fresh.learn(X, y)
        assert np.array_equal(fresh.published(), published)
        fresh.learn(X[:1] * 0.5, y[:1])
        assert np.array_equal(fresh.published(), ctx.models.registry._cache[m][1].published())
    finally:
        ctx.db.dispose()


def test_padded_size_keeps_the_length_while_the_state_fits():
    from app.state_store import PAD_SLACK, PAD_UNIT, padded_size

    first = padded_size(2_740_000, None)
    assert first % PAD_UNIT == 0 and 2_740_000 < first <= 2_740_000 * (1 + PAD_SLACK) + PAD_UNIT
    assert padded_size(2_740_000 - 3_000, first) == first == padded_size(first, first)  # fits: the same length
    assert padded_size(first + 1, first) > first  # grew past it: a new length
    assert padded_size(int(first * (1 - 2 * PAD_SLACK)), first) < first  # shrank well below: a new length


def test_forgets_keep_the_base_length_so_sqlite_rewrites_it_in_place(svc):
    """exact_ridge's narrow words vary in length with their exceptions; the base is padded to the previous length
    (state_store.padded_size), so each forget's UPDATE overwrites the same pages, and the padding reads back as the
    very state (a fresh model of the records kept has the same published bits)."""
    from app.db.state_codec import pack_state

    ctx, t, data = svc
    m = ctx.models.create(t, RIDGE)["id"]
    X, y = _rows(40, D, 11)
    X *= 0.01
    X[:6] = 0.9 * np.eye(D)[:6]  # each of the first six makes one large sum: an exception of the narrow words
    ctx.models.learn(t, m, [f"r{i}" for i in range(40)], X, y)
    lengths, packed = [], []
    for i in range(6):
        ctx.models.unlearn(t, m, [f"r{i}"], examples=[(f"r{i}", X[i].tolist(), float(y[i]))])
        packed.append(len(pack_state(ctx.models.registry._cache[m][1].stored_state())))
        with sqlite3.connect(data / "olu.db") as conn:
            lengths.append(conn.execute("SELECT length(blob) FROM model_states WHERE model_id = ?", (m,)).fetchone()[0])
    assert len(set(packed[:3])) > 1  # the state's own length moved ...
    assert len(set(lengths[:3])) == 1, lengths  # ... the stored base's did not
    registry = ctx.models.registry
    registry.evict(m)
    ctx.models.learn(t, m, ["z"], X[:1] * 0.5, y[:1])  # rebuilt from the padded base
    fresh = engine_class("exact_ridge")(registry._cache[m][1].spec)
    fresh.learn(np.vstack([X[6:], X[:1] * 0.5]), np.append(y[6:], y[0]))
    assert np.array_equal(fresh.published(), registry._cache[m][1].published())
