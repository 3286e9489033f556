"""``olu consume``: learn / unlearn events of a tenant's models from NATS JetStream, applied exactly once.

The loop (docs/streaming.md): fetch up to ``batch`` messages from a durable pull consumer (``max_ack_pending``
bounds the messages in flight across every process sharing the consumer: backpressure), decode them, group them
by model subject, and for each subject in stream order:

1. order check: the subject's cursor (last sequence taken into account, from the database) and the stream itself
   (``STREAM.MSG.GET`` with ``next_by_subj``) tell whether an earlier event of this model is still pending
   elsewhere (another process holds it, or it awaits redelivery); events after such a gap are nak'd and come
   back later, so a model's events are applied in stream order whatever the number of processes;
2. apply (app/streaming/apply.py, in a worker thread): event ids recorded in the same transaction as the write,
   the cursor advanced conditionally; dead letters recorded in their own transaction;
3. publish the results (receipts, learn acknowledgements, dead letters), flush, and only then ack.

A crash anywhere loses nothing: before the commit the event is redelivered and applied; after it, the redelivered
event is recognised by its recorded id and its stored result is published again.  SIGTERM / SIGINT stop the loop
after the batch in hand is applied, published and acknowledged.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .apply import Applier, Outcome
from .events import Event, decode_event

log = logging.getLogger("olu.stream")
NAK_DELAY = 0.25  # seconds before an event held back by the order check is redelivered


class StreamMetrics:
    """Prometheus metrics of one consumer process (its own registry; served on --metrics-port)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.applied = Counter("olu_stream_events_applied_total", "Events applied", ["kind"], registry=r)
        self.dead = Counter("olu_stream_events_dead_lettered_total", "Events dead-lettered", ["type"], registry=r)
        self.duplicates = Counter("olu_stream_events_duplicate_total",
                                  "Events already applied (result re-published, not applied again)", registry=r)
        self.redelivered = Counter("olu_stream_events_redelivered_total", "Messages delivered more than once",
                                   registry=r)
        self.held = Counter("olu_stream_events_held_back_total",
                            "Messages nak'd to keep a model's order or after a retryable failure", registry=r)
        self.lag = Gauge("olu_stream_lag_messages", "Messages of the stream not yet delivered to this consumer",
                         registry=r)
        self.in_flight = Gauge("olu_stream_in_flight_messages", "Messages fetched and not yet acked or nak'd",
                               registry=r)
        self.batch_seconds = Histogram("olu_stream_batch_seconds", "Time to apply, publish and ack one fetch",
                                       registry=r, buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))

    def totals(self) -> dict[str, int]:
        """What this process did: events applied, dead-lettered, already applied (duplicates), held back."""
        def total(counter) -> int:
            return int(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))

        return {"applied": total(self.applied), "dead-lettered": total(self.dead),
                "duplicates": total(self.duplicates), "held back": total(self.held)}


@dataclass
class ConsumerConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    stream: str = "OLU_EVENTS"
    durable: str | None = None  # default olu-<tenant id>
    subject_prefix: str = "olu"
    batch: int = 100  # messages per fetch
    max_ack_pending: int = 1000
    ack_wait: float = 30.0
    fetch_timeout: float = 1.0
    create_stream: bool = False
    results_subject: str = "{prefix}.{tenant}.{model}.results"
    dead_letter_subject: str = "{prefix}.{tenant}.dead"
    metrics_port: int | None = None

    def filter_subject(self, tenant_id: str) -> str:
        return f"{self.subject_prefix}.{tenant_id}.*.events"


def model_of(subject: str, prefix: str, tenant_id: str) -> str | None:
    parts = subject.split(".")
    head = prefix.split(".")
    if len(parts) == len(head) + 3 and parts[:len(head)] == head and parts[len(head)] == tenant_id \
            and parts[-1] == "events":
        return parts[len(head) + 1]
    return None


class Consumer:
    def __init__(self, applier: Applier, tenant_id: str, config: ConsumerConfig, metrics: StreamMetrics | None = None):
        self.applier, self.tenant_id, self.cfg = applier, tenant_id, config
        self.metrics = metrics or StreamMetrics()
        self.stopping = asyncio.Event()
        self.nc = self.js = self.sub = None
        self.durable = config.durable or f"olu-{tenant_id}"

    def _template(self, t: str) -> str:
        return t.replace("{prefix}", self.cfg.subject_prefix)

    async def connect(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig as JsConsumerConfig, DeliverPolicy, RetentionPolicy
        from nats.js.errors import NotFoundError

        self.nc = await nats.connect(self.cfg.nats_url, name=f"olu-consume-{self.tenant_id}")
        self.js = self.nc.jetstream()
        subject = self.cfg.filter_subject(self.tenant_id)
        try:
            await self.js.stream_info(self.cfg.stream)
        except NotFoundError:
            if not self.cfg.create_stream:
                raise RuntimeError(f"no JetStream stream {self.cfg.stream!r}; create it (subjects {subject}) or pass "
                                   "--create-stream") from None
            # work-queue retention: the broker deletes an event once it is acknowledged (after its commit), so a
            # learn event's features do not outlive their application in the broker's storage (docs/streaming.md)
            await self.js.add_stream(name=self.cfg.stream, subjects=[subject], retention=RetentionPolicy.WORK_QUEUE)
            log.info("created stream %s on %s", self.cfg.stream, subject)
        self.sub = await self.js.pull_subscribe(
            subject, durable=self.durable, stream=self.cfg.stream,
            config=JsConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                                    deliver_policy=DeliverPolicy.ALL, ack_wait=self.cfg.ack_wait,
                                    max_ack_pending=self.cfg.max_ack_pending, filter_subject=subject,
                                    max_deliver=-1))

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: finishing the batch in hand")
        self.stopping.set()

    async def run(self) -> None:
        """Consume until ``stop`` (SIGTERM): the batch in hand is finished, published and acked first."""
        from nats.errors import TimeoutError as NatsTimeout

        if self.cfg.metrics_port is not None:
            start_http_server(self.cfg.metrics_port, addr="127.0.0.1", registry=self.metrics.registry)
        if self.nc is None:
            await self.connect()
        try:
            while not self.stopping.is_set():
                try:
                    msgs = await self.sub.fetch(self.cfg.batch, timeout=self.cfg.fetch_timeout)
                except (NatsTimeout, asyncio.TimeoutError):
                    await self._update_lag()
                    continue
                await self.handle(msgs)
        finally:
            await self.close()

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                await self.nc.flush(timeout=5)  # the last acks reach the server
            finally:
                await self.nc.close()  # not drain(): a pull subscription's drain waits out its timeout

    async def _update_lag(self) -> None:
        try:
            info = await self.sub.consumer_info()
            self.metrics.lag.set(info.num_pending or 0)
        except Exception:  # noqa: BLE001 - metrics only
            pass

    def _decode(self, m) -> Event | None:
        md = m.metadata
        model = model_of(m.subject, self.cfg.subject_prefix, self.tenant_id)
        return decode_event(m.data, m.headers, stream=md.stream, seq=md.sequence.stream, subject=m.subject,
                            model_id=model or "", msg=m, redelivered=md.num_delivered > 1)

    async def handle(self, msgs: list) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.metrics.in_flight.set(len(msgs))
        if not msgs:
            return
        p = await asyncio.to_thread(self.applier.tenants.authenticate, self.applier.worker_key)
        if p is None or p.tenant_id != self.tenant_id:
            for m in msgs:  # nothing is lost: redelivered to a consumer with a valid key
                await m.nak(delay=NAK_DELAY)
            raise RuntimeError("the consumer's API key is revoked or invalid; stopping")
        events = [self._decode(m) for m in msgs]
        self.metrics.lag.set(msgs[-1].metadata.num_pending)
        for ev in events:
            if ev.redelivered:
                self.metrics.redelivered.inc()
        fetched = {ev.seq for ev in events}
        runs: dict[str, list[Event]] = {}
        for ev in sorted(events, key=lambda e: e.seq):
            runs.setdefault(ev.subject, []).append(ev)
        beat = asyncio.create_task(self._heartbeat(msgs))
        try:
            for subject, run in runs.items():
                cursor = await asyncio.to_thread(self.applier.cursor, run[0].stream, subject)
                n = await self._cleared(run, cursor, fetched)
                outcomes = await asyncio.to_thread(self.applier.apply_run, run[:n], cursor) if n else []
                outcomes += [Outcome(ev, "nak", "retry", kind=ev.kind) for ev in run[n:]]
                await self._finish(outcomes)
        finally:
            beat.cancel()
        self.metrics.in_flight.set(0)
        self.metrics.batch_seconds.observe(loop.time() - started)

    async def _heartbeat(self, msgs: list) -> None:
        """While a fetch is being applied, tell JetStream it is in progress (a long first learn, e.g. while the
        compiled loops warm up, is not redelivered to another process meanwhile; an ack'd message ignores it)."""
        while True:
            await asyncio.sleep(max(self.cfg.ack_wait / 3, 0.5))
            for m in msgs:
                try:
                    await m.in_progress()
                except Exception:  # noqa: BLE001 - best effort
                    pass

    async def _cleared(self, run: list[Event], cursor: int | None, fetched: set[int]) -> int:
        """How many events of ``run`` (one model subject, in order) may be applied now: none of the stream's
        messages on this subject between the cursor and them is held elsewhere."""
        from nats.js.errors import NotFoundError

        prev = cursor or 0
        for i, ev in enumerate(run):
            if ev.seq <= prev:  # taken into account before (a redelivery): its stored result is re-published
                continue
            gap = ev.seq - prev - 1
            if gap and not (gap <= len(fetched) and all(s in fetched for s in range(prev + 1, ev.seq))):
                try:  # the first message of this subject after prev (messages of other subjects don't matter)
                    first = await self.js.get_msg(ev.stream, seq=prev + 1, subject=ev.subject, next=True)
                    if first.seq < ev.seq:
                        return i
                except NotFoundError:
                    pass
            prev = ev.seq
        return len(run)

    async def _finish(self, outcomes: list[Outcome]) -> None:
        """Publish what the committed transactions produced, flush, then ack (or nak what is to come back)."""
        for o in outcomes:
            for p in o.publications:
                await self.nc.publish(p.subject, p.payload, headers=p.headers)
        if any(o.publications for o in outcomes):
            await self.nc.flush()
        for o in outcomes:
            if o.action == "ack":
                await o.event.msg.ack()
                if o.status == "applied":
                    self.metrics.applied.labels(o.kind).inc()
                elif o.status == "dead_letter":
                    self.metrics.dead.labels(o.slug or "unknown").inc()
                else:
                    self.metrics.duplicates.inc()
            else:
                await o.event.msg.nak(delay=NAK_DELAY)
                self.metrics.held.inc()
        await self.nc.flush()


def _why(db, api_key: str) -> str:
    """Why a key does not authenticate, without revealing anything secret (its public prefix at most)."""
    from sqlalchemy import select

    from ..db.tables import ApiKey

    parts = api_key.split("_")
    if len(parts) < 3 or parts[0] != "olu":
        return "not of the form olu_<prefix>_<secret>"
    with db.read() as s:
        row = s.execute(select(ApiKey.revoked_at).where(ApiKey.prefix == parts[1])).first()
    if row is None:
        return f"no key with prefix {parts[1]} in {db.url.split('@')[-1]}"
    return "revoked" if row[0] is not None else "wrong secret"


def build(settings, api_key: str, config: ConsumerConfig) -> tuple[Consumer, Any]:
    """The consumer on the configured database, signing receipts with the service's key ring (as the API)."""
    from ..main import limit_process, open_storage
    from ..receipts.keystore import load_or_create_keyring
    from ..registry import ModelRegistry
    from ..services.models import ModelService
    from ..services.receipts import ReceiptIssuer
    from ..services.tenants import TenantService

    db, cipher = open_storage(settings)
    keyring = load_or_create_keyring(settings.data_dir,
                                     settings.signing_key.get_secret_value() if settings.signing_key else None,
                                     settings.signing_key_file)
    tenants = TenantService(db, cipher, settings.auth_cache_seconds)
    principal = tenants.authenticate(api_key)
    if principal is None or principal.tenant_id is None:
        raise RuntimeError(f"the API key given to the consumer is not a valid tenant key ({_why(db, api_key)})")
    if "write" not in principal.scopes:
        log.warning("the consumer's key has no 'write' scope: events without their own key will be dead-lettered")
    limit_process(settings.blas_threads)  # as the HTTP service (config.py blas_threads)
    models = ModelService(db, ModelRegistry(cipher=cipher, state_log=settings.state_log), ReceiptIssuer(keyring), settings)
    tid = principal.tenant_id
    applier = Applier(db, models, tenants, tid, api_key, max_batch=settings.max_batch,
                      results_subject=config.results_subject.replace("{prefix}", config.subject_prefix),
                      dead_letter_subject=config.dead_letter_subject.replace("{prefix}", config.subject_prefix))
    return Consumer(applier, tid, config), db
