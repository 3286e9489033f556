"""An operation's turns in the fair scheduler (app/api/fairness.py FairScheduler), held from its worker thread.

An operation's step takes its tenant's compute slot as a request does, through the same per-tenant queues served
round robin.  A retrain is one long step: between two checkpoints of the engine (every gradient, every page of
retained examples) it gives the slot back whenever it has held it for ``QUANTUM`` seconds and anyone waits for a
slot, and queues again behind them.  So an operation never holds a slot for longer than a quantum while a request
of any tenant (its own tenant's included) waits for one.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

from .fairness import FairScheduler

QUANTUM = 0.05  # seconds a step keeps its slot while others wait


class SchedulerTurn:
    def __init__(self, scheduler: FairScheduler, loop: asyncio.AbstractEventLoop, tenant_id: str):
        self.scheduler, self.loop, self.tenant_id = scheduler, loop, tenant_id
        self._cm = None
        self.since = 0.0

    async def _enter(self) -> None:
        cm = self.scheduler.slot(self.tenant_id)
        await cm.__aenter__()
        self._cm = cm

    async def _exit(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    def _abandon(self, state: dict) -> None:
        """On the loop: the thread stopped waiting for its slot; give it back if it was granted meanwhile."""
        task = state.get("task")
        if task is None:
            return
        if task.done():
            if not task.cancelled() and task.exception() is None:
                self.loop.create_task(self._exit())
        else:
            task.cancel()  # FairScheduler.slot hands a slot granted at that moment on

    def hold(self, waiting: Callable[[], None]) -> None:
        """Block this (worker) thread until the tenant's slot is granted; ``waiting()`` runs about every 0.25 s
        meanwhile and may raise to stop waiting."""
        granted = threading.Event()
        state: dict = {}

        def begin() -> None:
            state["task"] = task = self.loop.create_task(self._enter())
            task.add_done_callback(lambda _t: granted.set())

        self.loop.call_soon_threadsafe(begin)
        while not granted.wait(0.25):
            try:
                waiting()
            except BaseException:
                self.loop.call_soon_threadsafe(self._abandon, state)
                raise
        task = state["task"]
        if task.cancelled() or task.exception() is not None:
            raise RuntimeError("the compute slot could not be taken")
        self.since = time.monotonic()

    def release(self) -> None:
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._exit(), self.loop).result(timeout=30)
        except Exception:  # noqa: BLE001 - the loop is stopping: nothing left to hand on
            pass

    def maybe_yield(self, waiting: Callable[[], None]) -> None:
        now = time.monotonic()
        if now - self.since < QUANTUM:
            return
        self.since = now
        try:
            others = self.scheduler.waiting() > 0  # read from this thread: a hint, not a decision
        except RuntimeError:  # the queues changed while being counted
            others = True
        if others:
            self.release()
            self.hold(waiting)


def turns_of(scheduler: FairScheduler | None):
    """The runner's ``turns`` factory (tenant id, loop) -> SchedulerTurn, or None without a scheduler."""
    if scheduler is None:
        return None
    return lambda tenant_id, loop: SchedulerTurn(scheduler, loop, tenant_id)
