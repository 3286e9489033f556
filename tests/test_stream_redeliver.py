"""Which refusals ``olu consume`` redelivers and which it dead-letters (app/streaming/apply.py ``_redeliver``).

A write conflict is never the event's fault (other writers moved the model on): redelivered however many times it
recurs, since dead-lettering it loses a write the stream acknowledged to its producer (found by
tests/test_cluster.py's long profile).  A deadline overrun may be the event's own weight: capped."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.errors import Problem
from app.streaming.apply import MAX_DELIVER_ON_ERROR, _redeliver
from app.streaming.events import Event


def _event(delivered: int) -> Event:
    msg = SimpleNamespace(metadata=SimpleNamespace(num_delivered=delivered))
    return Event(msg=msg, stream="S", seq=1, subject="olu.t.m.events", model_id="m", event_id="e", body_sha256="0")


@pytest.mark.parametrize("delivered", [1, MAX_DELIVER_ON_ERROR - 1, MAX_DELIVER_ON_ERROR, 50])
def test_write_conflicts_are_redelivered_however_often(delivered):
    assert _redeliver(Problem(409, "write-conflict"), _event(delivered))


def test_deadline_overruns_are_capped_and_refusals_dead_lettered():
    deadline = Problem(503, "request-deadline-exceeded")
    assert _redeliver(deadline, _event(MAX_DELIVER_ON_ERROR - 1))
    assert not _redeliver(deadline, _event(MAX_DELIVER_ON_ERROR))
    for slug in ("record-not-found", "out-of-bounds-input", "validation-error"):
        assert not _redeliver(Problem(422, slug), _event(1))
