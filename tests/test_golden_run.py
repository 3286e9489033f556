"""Behaviour unchanged by the restructuring (issue 22): the golden run compared with the recording.

Every family x loss is created, taught, made to forget and asked to predict with fixed randomness
(tests/golden_run.py); published parameters, receipts (less time, ids and signatures), ledgers and model views must
equal tests/data/golden_run.json: every string, integer, key and list length exactly, every float to 1e-12
relative.  Why not byte for byte: numpy's exp and sums take different SIMD routes on different CPUs (AVX-512 or
AVX2), which moves the last bit of a softmax probability; the recording's machine and CI's need not agree.  A
change that is meant to change behaviour re-records it with ``python -m tests.golden_run --write`` and says so in
its commit.
"""
from __future__ import annotations

import json
import math

from .golden_run import GOLDEN, run

REL = 1e-12
ABS = 1e-15


def differences(want, got, path: str = "$") -> list[str]:
    """Where ``got`` departs from ``want`` (floats within REL / ABS are equal; bool is not a number here)."""
    if isinstance(want, float) or isinstance(got, float):
        if type(want) in (int, float) and type(got) in (int, float):
            if math.isclose(want, got, rel_tol=REL, abs_tol=ABS):
                return []
        return [f"{path}: {want!r} -> {got!r}"]
    if type(want) is not type(got):
        return [f"{path}: {want!r} -> {got!r}"]
    if isinstance(want, dict):
        if want.keys() != got.keys():
            return [f"{path}: keys {sorted(want)} -> {sorted(got)}"]
        return [d for k in want for d in differences(want[k], got[k], f"{path}.{k}")]
    if isinstance(want, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items -> {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: {want!r} -> {got!r}"]


def test_golden_run_matches_the_recording(monkeypatch):
    got = json.loads(json.dumps(run(monkeypatch)))  # the recording's JSON types (tuples -> lists)
    diffs = differences(json.loads(GOLDEN.read_text()), got)
    assert not diffs, f"the golden run changed in {len(diffs)} places:\n" + "\n".join(diffs[:40])


def test_the_comparison_can_fail():
    assert differences({"a": [1.0, "x"]}, {"a": [1.0 + 1e-14, "x"]}) == []
    assert differences({"a": [1.0]}, {"a": [1.0 + 1e-9]})
    assert differences({"a": 1}, {"a": 2}) and differences({"a": "x"}, {"a": "y"}) and differences([1], [1, 2])
    assert differences({"a": True}, {"a": 1}) and differences({"a": 1}, {"b": 1})
