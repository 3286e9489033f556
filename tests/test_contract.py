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
