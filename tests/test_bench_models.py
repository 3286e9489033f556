"""The models section of the benchmark (issue 32 item 3) in a tiny form: 6 models of one tenant, then of 3 tenants,
beside a single model, on throwaway PostgreSQL databases.  Nothing about speed is asserted; what is checked is that
every operation ran on both sides with real answers, that the database and memory figures come from the real
databases and processes, and that the docs renderer replaces only its own generated part."""
from __future__ import annotations

import pytest

from .conftest import PG_URL

pytestmark = pytest.mark.skipif(not PG_URL, reason="the models section needs PostgreSQL (set OLU_TEST_POSTGRES_URL)")


def test_models_section_tiny_form(monkeypatch, tmp_path):
    from sqlalchemy.engine import make_url

    from bench.performance import ingest
    from bench.scale import models as M

    monkeypatch.setattr(ingest, "PG_ADMIN", make_url(PG_URL).set(drivername="postgresql+psycopg")
                        .render_as_string(hide_password=False))
    r = M.run(quick=True, n_models=6, tenants=(1, 3), n_ops=4)
    assert [s["models"] for s in r["scenarios"]] == [6, 6] and [s["tenants"] for s in r["scenarios"]] == [1, 3]
    for s in r["scenarios"]:
        assert set(s["ops"]) == {"learn", "predict", "unlearn"}
        for row in s["ops"].values():
            assert row["single"]["n"] == row["many"]["n"] == 4
            assert row["p99_ratio"] == row["many"]["p99_s"] / row["single"]["p99_s"] > 0
        # 5 warm-up and 4 measured requests of each operation on each side, every one answered 200
        assert s["status"] == {"learn 200": 18, "predict 200": 18, "unlearn 200": 18}
        assert s["database"]["database_bytes"] > 0 and s["database"]["tables"]["record_batches"] > 0
        assert s["rss_after_setup"] > 0 and s["rss_single_after_ops"] > 0
    lines = M.table(r)
    assert len(lines) == 2 + 6 + 1 + 2
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nbefore\n")
    M.write_docs(r, doc)
    M.write_docs(r, doc)  # the second run replaces the generated part, it does not add another
    text = doc.read_text()
    assert text.startswith("# Performance\n\nbefore\n\n" + M.SECTION) and text.count(M.BEGIN) == 1
    assert r["commit"] in text and "| 3 tenants x 2 models | unlearn |" in text
