"""The committed OpenAPI document matches the app; the models agree with the migrations; the state codec is exact."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sqlalchemy import create_engine

from app.db.migrate import upgrade_to_head
from app.db.state_codec import pack_state, unpack_state
from app.db.tables import Base
from app.openapi_dump import OUT, render


def test_openapi_document_is_up_to_date():
    committed = OUT.read_text()
    assert committed == render(), "openapi/openapi.json is stale: run `python -m app.openapi_dump` and commit it"
    doc = json.loads(committed)
    ops = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ops) == len(set(ops))
    assert {"learn", "unlearn", "predict", "create_model", "get_receipt"} <= set(ops)


def _assert_models_match_migrations(url: str) -> None:
    engine = create_engine(url)
    upgrade_to_head(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"


def test_models_and_migrations_agree_on_sqlite(tmp_path: Path):
    _assert_models_match_migrations(f"sqlite:///{tmp_path / 'm.db'}")


def test_models_and_migrations_agree_on_postgres(postgres_url):
    _assert_models_match_migrations(postgres_url)


def test_migrations_downgrade_and_upgrade_again(tmp_path: Path):
    from alembic import command

    from app.db.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = alembic_config(url)
    command.upgrade(cfg, "head")
    command.downgrade(cfg, "base")
    command.upgrade(cfg, "head")


arrays = st.one_of(
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
               elements=st.floats(allow_nan=True, allow_infinity=True)),
    hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=5)),
)
scalars = st.one_of(st.integers(-(2**62), 2**62), st.floats(allow_nan=False), st.booleans(), st.none())


@given(st.dictionaries(st.text(min_size=1, max_size=10), st.one_of(arrays, scalars), max_size=6))
def test_state_codec_round_trip_is_exact(state):
    out = unpack_state(pack_state(state))
    assert out.keys() == state.keys()
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            assert out[k].dtype == v.dtype and out[k].shape == v.shape
            assert out[k].tobytes() == v.tobytes()
        elif isinstance(v, float):
            assert out[k] == v and type(out[k]) is float
        else:
            assert out[k] == v


def test_record_migrations_keep_existing_records(tmp_path: Path):
    """0006 (records.lookup) and 0007 (record_batches) on a database that already holds records: after a downgrade
    to 0005 and an upgrade again, learned records are found by unlearn, the audit and the duplicate check;
    forgotten ones stay forgotten with their receipt; example MACs still check client-sent features."""
    import tempfile

    import numpy as np
    from alembic import command
    from sqlalchemy import text

    from app.config import Settings
    from app.db.migrate import alembic_config
    from app.errors import Problem
    from app.main import create_app

    url = f"sqlite:///{tmp_path / 'm.db'}"
    settings = Settings(data_dir=Path(tempfile.mkdtemp(dir=tmp_path)), database_url=url, log_level="WARNING")
    app = create_app(settings)
    ctx = app.state.ctx
    t = ctx.tenants.create_tenant("mig")
    spec = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 2,
            "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 5.0, "l2": 0.1,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}
    m = ctx.models.create(t["id"], spec)
    ids = [f"old-{i}" for i in range(7)]
    ctx.models.learn(t["id"], m["id"], ids, [[0.1 * i, -0.1] for i in range(7)], [1.0, 0.0] * 3 + [1.0])
    ctx.models.learn(t["id"], m["id"], ["later-1", "later-2"], [[0.0, 0.2], [0.2, 0.0]], [1.0, 0.0])
    gone = ctx.models.unlearn(t["id"], m["id"], ["old-1"])["receipts"][0]["id"]
    mp = ctx.models.create(t["id"], {**spec, "algorithm": "memory_pair",
                                     "hyperparameters": {"deletion_features": "client", "capacity": 3}})
    X = np.array([[0.1 * i, 0.05] for i in range(6)])
    ctx.models.learn(t["id"], mp["id"], [f"mp-{i}" for i in range(6)], X, [float(i % 2) for i in range(6)])
    ctx.models.unlearn(t["id"], mp["id"], ["mp-2"], examples=[("mp-2", X[2].tolist(), 0.0)])
    ctx.db.dispose()
    cfg = alembic_config(url)
    command.downgrade(cfg, "0005")
    eng = create_engine(url)
    with eng.connect() as conn:
        assert "lookup" not in {r[1] for r in conn.execute(text("PRAGMA table_info(records)"))}
        assert conn.execute(text("SELECT count(*) FROM records")).scalar_one() == 9 + 6
        assert conn.execute(text("SELECT count(*) FROM records WHERE example_mac IS NOT NULL")).scalar_one() == 5
    eng.dispose()
    command.upgrade(cfg, "head")
    eng = create_engine(url)
    with eng.connect() as conn:  # one batch row per learn request; records holds the forgotten ones only
        assert conn.execute(text("SELECT n FROM record_batches ORDER BY id")).scalars().all() == [7, 2, 6]
        assert conn.execute(text("SELECT count(*) FROM records")).scalar_one() == 2
    eng.dispose()

    app = create_app(settings)  # same data directory: same encryption key
    ctx = app.state.ctx
    try:
        assert ctx.models.record_status(t["id"], "old-3")["models"][0]["status"] == "learned"
        assert ctx.models.record_status(t["id"], "old-1")["models"][0] == {
            "model_id": m["id"], "status": "forgotten", "step": 2, "receipt_id": gone}
        try:
            ctx.models.learn(t["id"], m["id"], ["new-1", "old-5"], [[0.0, 0.0], [0.0, 0.1]], [1.0, 0.0])
            raise AssertionError("a record learned before the migration was accepted again")
        except Problem as e:
            assert e.status == 409 and "old-5" in str(e.detail)
        for rid, slug in (("old-1", "record-already-forgotten"), ("never", "record-not-found")):
            try:
                ctx.models.unlearn(t["id"], m["id"], [rid])
                raise AssertionError(rid)
            except Problem as e:
                assert e.slug == slug
        out = ctx.models.unlearn(t["id"], m["id"], ["old-3", "later-2"])
        assert [r["learned_step"] for r in out["receipts"]] == [4, 9]
        assert ctx.models.record_status(t["id"], "old-3")["models"][0]["status"] == "forgotten"
        try:
            ctx.models.unlearn(t["id"], mp["id"], ["mp-4"], examples=[("mp-4", X[3].tolist(), 0.0)])
            raise AssertionError("features of another record were accepted")
        except Problem as e:
            assert e.slug == "example-mismatch"
        assert ctx.models.unlearn(t["id"], mp["id"], ["mp-4"], examples=[("mp-4", X[4].tolist(), 0.0)])["receipts"]
    finally:
        ctx.db.dispose()
