"""The scale section of the benchmark runs in CI in its small form (issue 23 item 4): 1 s per phase, SQLite, and
PostgreSQL when the suite has it.  Nothing about speed is asserted (figures depend on the machine); what is checked
is that every point ran with real traffic, pinned where the table says, with its ratios against N = 1."""
from __future__ import annotations

import os

import pytest

from .conftest import PG_URL


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs os.sched_setaffinity (Linux)")
def test_scale_section_small_form(monkeypatch):
    from bench.performance import ingest
    from bench.scale import scale

    backends = ("sqlite", "postgresql") if PG_URL else ("sqlite",)
    if PG_URL:  # the suite's server, in a throwaway database of the bench's own
        from sqlalchemy.engine import make_url

        monkeypatch.setattr(ingest, "PG_ADMIN", make_url(PG_URL).set(drivername="postgresql+psycopg")
                            .render_as_string(hide_password=False))
    r = scale.run(quick=True, backends=backends, seconds=1.0)
    cores = sorted(os.sched_getaffinity(0))
    assert r["cores"] == cores and {row["backend"] for row in r["rows"]} == set(backends), r["notes"]
    for row in r["rows"]:
        assert row["learn_events_per_s"] > 0 and row["predict_per_s"] > 0
        assert set(row["server_cores"]) <= set(cores) and row["clients"] == 2 * row["n"]
        if row["n"] == 1:
            assert row["ingest_vs_one"] == 1.0
    lines = scale.table(r)
    assert len(lines) == 2 + len(r["rows"]) + len(r["notes"]) + (len(cores) < 3)
