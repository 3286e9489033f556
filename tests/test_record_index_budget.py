"""The record index's budget (OLU_RECORD_INDEX_MAX_ENTRIES, issue 36): sized from the memory the process may use,
scan resistant when models used in turn hold more than it, and its rebuilds counted, served and logged."""
from __future__ import annotations

import logging
import secrets
from collections import namedtuple
from pathlib import Path

import pytest

from app.config import Settings
from app.db.record_batches import _CATCH_UP, _ROWS, MIN_AUTO_ENTRIES, RecordBook, index_budget, memory_limit
from app.main import create_app

GIB = 1 << 30
V1_UNLIMITED = "9223372036854771712"  # what cgroup v1 reports without a limit (2^63 rounded down to a page)


def _cgroup(tmp_path: Path, v2: str | None = None, v1: str | None = None) -> Path:
    if v2 is not None:
        (tmp_path / "memory.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "memory").mkdir()
        (tmp_path / "memory" / "memory.limit_in_bytes").write_text(v1 + "\n")
    return tmp_path


@pytest.mark.parametrize("v2, v1, expect", [
    (str(2 * GIB), None, 2 * GIB),  # cgroup v2 limit
    ("max", None, 64 * GIB),  # v2 without a limit: the machine's memory
    (None, str(3 * GIB), 3 * GIB),  # cgroup v1 limit
    (None, V1_UNLIMITED, 64 * GIB),  # v1 without a limit
    (None, None, 64 * GIB),  # no cgroup memory controller
    (str(128 * GIB), None, 64 * GIB),  # a limit above the machine's memory is no limit
    ("garbage", str(GIB), GIB),  # an unreadable v2 value is skipped
])
def test_memory_limit_reads_the_cgroup_else_the_machine(tmp_path, v2, v1, expect):
    assert memory_limit(_cgroup(tmp_path, v2, v1), physical=64 * GIB) == expect


def test_index_budget_is_an_eighth_of_that_in_entries_or_the_setting(tmp_path):
    root = _cgroup(tmp_path, v2=str(16 * GIB))
    assert index_budget(None, root, physical=64 * GIB) == 16 * GIB // 8 // 16 == 134_217_728
    (tmp_path / "small").mkdir()
    small = _cgroup(tmp_path / "small", v2=str(GIB // 4))  # an eighth: 2 097 152 entries, below the floor
    assert index_budget(None, small, physical=64 * GIB) == MIN_AUTO_ENTRIES == 4_000_000
    assert index_budget(1234, root, physical=64 * GIB) == 1234
    assert index_budget(0, root, physical=64 * GIB) == 0  # only the index in use is kept


def test_the_setting_reaches_the_book(tmp_path, monkeypatch):
    monkeypatch.setenv("OLU_RECORD_INDEX_MAX_ENTRIES", "4321")
    assert Settings().record_index_max_entries == 4321
    monkeypatch.delenv("OLU_RECORD_INDEX_MAX_ENTRIES")
    assert Settings().record_index_max_entries is None
    for setting, check in ((None, lambda n: n >= MIN_AUTO_ENTRIES), (77, lambda n: n == 77)):
        app = create_app(Settings(data_dir=tmp_path / str(setting), log_level="WARNING",
                                  record_index_max_entries=setting))
        try:
            assert check(app.state.ctx.models.core.records.max_entries)
        finally:
            app.state.ctx.db.dispose()


Row = namedtuple("Row", "id commitments first_step steps example_macs learned_at")


class FakeBatches:
    """The two queries ``RecordBook.find`` makes, over batches held in memory; it notes every catch-up."""

    def __init__(self) -> None:
        self.rows: dict[str, list[Row]] = {}
        self.catch_ups: list[tuple[str, int]] = []
        self.last_id = 0

    def learn(self, model_id: str, n: int) -> int:
        self.last_id += 1
        self.rows.setdefault(model_id, []).append(Row(self.last_id, secrets.token_bytes(32 * n), 0, None, None, None))
        return self.last_id

    def execute(self, stmt, params):
        if stmt is _CATCH_UP:
            self.catch_ups.append((params["mid"], params["after"]))
            return [(r.id, r.commitments) for r in self.rows.get(params["mid"], ()) if r.id > params["after"]]
        assert stmt is _ROWS
        return [r for rows in self.rows.values() for r in rows if r.id in params["ids"]]


def _in_turn(book: RecordBook, models: int, size: int, requests: int, prefix: str = "m") -> int:
    """``models`` models of ``size`` records each, then ``requests`` learn requests of 10 records, the models in
    turn (each also finds a record of the model's first batch); the requests that rebuilt an index from zero."""
    db = FakeBatches()
    names = [f"{prefix}{i}" for i in range(models)]
    for m in names:
        db.learn(m, size)
    for m in names:  # the first builds
        book.find(db, m, [secrets.token_bytes(32)], version=1)
    rebuilt = 0
    for k in range(requests):
        m = names[k % models]
        version, seen = len(db.rows[m]), len(db.catch_ups)
        first = db.rows[m][0].commitments
        found, probe = book.find(db, m, [secrets.token_bytes(32) for _ in range(9)] + [first[32 * k:32 * k + 32]],
                                 version=version)
        assert list(found) == [9]  # an index dropped or not, the learned record is found
        rebuilt += any(after == 0 for _, after in db.catch_ups[seen:])
        book.committed(probe, db.learn(m, 10), version + 1)
    return rebuilt


def test_models_used_in_turn_past_the_budget_keep_those_that_fit():
    """Three models of 1000 records, a budget that fits two (2500), used in turn: plain LRU dropped, at the next
    request, the index needed next, and rebuilt one in two (15 of these 30 requests, measured on commit 0545d5a
    before the change; 23 of 30 at a budget of 2100, which the models' growth overtakes); the index built from zero
    past the budget now goes first, so the other two stay: one rebuild every third request."""
    book = RecordBook(max_entries=2500, is_postgresql=False)
    assert _in_turn(book, models=3, size=1000, requests=30) == 10
    assert book.rebuilds == 10  # the served counter agrees with the catch-ups seen
    assert book.entries == sum(i.size for i in book._indexes.values()) <= 2500 + 1400  # the budget and one index


def test_no_rebuild_when_every_index_fits():
    book = RecordBook(max_entries=4000, is_postgresql=False)
    assert _in_turn(book, models=3, size=1000, requests=30) == 0
    assert book.rebuilds == 0 and book.entries == 3 * 1000 + 30 * 10


def test_a_budget_of_zero_keeps_only_the_index_in_use():
    book = RecordBook(max_entries=0, is_postgresql=False)
    assert _in_turn(book, models=2, size=50, requests=6) == 6
    assert list(book._indexes) == ["m1"]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_rebuilds_warn_at_most_once_a_minute_without_record_data():
    book = RecordBook(max_entries=2500, is_postgresql=False)
    now = [1000.0]
    book.clock = lambda: now[0]
    lines = _Lines()
    logger = logging.getLogger("olu.records")
    logger.addHandler(lines)
    try:
        _in_turn(book, models=3, size=1000, requests=30)  # 10 rebuilds in one "instant"
        assert len(lines.records) == 1
        now[0] += 59.0
        _in_turn(book, models=3, size=1000, requests=3, prefix="n")  # other models: a rebuild within the minute
        assert len(lines.records) == 1
        unwarned = book.rebuilds - 1
        now[0] += 1.0
        _in_turn(book, models=3, size=1000, requests=3, prefix="o")
    finally:
        logger.removeHandler(lines)
    assert [r.levelno for r in lines.records] == [logging.WARNING] * 2
    first, second = (r.getMessage() for r in lines.records)
    assert "OLU_RECORD_INDEX_MAX_ENTRIES" in first and ": 1 rebuilds" in first and "budget of 2500" in first
    # the next warning counts the rebuilds not warned of, and the one that warns
    assert f": {unwarned + 1} rebuilds" in second and unwarned >= 10
    assert lines.records[1].rebuilds == unwarned + 1 and lines.records[1].max_entries == 2500


def test_metrics_serve_the_index_entries_and_rebuilds(tmp_path):
    """Through the service: two models learning in turn with a budget below either's records."""
    app = create_app(Settings(data_dir=tmp_path, log_level="WARNING", record_index_max_entries=10))
    ctx = app.state.ctx
    try:
        t = ctx.tenants.create_tenant("t")["id"]
        spec = {"name": "m", "algorithm": "passive_olu", "loss": "logistic", "dim": 2,
                "bounds": {"x_norm": 1.0, "y_abs": 1.0}, "domain_radius": 5.0, "l2": 0.1,
                "privacy": {"epsilon": 1.0, "delta": 1e-6}, "hyperparameters": {}}
        models = [ctx.models.create(t, spec)["id"] for _ in range(2)]
        for k in range(4):
            for i, m in enumerate(models):
                ctx.models.learn(t, m, [f"r{k}-{i}-{j}" for j in range(12)], [[0.01 * j, 0.0] for j in range(12)],
                                 [float(j % 2) for j in range(12)])
        text = ctx.metrics.render()[0].decode()
    finally:
        ctx.db.dispose()
    # each model's first learn builds nothing (no batch yet); every later one rebuilds the index the other dropped
    assert "olu_record_index_rebuilds_total 6.0" in text
    assert "olu_record_index_entries 48.0" in text  # the last model's 4 batches of 12, the other's dropped
