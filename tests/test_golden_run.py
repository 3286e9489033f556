"""Behaviour unchanged by the restructuring (issue 22): the golden run compared byte for byte with the recording.

Every family x loss is created, taught, made to forget and asked to predict with fixed randomness
(tests/golden_run.py); published parameters, receipts (less time, ids and signatures), ledgers and model views must
equal tests/data/golden_run.json exactly.  A change that is meant to change behaviour re-records it with
``python -m tests.golden_run --write`` and says so in its commit.
"""
from __future__ import annotations

import difflib

from .golden_run import GOLDEN, dumps, run


def test_golden_run_is_byte_identical(monkeypatch):
    got = dumps(run(monkeypatch))
    want = GOLDEN.read_text()
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "recorded", "now"))[:80])
        raise AssertionError(f"the golden run changed:\n{diff}")
