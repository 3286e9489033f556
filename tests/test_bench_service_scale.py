"""bench/performance/service_scale.py (issue 36 item 6): the section runs end to end through a real service at tiny
sizes -- every family learns and forgets through HTTP (a refused request raises), the engine of the same spec beside
it -- stops the data-keeping families above the retained cap, and renders its table; ``python -m bench --sections
service_scale`` passes its options through.  No timing is asserted."""
from __future__ import annotations

import json
import os

import numpy as np

from bench import __main__ as runner
from bench.performance import service_scale as S


def test_p99_is_the_nearest_rank():
    assert S.p99([float(i) for i in range(1, 101)]) == 99.0
    assert S.p99([3.0, 1.0, 2.0]) == 3.0 and S.p99([5.0]) == 5.0


def test_unlearn_body_resends_the_record_only_where_the_engine_needs_it():
    X, y = np.arange(6.0).reshape(3, 2), np.array([0.0, 1.0, 0.0])
    assert S.unlearn_body(False, 1, X, y) == {"ids": ["r1"]}
    assert S.unlearn_body(True, 1, X, y) == {"ids": ["r1"], "examples": [{"id": "r1", "x": [2.0, 3.0], "y": 1.0}]}


def test_section_runs_through_the_service_and_renders():
    backends = ("sqlite", "postgresql") if os.environ.get("OLU_TEST_POSTGRES_URL") else ("sqlite",)
    r = S.run(quick=True, backends=backends, sizes=(300, 600), forgets=3, batch=200, retained_cap=300,
              log=lambda *a: None)
    assert [(c["backend"], c["n"]) for c in r["cells"]] == [(b, n) for n in (300, 600) for b in backends]
    for c in r["cells"]:
        assert "skipped" not in c, c
        fams = c["families"]
        expected = list(S.FAMILIES) if c["n"] <= 300 else ["exact_ridge", "passive_olu"]
        assert list(fams) == expected
        assert c.get("capped") == (None if c["n"] <= 300 else ["retrain", "sisa"])
        assert c["db_bytes"] > 0
        for a, row in fams.items():
            assert len(row["http_forget_s"]) == len(row["engine_forget_s"]) == 3
            assert row["http_forget_p99_s"] >= row["http_forget_p50_s"] > 0
            assert row["http_ingest_per_s"] > 0 and row["engine_ingest_per_s"] > 0
        floor = fams["passive_olu"]["http_forget_p50_s"]
        for a in set(fams) - {"passive_olu"}:
            row = fams[a]
            assert np.isclose(row["forget_vs_engine_plus_floor"],
                              row["http_forget_p50_s"] / (row["engine_forget_p50_s"] + floor))
        if "sisa" in fams:  # the models were created at the size: max_records = n, default shards
            assert fams["sisa"]["hyperparameters"]["max_records"] == c["n"]
            assert fams["retrain"]["hyperparameters"]["max_records"] == c["n"]
    assert {(t["backend"], t["n"]) for t in r["targets"]} == {(b, 300) for b in backends}
    assert len(r["targets"]) == 3 * len(backends)
    lines = S.table(r)
    text = "\n".join(lines)
    for a in S.FAMILIES:
        assert f"| sqlite | 300 | {a} |" in text
    assert "| sqlite | 600 | sisa |" not in text and "not run above the cap of 300" in text
    assert "HTTP / (engine + floor)" in lines[1] and "sisa forget HTTP / (engine + floor) <= 2.0" in text


def test_a_time_cap_stops_learning_and_the_cell_goes_on_at_the_records_learned():
    """(with a setting beyond the defaults: the record index budget below the records held, which the service
    rebuilds from the database when it drops a model's index)"""
    r = S.run(quick=True, backends=("sqlite",), sizes=(600,), forgets=2, batch=200, families=("exact_ridge",),
              cap_s=0.0, log=lambda *a: None, server_env={"OLU_RECORD_INDEX_MAX_ENTRIES": "100"})
    (c,) = r["cells"]
    assert c["n"] == 600 and c["learned"] == 200 and list(c["families"]) == ["exact_ridge", "passive_olu"]
    assert all(len(row["http_forget_s"]) == 2 for row in c["families"].values())
    text = "\n".join(S.table(r))
    assert "| sqlite | 200 of 600 | exact_ridge |" in text and "stopped by the 0 s cap at 200 records" in text
    assert "Settings beyond the defaults: OLU_RECORD_INDEX_MAX_ENTRIES=100" in text


def test_runner_dispatches_the_section(monkeypatch, tmp_path, capsys):
    seen = {}

    def fake_run(quick, backends, sizes):
        seen.update(quick=quick, backends=backends, sizes=sizes)
        row = {"http_ingest_per_s": 10.0, "engine_ingest_per_s": 20.0, "http_forget_p50_s": 0.02,
               "http_forget_p99_s": 0.03, "engine_forget_p50_s": 0.001, "engine_forget_p99_s": 0.002}
        cell = {"backend": "sqlite", "n": 7, "families": {"passive_olu": row}, "db_bytes": 1e6, "seconds": 1.0,
                "machine": {"load_avg": [1.0, 1.0, 1.0]}}
        return {"d": 32, "batch": 7, "forgets": 1, "retained_cap": 7, "machine": runner.machine(), "cells": [cell],
                "targets": []}

    monkeypatch.setattr(S, "run", fake_run)
    runner.main(["--sections", "service_scale", "--quick", "--n", "100000,1e6", "--backends", "sqlite",
                 "--out", str(tmp_path)])
    assert seen == {"quick": True, "backends": ("sqlite",), "sizes": (100_000, 1_000_000)}
    assert "| sqlite | 7 | passive_olu | 10 | 20 | 20.0 / 30.0 | 1.0 / 2.0 | (the floor) | 1 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "results.json").read_text())["service_scale"]["cells"][0]["n"] == 7
