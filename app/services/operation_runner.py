"""The process side of operations (app/services/operations.py): find, claim, run, heartbeat, give back.

Every API replica runs one ``OperationRunner`` on its event loop (``OLU_OPERATION_WORKERS`` operations at once; 0:
none), and so does ``olu operations work`` (a worker process with no HTTP).  Nothing is queued in memory: every
``OLU_OPERATION_POLL_SECONDS`` (and at once when this process created one) the runner reads the operations it may
claim from the database -- queued ones, and running ones whose lease expired because their process died -- and
claims them with a conditional update on the fencing token (``OperationStore.claim``), the fairest first: tenants
that run fewer operations here come first, and one model runs one operation at a time here.

While an operation runs, its heartbeat renews the lease every third of OLU_OPERATION_LEASE_SECONDS (at most every 2 s),
writes a retrain's progress and reads whether a cancel was asked (from any replica); a heartbeat that finds the
lease taken over stops the computation (its commit would be refused anyway: the token is checked at commit).  The
computation itself runs on a thread of the runner's own pool (app/services/operation_steps.py), in its tenant's turn
of the fair scheduler when the process has one.  When the process stops (SIGTERM: the lifespan's end) the running
operations stop at their next checkpoint and are given back (queued again, for any process, at once).
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .operation_steps import Handle, Turn, execute
from .operations import Lease, OperationStore

log = logging.getLogger("olu.operations")


class OperationRunner:
    def __init__(self, store: OperationStore, core, settings,
                 turns: Callable[[str, asyncio.AbstractEventLoop], Turn | None] | None = None,
                 owner: str | None = None):
        self.store, self.core, self.settings, self.turns = store, core, settings, turns
        self.workers = int(settings.operation_workers)
        self.poll = float(settings.operation_poll_seconds)
        self.owner = owner or f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.running: dict[str, Handle] = {}
        self.outcomes: dict[str, str] = {}  # operation id -> how its run here ended (the last 1000; tests read it)
        self._tasks: set[asyncio.Task] = set()
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.workers), thread_name_prefix="olu-operation")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._main: asyncio.Task | None = None
        self._stopping = False
        store.on_created = self.wake
        store.on_cancel = self.cancel_local

    # ---- life ----------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.workers <= 0 or self._main is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._main = asyncio.create_task(self._run_loop(), name="olu-operations")

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; running operations stop at their next checkpoint and are given back."""
        self._stopping = True
        for h in list(self.running.values()):
            h.stop("shutdown")
        if self._wake is not None:
            self._wake.set()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        if self._main is not None:
            self._main.cancel()
            try:
                await self._main
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Look for operations now (called from any thread)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    def cancel_local(self, operation_id: str) -> None:
        """A cancel asked through this process: stop at once if it runs here (other processes see it at their next
        heartbeat)."""
        h = self.running.get(operation_id)
        if h is not None:
            h.stop("cancel")

    # ---- the loop ------------------------------------------------------------------------------------------------
    async def _run_loop(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            self._wake.clear()
            if len(self.running) < self.workers:
                try:
                    await self._claim_some()
                except Exception:  # noqa: BLE001 - the database may be away for a while: look again later
                    log.warning("looking for operations failed", exc_info=True)
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll)
            except asyncio.TimeoutError:
                pass

    async def _claim_some(self) -> None:
        candidates = await asyncio.to_thread(self.store.candidates, 50)
        here = Counter(h.lease.tenant_id for h in self.running.values())
        models = {h.lease.model_id for h in self.running.values()}
        for c in sorted(candidates, key=lambda c: (here[c.tenant_id], c.id)):
            if self._stopping or len(self.running) >= self.workers:
                return
            if c.model_id in models:
                continue
            lease = await asyncio.to_thread(self.store.claim, c, self.owner)
            if lease is not None:
                models.add(lease.model_id)
                self._spawn(lease)

    def _spawn(self, lease: Lease) -> None:
        assert self._loop is not None
        turn = self.turns(lease.tenant_id, self._loop) if self.turns is not None else None
        h = Handle(lease, self.store, self.settings.operation_deadline_seconds, turn)
        self.running[lease.id] = h
        task = asyncio.create_task(self._execute(h), name=f"olu-operation-{lease.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, h: Handle) -> None:
        assert self._loop is not None
        beat = asyncio.create_task(self._heartbeat(h))
        outcome: Any = "error"
        try:
            outcome = await self._loop.run_in_executor(self._pool, execute, h, self.core)
        except Exception:  # noqa: BLE001 - e.g. the database away while ending it: the lease runs out, retried
            log.exception("operation %s: its run ended on an error", h.lease.id)
        finally:
            beat.cancel()
            self.running.pop(h.lease.id, None)
            self.outcomes[h.lease.id] = outcome
            if len(self.outcomes) > 1000:
                self.outcomes.pop(next(iter(self.outcomes)))
            log.info("operation %s (%s) %s", h.lease.id, h.lease.kind, outcome)
            if self._wake is not None:
                self._wake.set()

    async def _heartbeat(self, h: Handle) -> None:
        every = min(2.0, self.store.lease_seconds / 3.0)
        while True:
            await asyncio.sleep(every)
            try:
                held, cancel = await asyncio.to_thread(self.store.heartbeat, h.lease, h.progress, h.total)
            except Exception:  # noqa: BLE001 - retried at the next beat; the lease has room for a few
                log.warning("operation %s: heartbeat failed", h.lease.id, exc_info=True)
                continue
            if not held:
                h.stop("lost")
                return
            if cancel:
                h.stop("cancel")
