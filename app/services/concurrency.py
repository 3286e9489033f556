"""Optimistic writes: compute outside the database's write lock, under a deadline (ARCHITECTURE.md §4).

A learn / unlearn / retrain reads what it needs in a short read transaction, computes on a private engine copy
with no transaction open, then writes in a short write transaction that re-reads the model row under its lock and
checks that its ``version`` (and status) are still the ones the computation started from.  When another writer
moved the model on meanwhile, the work is done again on the new state (at most ``ATTEMPTS`` times), else the
request is refused with 409 ``write-conflict`` (retry).

Within one process the writes of one model are serialised by a per-model gate (``ModelGates``), so two requests of
the same model queue instead of computing twice; conflicts come only from other processes (replicas, ``olu
consume``).  Different models never wait for each other here, and no database lock is held while computing.

The computation runs on a worker thread and the request waits for it at most ``deadline`` seconds.  A computation
that overruns it is abandoned: the request answers 503 ``request-deadline-exceeded`` (Retry-After) and writes
nothing.  Python cannot stop a thread, so the abandoned computation is stopped cooperatively (issue 29): the
worker runs it with ``Work.check`` installed as the engine's checkpoint (app/unlearning/contract/errors.py,
``cancellable``), which the engine calls at every gradient, every pure-path noise draw and every read of retained
examples; once the request has given up, the next checkpoint raises ``Cancelled`` and the computation ends,
within one gradient or one page of the answer.  Its engine copy is discarded, so nothing it did is kept.  Until it
has ended, the model's gate stays taken, so one model has at most one abandoned computation running and later
writes of that model wait for it (at most their own deadline, then 503).
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import Problem
from ..unlearning.contract.errors import Cancelled, cancellable

ATTEMPTS = 3  # computations of one request before it is refused with write-conflict
__all__ = ["ATTEMPTS", "Cancelled", "Moved", "ModelGates", "Work", "conflict_problem", "deadline_problem"]


class Moved(Exception):
    """The model's version changed between the read and the write: the computation is stale."""


def deadline_problem(seconds: float, what: str) -> Problem:
    return Problem(503, "request-deadline-exceeded",
                   f"{what} did not finish within the request deadline of {seconds:g} s; nothing was changed. "
                   "Retry later; if it keeps happening, the model's specification implies more work per request "
                   "than this service allows.", headers={"Retry-After": str(max(1, math.ceil(seconds)))},
                   deadline_seconds=seconds)


def conflict_problem(model_id: str) -> Problem:
    return Problem(409, "write-conflict",
                   f"Model {model_id} was changed by other requests while this one was computed ({ATTEMPTS} times); "
                   "nothing was changed. Retry the request.", headers={"Retry-After": "1"})


class _Gate:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class Work:
    """One request's turn on a model: its deadline, and the worker thread it computes on."""

    def __init__(self, gates: "ModelGates", model_id: str, gate: _Gate, deadline: float | None):
        self.gates, self.model_id, self.gate = gates, model_id, gate
        self.seconds = deadline
        self.ends = None if deadline is None else time.monotonic() + deadline
        self.cancelled = False
        self._running = None  # the future of an abandoned computation: it releases the gate when it ends

    def check(self) -> None:
        """Called between reads of an abandoned-able computation: stop it once its request has given up."""
        if self.cancelled:
            raise Cancelled()

    def run(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()`` on a worker thread, waited for until the deadline (inline when there is none)."""
        if self.ends is None:
            return fn()

        def guarded():  # the engine's checkpoints stop it once the request has given up (module docstring)
            with cancellable(self.check):
                return fn()

        future = self.gates.pool.submit(guarded)
        try:
            return future.result(timeout=max(0.0, self.ends - time.monotonic()))
        except FutureTimeout:
            self.cancelled = True
            self._running = future
            raise deadline_problem(self.seconds, what) from None

    def _release(self) -> None:
        running, self._running = self._running, None
        if running is None:
            self.gates.release(self.model_id, self.gate)
        else:  # the gate is handed to the abandoned computation: released when it ends
            running.add_done_callback(lambda _f: self.gates.release(self.model_id, self.gate))


_REQUEST = object()  # ModelGates.hold: wait at most the request deadline


def _acquire(lock: threading.Lock, limit: float | None, waiting: Callable[[], None] | None) -> bool:
    if waiting is None:
        return lock.acquire(timeout=-1 if limit is None else limit)
    ends = None if limit is None else time.monotonic() + limit
    while True:
        step = 0.25 if ends is None else max(0.0, min(0.25, ends - time.monotonic()))
        if lock.acquire(timeout=step):
            return True
        if ends is not None and time.monotonic() >= ends:
            return False
        waiting()


class ModelGates:
    """Per-process, per-model gates (created on first use, dropped when no request holds or awaits them)."""

    def __init__(self, deadline: float | None, workers: int = 64):
        self.deadline = deadline if deadline and deadline > 0 else None
        self._gates: dict[str, _Gate] = {}
        self._mu = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="olu-compute")

    @contextmanager
    def hold(self, model_id: str, what: str, *, wait: Any = _REQUEST, make_work: Callable | None = None,
             waiting: Callable[[], None] | None = None) -> Iterator[Work]:
        """The model's gate for one write, waited for at most the deadline (then 503, nothing changed).  No
        computation waits for a compiler (app/unlearning/mechanism/fast.py), so the deadline holds from the first request.
        An operation (app/services/operation_steps.py) passes its own ``wait`` (None: no limit), ``make_work`` (its
        Work) and ``waiting``, called about every 0.25 s while it waits (it raises to stop waiting)."""
        with self._mu:
            gate = self._gates.get(model_id)
            if gate is None:
                gate = self._gates[model_id] = _Gate()
            gate.users += 1
        limit = self.deadline if wait is _REQUEST else wait
        try:
            got = _acquire(gate.lock, limit, waiting)
        except BaseException:
            self.release(model_id, gate, locked=False)
            raise
        if not got:
            self.release(model_id, gate, locked=False)
            raise deadline_problem(limit, f"{what} waited for an earlier request on this model that")
        work = Work(self, model_id, gate, self.deadline) if make_work is None else make_work(self, model_id, gate)
        try:
            yield work
        finally:
            work._release()

    def release(self, model_id: str, gate: _Gate, locked: bool = True) -> None:
        if locked:
            gate.lock.release()
        with self._mu:
            gate.users -= 1
            if gate.users == 0 and self._gates.get(model_id) is gate:
                del self._gates[model_id]

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
