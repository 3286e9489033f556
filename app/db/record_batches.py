"""Learned records, one row per learn request, and the per-process index that finds them by commitment.

A learn request of n examples writes one ``record_batches`` row: the n commitments (32 bytes each), the step that
learned the first (and the other steps only when they are not consecutive) and, for families whose clients send
features to unlearn, the example MACs.  One row instead of n indexed rows: a B-tree keyed by random values
dirties about one page per inserted row once it outgrows a batch, which made the durable write of 1000 records
~6 ms of a learn request (docs/performance.md §2).

Finding records by commitment (learn's duplicate check, unlearn, the audit) goes through a ``RecordIndex``: per
model and per process, the lookups (each commitment's first 8 bytes) of all the model's batches in sorted runs (a
small log-structured merge: each new batch is a run, runs of similar size are merged, so there are O(log n)
runs).  Before each use it catches up inside the caller's transaction by reading the model's batches with an id
above the last one it holds.  This is correct because a model's batches are added only under the model's write
lock (so their ids increase in commit order), are never changed except that a forgotten record's MAC is zeroed,
and are deleted only with the model.  Candidates from the index are confirmed on the full 32-byte commitment
read from the batch row.

The indexes of a process hold at most ``max_entries`` lookups in all (``OLU_RECORD_INDEX_MAX_ENTRIES``; by default
an eighth of the memory the process may use, ``index_budget``); beyond it whole indexes are dropped, least
recently used first, and rebuilt from the database (O(records)) when their model is next used.  Plain LRU thrashes
when models used in turn hold more than the budget: the index dropped is always the one needed next, so most
requests rebuild one (docs/performance.md §15).  So an index built from zero that leaves the total over the budget
is placed first in line to be dropped, instead of last: the indexes that fit stay, and with k models used in turn
of which k - 1 fit, one request in k rebuilds instead of one in two (one of three fitting: two in three instead of
every one; tests/test_record_index_budget.py).  This is the "second chance" of LRU-2 / 2Q: an index earns its place
by a second use while it is still held; a plain LRU policy is kept otherwise.  The total may exceed the budget by
the index in use, as before: the drops happen when an index is next asked for.  Rebuilds of dropped indexes are counted
(``olu_record_index_rebuilds_total``) and logged at most once a minute.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from sqlalchemy import BigInteger, any_, bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY

from .tables import RecordBatch

SLOT_BITS = 20  # an index position is batch_id << SLOT_BITS | slot
MAX_BATCH = 1 << SLOT_BITS  # records per batch row (the service's max_batch is far below)
DIGEST = 32
ENTRY_BYTES = 16  # an int64 lookup and an int64 position
MIN_AUTO_ENTRIES = 4_000_000  # the automatic budget's floor (the fixed default before it, 64 MB)
WARN_EVERY = 60.0  # seconds between two warnings of rebuilds

log = logging.getLogger("olu.records")

_BATCHES = RecordBatch.__table__
_CATCH_UP = (select(_BATCHES.c.id, _BATCHES.c.commitments)
             .where(_BATCHES.c.model_id == bindparam("mid"), _BATCHES.c.id > bindparam("after"))
             .order_by(_BATCHES.c.id))
_ROW_COLUMNS = (_BATCHES.c.id, _BATCHES.c.commitments, _BATCHES.c.first_step, _BATCHES.c.steps,
                _BATCHES.c.example_macs, _BATCHES.c.learned_at)
_ROWS = select(*_ROW_COLUMNS).where(_BATCHES.c.id.in_(bindparam("ids", expanding=True)))
_ROWS_ANY = select(*_ROW_COLUMNS).where(_BATCHES.c.id == any_(bindparam("ids", type_=PG_ARRAY(BigInteger))))
_INSERT = insert(_BATCHES)
_SET_MACS = update(_BATCHES).where(_BATCHES.c.id == bindparam("bid")).values(example_macs=bindparam("macs"))


def lookups_of(digests: Sequence[bytes] | bytes) -> np.ndarray:
    """Each commitment's first 8 bytes as a signed big-endian integer (== ``tenants.lookup_key`` of its hex)."""
    packed = digests if isinstance(digests, bytes) else packed_digests(digests)
    return np.frombuffer(packed, dtype=">i8").reshape(-1, DIGEST // 8)[:, 0].astype(np.int64)


def memory_limit(cgroup: Path = Path("/sys/fs/cgroup"), physical: int | None = None) -> int:
    """The bytes this process may use: its cgroup's memory limit (v2 ``memory.max``, else v1
    ``memory/memory.limit_in_bytes``) where one is set below the machine's physical memory, else the latter."""
    if physical is None:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (cgroup / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # v1 without a limit says 2^63 rounded down to a page: min() reads it as none
            return min(int(text), physical)
        if text == "max":  # v2 without a limit
            break
    return physical


def index_budget(setting: int | None, cgroup: Path = Path("/sys/fs/cgroup"), physical: int | None = None) -> int:
    """``OLU_RECORD_INDEX_MAX_ENTRIES``: as set, or when unset (None) an eighth of ``memory_limit`` in 16-byte
    entries, at least ``MIN_AUTO_ENTRIES``."""
    if setting is not None:
        return max(0, int(setting))
    return max(MIN_AUTO_ENTRIES, memory_limit(cgroup, physical) // 8 // ENTRY_BYTES)


def _merge(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge two sorted runs in O(len): b[i] lands at searchsorted(a, b[i]) + i."""
    (ka, pa), (kb, pb) = a, b
    at = np.searchsorted(ka, kb, side="right") + np.arange(len(kb))
    keys = np.empty(len(ka) + len(kb), dtype=np.int64)
    pos = np.empty_like(keys)
    rest = np.ones(len(keys), dtype=bool)
    rest[at] = False
    keys[at], pos[at] = kb, pb
    keys[rest], pos[rest] = ka, pa
    return keys, pos


class RecordIndex:
    """The lookups of one model's batches, as sorted runs of (lookup, batch_id << SLOT_BITS | slot)."""

    def __init__(self, book: RecordBook | None = None) -> None:
        self.lock = threading.Lock()
        self.last_batch = 0  # the highest batch id held; batches are added in id order
        self.version = None  # a model version this index is known to be complete for (see RecordBook.find)
        self.size = 0
        self.book = book  # the book whose running total counts this index (None once it is dropped from it)
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, batch_id: int, lookups: np.ndarray) -> None:
        if batch_id <= self.last_batch:
            return
        order = np.argsort(lookups, kind="stable")
        self.runs.append((lookups[order], (np.int64(batch_id) << SLOT_BITS) | order.astype(np.int64)))
        self.last_batch = batch_id
        book = self.book
        if book is None:
            self.size += len(lookups)
        else:
            book._grew(self, len(lookups))
        while len(self.runs) > 1 and 2 * len(self.runs[-1][0]) >= len(self.runs[-2][0]):
            newer = self.runs.pop()
            self.runs.append(_merge(self.runs.pop(), newer))

    def candidates(self, lookups: np.ndarray) -> list[tuple[int, int]]:
        """(query index, position) of every held entry whose lookup equals a queried one."""
        out = []
        order = np.argsort(lookups)
        wanted = lookups[order]  # sorted needles: the searches walk each run in order (4x faster than unsorted)
        for keys, pos in self.runs:
            lo = np.searchsorted(keys, wanted, side="left")
            hit = np.flatnonzero(keys[np.minimum(lo, len(keys) - 1)] == wanted)
            for h in hit:  # rare: a duplicate, a record being unlearned, or a shared 8-byte prefix
                j = int(lo[h])
                while j < len(keys) and keys[j] == wanted[h]:
                    out.append((int(order[h]), int(pos[j])))
                    j += 1
        return out


class PackedDigests(Sequence[bytes]):
    """32-byte digests stored end to end in one bytes object (``packed``): what the decode pool answers for many
    commitments, used as the list of digests it stands for without slicing each one out (``RecordBook.find`` takes
    ``packed`` as it is)."""

    def __init__(self, packed: bytes):
        if len(packed) % 32:
            raise ValueError("packed digests must be whole 32-byte digests")
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed) // 32

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                return [self[k] for k in range(a, b, step)]
            return PackedDigests(self.packed[a * 32 : max(a, b) * 32])
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("digest index out of range")
        return self.packed[i * 32 : (i + 1) * 32]


def packed_digests(digests: Sequence[bytes]) -> bytes:
    """The digests end to end (``PackedDigests`` keep theirs so)."""
    return digests.packed if isinstance(digests, PackedDigests) else b"".join(digests)


@dataclass
class Probe:
    """What ``find`` saw: the model's index, the batch it had reached, and the probed commitments."""
    index: RecordIndex
    seen: int
    version: int | None
    model_id: str
    packed: bytes  # the commitments, 32 bytes each
    lookups: np.ndarray


@dataclass
class Found:
    """A learned record, located in its batch row."""
    batch_id: int
    slot: int
    step: int
    example_mac: bytes | None  # None when the family keeps none, or once zeroed
    learned_at: object


class RecordBook:
    """Per process: the ``RecordIndex`` of each model it has used (least recently used evicted beyond
    ``max_entries`` lookups in all, or beyond ``max_models`` indexes: the audit visits every model of a tenant;
    an index built from zero past ``max_entries`` goes first, see the module's docstring), and the SQL of the
    ``record_batches`` table."""

    def __init__(self, max_entries: int, is_postgresql: bool, max_models: int = 10_000) -> None:
        self.max_entries, self.max_models = max_entries, max_models
        self.is_postgresql = is_postgresql
        self._indexes: OrderedDict[str, RecordIndex] = OrderedDict()
        self._lock = threading.Lock()
        # the lookups held over all indexes, kept as they grow: summing them on every request cost O(models)
        # (0.7 ms per request with 10^4 models, bench --sections models)
        self._total = 0
        self._dropped: OrderedDict[str, None] = OrderedDict()  # models whose index went for max_entries (bounded)
        self.rebuilds = 0  # indexes rebuilt after being dropped for max_entries (olu_record_index_rebuilds_total)
        self._unwarned = 0  # of which not yet in a warning
        self._warned_at = -WARN_EVERY
        self.clock = time.monotonic

    @property
    def entries(self) -> int:
        """The lookups held over all indexes (olu_record_index_entries)."""
        return self._total

    def _grew(self, idx: RecordIndex, n: int) -> None:
        """``idx`` holds ``n`` more lookups (its size and the total change together, under the book's lock)."""
        with self._lock:
            idx.size += n
            if idx.book is self:
                self._total += n

    def _drop(self, idx: RecordIndex) -> None:  # under self._lock
        idx.book = None
        self._total -= idx.size

    def _index(self, model_id: str) -> RecordIndex:
        with self._lock:
            idx = self._indexes.get(model_id)
            if idx is None:
                idx = self._indexes[model_id] = RecordIndex(self)
            self._indexes.move_to_end(model_id)
            while (self._total > self.max_entries or len(self._indexes) > self.max_models) and len(self._indexes) > 1:
                over = self._total > self.max_entries
                dropped, old = self._indexes.popitem(last=False)
                self._drop(old)
                if over and old.size:
                    self._dropped[dropped] = None
                    if len(self._dropped) > self.max_models:
                        self._dropped.popitem(last=False)
            return idx

    def _built(self, model_id: str, idx: RecordIndex) -> None:
        """``idx`` was just built from zero: count it if its model's index had been dropped for the budget, and put
        it first in line to be dropped if it took the total past the budget."""
        with self._lock:
            rebuilt = model_id in self._dropped
            self._dropped.pop(model_id, None)
            if self._total > self.max_entries and self._indexes.get(model_id) is idx:
                self._indexes.move_to_end(model_id, last=False)
            if not rebuilt:
                return
            self.rebuilds += 1
            self._unwarned += 1
            now = self.clock()
            if now - self._warned_at < WARN_EVERY:
                return
            self._warned_at, count, self._unwarned = now, self._unwarned, 0
            entries = self._total
        log.warning("record indexes dropped for OLU_RECORD_INDEX_MAX_ENTRIES were rebuilt from the database: %d "
                    "rebuilds since the last warning, %d entries held against a budget of %d; raise it above the "
                    "records of the models used together", count, entries, self.max_entries,
                    extra={"rebuilds": count, "entries": entries, "max_entries": self.max_entries})

    def evict(self, model_id: str) -> None:
        with self._lock:
            idx = self._indexes.pop(model_id, None)
            if idx is not None:
                self._drop(idx)
            self._dropped.pop(model_id, None)

    def find(self, conn, model_id: str, digests: Sequence[bytes], version: int | None = None
             ) -> tuple[dict[int, Found], Probe]:
        """The learned records of ``model_id`` among ``digests``, by position in ``digests``; and the probe that
        ``insert`` and ``committed`` take to add these records as a new batch.  ``version``: the model's version,
        read earlier in the same transaction under the model's lock; when the index is complete for it, the
        catch-up query is skipped (every write of a model bumps its version)."""
        idx = self._index(model_id)
        packed = packed_digests(digests)
        lookups = lookups_of(packed)
        with idx.lock:
            if version is None or idx.version != version:
                from_zero = idx.last_batch == 0
                for batch_id, held in conn.execute(_CATCH_UP, {"mid": model_id, "after": idx.last_batch}):
                    idx.add(int(batch_id), lookups_of(bytes(held)))
                idx.version = version
                if from_zero and idx.size:
                    self._built(model_id, idx)
            probe = Probe(idx, idx.last_batch, version, model_id, packed, lookups)
            candidates = idx.candidates(lookups) if idx.size else []
        if not candidates:
            return {}, probe
        rows = {int(r[0]): r for r in self._rows(conn, {p >> SLOT_BITS for _, p in candidates})}
        found: dict[int, Found] = {}
        for q, p in candidates:
            row, slot = rows[p >> SLOT_BITS], p & (MAX_BATCH - 1)
            if bytes(row.commitments[slot * DIGEST:(slot + 1) * DIGEST]) == digests[q]:
                macs = row.example_macs
                mac = None if macs is None else bytes(macs[slot * DIGEST:(slot + 1) * DIGEST])
                step = (row.first_step + slot if row.steps is None
                        else int(np.frombuffer(row.steps, "<i8", 1, slot * 8)[0]))
                found[q] = Found(int(row.id), slot, int(step), None if mac is None or not any(mac) else mac,
                                 row.learned_at)
        return found, probe

    def _rows(self, conn, batch_ids):
        """Batch rows by id: one array parameter on PostgreSQL (psycopg re-parses long SQL text on every call),
        at most 500 placeholders per query on SQLite."""
        wanted = sorted(batch_ids)
        if self.is_postgresql:
            yield from conn.execute(_ROWS_ANY, {"ids": wanted})
            return
        for i in range(0, len(wanted), 500):
            yield from conn.execute(_ROWS, {"ids": wanted[i:i + 500]})

    @staticmethod
    def insert(conn, probe: Probe, tenant_id: str, steps, macs: Sequence[bytes] | None, now) -> int:
        """Write the probed records as one batch row (the caller found none of them, under the model's lock)."""
        n = len(probe.lookups)
        if n > MAX_BATCH:
            raise ValueError(f"at most {MAX_BATCH} records per batch")
        steps = np.asarray(steps, dtype=np.int64)
        consecutive = bool(np.all(steps == np.arange(steps[0], steps[0] + n)))
        result = conn.execute(_INSERT, {
            "tenant_id": tenant_id, "model_id": probe.model_id, "n": n, "commitments": probe.packed,
            "first_step": int(steps[0]), "steps": None if consecutive else steps.astype("<i8").tobytes(),
            "example_macs": None if macs is None else b"".join(macs), "learned_at": now})
        return int(result.inserted_primary_key[0])

    @staticmethod
    def committed(probe: Probe, batch_id: int | None, version: int) -> None:
        """After the commit of the probed model's ``version`` (which added ``batch_id``, or no batch): bring the
        index to it if nothing came between (else the next catch-up does)."""
        idx = probe.index
        with idx.lock:
            if idx.last_batch == probe.seen and idx.version == probe.version and probe.version is not None:
                if batch_id is not None:
                    idx.add(batch_id, probe.lookups)
                idx.version = version

    def erase_macs(self, conn, found: Sequence[Found]) -> None:
        """Zero the example MACs of forgotten records in their batch rows."""
        slots: dict[int, list[int]] = {}
        for f in found:
            if f.example_mac is not None:
                slots.setdefault(f.batch_id, []).append(f.slot)
        if not slots:
            return
        for r in self._rows(conn, slots):
            macs = bytearray(r.example_macs)
            for slot in slots[int(r.id)]:
                macs[slot * DIGEST:(slot + 1) * DIGEST] = bytes(DIGEST)
            conn.execute(_SET_MACS, {"bid": int(r.id), "macs": bytes(macs)})
