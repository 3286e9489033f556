"""What an operation does (app/services/operations.py): its steps, on the same use cases as the requests.

- **retrain**: one step, ``Learning.retrain``; its progress is the records the engine has read of those the model
  holds (``CountingRetained`` wraps the reader it streams from; no engine change), reset when a take-over starts
  it again.  Nothing is applied before its single commit.
- **unlearn** (bulk): one step per batch of at most the model's ``max_forget_batch`` records, ``Forgetting.unlearn``
  each, committed one by one; each batch's transaction also records the batch's receipts (in the order of the
  request's ids), the operation's progress and the deletion of the batch's sealed chunk, so a take-over resumes
  after the last committed batch.  A record another request forgot meanwhile keeps the receipt it got.
- **learn** (large): one step per chunk of at most ``max_learn_batch`` examples, ``Learning.learn`` each, committed
  one by one, as above.

Every commit goes through ``Commit.complete`` in the write's own transaction: the fenced update of
``OperationStore.commit``.  Every step runs on an ``OperationWork``: inline on the operation's thread, with the
operation's own deadline (OLU_OPERATION_DEADLINE_SECONDS, not the request deadline), and with ``Handle.check``
installed as the engine's checkpoint: it stops the computation once the operation is cancelled, its lease is lost,
the process is stopping or the step's deadline passed, and it gives the tenant's compute slot to others waiting for
one between two checkpoints (``Turn``, app/api/operation_turns.py).  The stored request names records by their
commitment only: a problem names a record by its position in the request (``#17``).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Collection, Iterator, Protocol, Sequence

import numpy as np
from sqlalchemy.exc import DBAPIError

from ..db.record_batches import lookups_of
from ..errors import Problem
from .concurrency import Cancelled, Work, cancellable
from .forgetting import Forgetting
from .learning import Learning
from .model_core import _forgotten
from .operations import Fenced, Lease, OperationStore, problem_json

log = logging.getLogger("olu.operations")
DIGEST = 32


class Stop(Cancelled):
    """The operation stops at this checkpoint: ``why`` is cancel, lost (lease), shutdown or deadline."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class Turn(Protocol):
    """The tenant's compute slot (app/api/operation_turns.py), held from the operation's thread."""

    def hold(self, waiting: Callable[[], None]) -> None: ...

    def release(self) -> None: ...

    def maybe_yield(self, waiting: Callable[[], None]) -> None: ...


class Handle:
    """One operation running in this process: its lease, why it must stop (set from other threads), its
    in-memory progress, its step deadline, and its turn in the fair scheduler."""

    def __init__(self, lease: Lease, store: OperationStore, deadline: float | None, turn: Turn | None = None):
        self.lease, self.store, self.turn = lease, store, turn
        self.deadline = deadline if deadline and deadline > 0 else None
        self.why: str | None = "cancel" if lease.cancel_requested else None
        self.ends: float | None = None
        self.progress: int | None = None  # records read by a retrain (written by the heartbeat)
        self.total: int | None = None
        self._holding = False

    def stop(self, why: str) -> None:
        if self.why is None:
            self.why = why

    def begin_step(self) -> None:
        self.ends = None if self.deadline is None else time.monotonic() + self.deadline

    def stopped(self) -> None:
        if self.why is not None:
            raise Stop(self.why)
        if self.ends is not None and time.monotonic() > self.ends:
            raise Stop("deadline")

    def check(self) -> None:
        """The engine's checkpoint while the operation computes."""
        self.stopped()
        if self.turn is not None and self._holding:
            self.turn.maybe_yield(self.stopped)

    def advance(self, n: int) -> None:
        done = (self.progress or 0) + int(n)
        self.progress = done if self.total is None else min(done, self.total)

    @contextmanager
    def turn_held(self) -> Iterator[None]:
        if self.turn is None:
            yield
            return
        self.turn.hold(self.stopped)
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self.turn.release()


class OperationWork(Work):
    """A step's turn on a model: inline on the operation's thread, stopped through ``Handle.check``."""

    def __init__(self, gates, model_id: str, gate, handle: Handle):
        super().__init__(gates, model_id, gate, None)
        self.handle = handle

    def check(self) -> None:
        self.handle.check()

    def run(self, fn: Callable[[], Any], what: str) -> Any:
        with cancellable(self.check):
            return fn()


class CountingRetained:
    """The retained examples a retrain streams from, counting the records read (the operation's progress)."""

    def __init__(self, inner, handle: Handle):
        self.inner, self.handle = inner, handle

    def __len__(self) -> int:
        return len(self.inner)

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        out = self.inner.get(steps)
        self.handle.advance(len(steps))
        return out

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for part in self.inner.chunks(size, exclude):
            self.handle.advance(len(part[0]))
            yield part

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _Operated:
    """A use case run by an operation: its own gate wait and Work (no request deadline), commitments given."""

    handle: Handle
    digests: list[bytes]

    def _hold(self, model_id: str, what: str):
        h = self.handle
        return self.gates.hold(model_id, what, wait=None, waiting=h.stopped,
                               make_work=lambda gates, mid, gate: OperationWork(gates, mid, gate, h))

    def _commitments(self, key: bytes, ids: list[str]) -> list[bytes]:
        return self.digests


class OperationLearning(_Operated, Learning):
    rows: tuple[np.ndarray, np.ndarray]

    def _reader(self, work, row, engine):
        self.handle.total = max(0, int(row.n_records) - int(row.n_forgotten))
        self.handle.progress = 0  # a new attempt reads from the start
        return CountingRetained(super()._reader(work, row, engine), self.handle)

    def _learn_rows(self, spec, X: Any, y: Any, F: list | None) -> tuple[Any, Any]:
        return self.rows  # checked (and encoded) when the operation was created


class OperationForgetting(_Operated, Forgetting):
    pass


class Commit:
    """The guard a use case completes inside its write transaction: the operation's fenced commit."""

    status_code = 202

    def __init__(self, handle: Handle, build: Callable[[dict[str, Any]], dict[str, Any]]):
        self.handle, self.build = handle, build

    def complete(self, s, result: dict[str, Any]) -> None:
        self.handle.store.commit(s, self.handle.lease, **self.build(result))


def _split(packed: bytes) -> list[bytes]:
    return [packed[i : i + DIGEST] for i in range(0, len(packed), DIGEST)]


def run_retrain(h: Handle, core) -> None:
    svc = OperationLearning(core)
    svc.handle = h
    h.begin_step()
    lease = h.lease
    with h.turn_held():
        svc.retrain(lease.tenant_id, lease.model_id, guard=Commit(h, lambda r: {
            "done": h.total or 0, "result": r, "final": True}))


def _chunks(h: Handle) -> Iterator[tuple[int, dict]]:
    for seq in range(h.store.chunk_count(h.lease)):
        chunk = h.store.chunk(h.lease, seq)
        if chunk is not None:  # None: applied before a take-over
            h.stopped()
            yield seq, chunk


def run_unlearn(h: Handle, core) -> None:
    svc = OperationForgetting(core)
    svc.handle = h
    lease = h.lease
    link = f"/v1/operations/{lease.id}/receipts"
    for seq, chunk in _chunks(h):
        start, digests = int(chunk["start"]), _split(chunk["digests"])
        commits = [d.hex() for d in digests]
        with core.db.read() as s:  # forgotten by another request since the operation was made: keep its receipt
            gone = _forgotten(s, lease.model_id, commits, lookups_of(b"".join(digests)).tolist())
        keep = [i for i, c in enumerate(commits) if c not in gone]
        prior = [(start + i, gone[c]) for i, c in enumerate(commits) if c in gone and gone[c] is not None]
        end = start + len(digests)

        def build(result: dict[str, Any] | None, keep=keep, prior=prior, start=start, end=end,
                  seq=seq) -> dict[str, Any]:
            made = [] if result is None else [(start + keep[j], r["id"]) for j, r in enumerate(result["receipts"])]
            before = lease.result or {}
            version = before.get("version") if result is None else result["version"]
            forgotten = int(before.get("forgotten", 0)) + len(made) + len(prior)
            return {"done": end, "final": end >= lease.total, "receipts": sorted(prior + made), "applied_chunk": seq,
                    "result": {"version": version, "forgotten": forgotten, "receipts": link}}

        if not keep:
            with core.db.write() as s:
                h.store.commit(s, lease, **build(None))
            continue
        svc.digests = [digests[i] for i in keep]
        ids = [f"#{start + i}" for i in keep]
        stored = chunk.get("examples")
        examples = None if stored is None else [(ids[j], *stored[i]) for j, i in enumerate(keep)]
        h.begin_step()
        with h.turn_held():
            svc.unlearn(lease.tenant_id, lease.model_id, ids, Commit(h, build), examples)


def run_learn(h: Handle, core) -> None:
    svc = OperationLearning(core)
    svc.handle = h
    lease = h.lease
    for seq, chunk in _chunks(h):
        start, digests = int(chunk["start"]), _split(chunk["digests"])
        end = start + len(digests)

        def build(result: dict[str, Any], end=end, seq=seq) -> dict[str, Any]:
            before = lease.result or {}
            out = {"accepted": int(before.get("accepted", 0)) + result["accepted"],
                   "first_step": before.get("first_step", result["first_step"]), "last_step": result["last_step"],
                   "version": result["version"]}
            ranges = [r for r in (before.get("restart_on_forget"), result.get("restart_on_forget")) if r]
            if ranges:
                out["restart_on_forget"] = {"first_step": min(r["first_step"] for r in ranges),
                                            "last_step": max(r["last_step"] for r in ranges)}
            return {"done": end, "final": end >= lease.total, "result": out, "applied_chunk": seq}

        svc.digests, svc.rows = digests, (chunk["X"], chunk["y"])
        ids = [f"#{start + i}" for i in range(len(digests))]
        h.begin_step()
        with h.turn_held():
            svc.learn(lease.tenant_id, lease.model_id, ids, chunk["X"], chunk["y"], Commit(h, build))


RUNS = {"retrain": run_retrain, "unlearn": run_unlearn, "learn": run_learn}


def execute(h: Handle, core) -> str:
    """Run the operation to its end in this process, or until it must stop; what happened: succeeded, failed,
    cancelled, lost (another process holds it now), shutdown (given back), deadline (failed)."""
    store, lease = h.store, h.lease
    try:
        h.stopped()
        RUNS[lease.kind](h, core)
        if lease.kind != "retrain" and lease.done < lease.total:  # nothing left to apply (chunks gone): end it
            raise Problem(500, "internal-error", "The operation's request is incomplete.")
        return "succeeded"
    except Stop as e:
        why = e.why
    except Fenced:
        why = "cancel" if store.cancel_asked(lease) else "lost"
    except Problem as p:
        store.end(lease, "failed", problem_json(p))
        return "failed"
    except DBAPIError:  # the database is unreachable: the lease runs out and a process tries again
        log.exception("operation %s stopped: database error", lease.id)
        return "lost"
    except Exception:  # noqa: BLE001 - an operation never takes its process down
        log.exception("operation %s failed", lease.id)
        store.end(lease, "failed", problem_json(Problem(
            500, "internal-error", "The operation failed on an internal error; nothing of its last step was applied.")))
        return "failed"
    if why == "cancel":
        store.end(lease, "cancelled")
    elif why == "shutdown":
        store.release(lease)
    elif why == "deadline":
        store.end(lease, "failed", problem_json(Problem(
            503, "operation-deadline-exceeded", f"A step of this operation did not finish within "
            f"OLU_OPERATION_DEADLINE_SECONDS ({h.deadline:g} s); nothing of that step was applied.")))
        return "failed"
    return "cancelled" if why == "cancel" else why
