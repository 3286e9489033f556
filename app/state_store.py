"""What a write stores of a model's secret state, and how a version is read back (issue 36 item 1).

A model's state is a sealed base plus a log of sealed per-version deltas (app/db/state_log.py).  Why a log and not
sealed pages alone: one learned example changes every entry of exact_ridge's sums (A += q q^T is dense), so no page
diff of its arrays is small; what is small is the batch itself, from which the engine re-adds the sums exactly.  So
a family whose learn replays exactly (``Unlearner.learn_replays_exactly``) logs a learn as its batch, and the other
families with a large state (memory_pair at d = 10^5: 16 MiB) log the pages of the packed state a learn changed.

* **What a write stores** (``plan``): a learn of a model whose packed state is at least ``DELTA_MIN`` bytes logs a
  delta when it is at most half the state and the log stays within ``FOLD`` of the state's size and ``MAX_DELTAS``
  versions; anything else -- a small state, a forget, a retrain, the learn that would pass those bounds
  (compaction, amortised: the log grows to half the state before one full write) -- writes a new base and deletes the
  log in the same transaction.  States under ``DELTA_MIN`` are written whole as before.
* **Reading version v** (``rebuild``): the base, then the deltas in order: patches applied to the packed bytes, and
  runs of consecutive learn deltas re-learned as one batch (exact by the contract: learning batches one after another
  equals learning them concatenated, bit for bit).  The result is the state the writer had, bit for bit; the engine
  cache (app/registry.py) serves it without a rebuild in the process that wrote it.
* **A base's length** (``padded_size``): a base that page patches never address (a family that logs its learns as
  batches) is padded with zeros to the previous base's length while it fits in it, the blob's ciphertext keeps its
  length, and SQLite then overwrites the row's pages in place: no page chain is freed, zeroed (secure_delete) and
  allocated again.  exact_ridge's forget at D = 1 025, whose narrow words (narrow_words.py) vary in length with
  the exceptions, wrote 2.7 MB in 18 ms where the same bytes at a steady length took 8 ms (SQLite, WAL, FULL).
  The packed state's reader ignores bytes after its arrays.
* **Erasure**: every forget writes a base (the log, with any example a learn delta held, is deleted in the forget's
  transaction), and the service then scrubs the SQLite WAL for a model that may have logged examples (``logs_examples``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .db import state_log
from .db.state_codec import apply_page_patch, pack_state, page_digests, page_patch, unpack_state
from .unlearning import ModelSpec, Unlearner, engine_class

DELTA_MIN = 64 << 10  # packed states below this are written whole at every version
PAD_SLACK = 1 / 16    # a large base is stored at the previous base's length while it fills this much of it ...
PAD_UNIT = 4096       # ... else at its own plus half the slack, in these units
FOLD = 0.5            # a delta is logged while the log's plaintext stays within this fraction of the state's size
MAX_DELTAS = 1024     # ... and the log within this many versions


@dataclass(frozen=True)
class LogInfo:
    """A model's stored state at one version: the base's version, the bytes stored (sealed base, deltas and their
    keys), the packed state's size, the log's length and plaintext bytes, and the page digests of the packed state
    (families that log patches)."""
    base_version: int
    stored: int
    plain: int
    count: int = 0
    log_bytes: int = 0
    digests: bytes | None = None
    base_bytes: int = 0


@dataclass(frozen=True)
class StateWrite:
    """What one write stores: ``kind`` "base" (``payload`` the sealed state) or a delta kind (``payload`` its
    plaintext, sealed by state_log.append); ``info`` the stored state after it."""
    kind: str
    payload: bytes
    info: LogInfo


def _patching(engine: Unlearner, plain: int) -> bool:
    return not engine.learn_replays_exactly and plain >= DELTA_MIN


def open_base(cipher, model_id: str, blob: bytes) -> bytes:
    return blob if cipher is None else cipher.open(blob, "state", model_id)


def rebuild(spec: ModelSpec, model_id: str, stored: state_log.Stored, cipher) -> tuple[Unlearner, LogInfo]:
    """The engine at the stored state's last version, and that state's ``LogInfo``."""
    cls = engine_class(spec.algorithm)
    blob = open_base(cipher, model_id, stored.base)
    base_plain = len(blob)
    engine: Unlearner | None = None
    deltas = stored.deltas
    i = 0
    while i < len(deltas):
        kind = deltas[i][1]
        j = i
        while j < len(deltas) and deltas[j][1] == kind:
            j += 1
        if kind == "patch":
            if engine is not None:
                blob, engine = pack_state(engine.stored_state()), None
            for _, _, patch in deltas[i:j]:
                blob = apply_page_patch(blob, patch)
        elif kind == "learn":
            if engine is None:
                engine = cls.from_state(spec, unpack_state(blob))
            batches = [unpack_state(plain) for _, _, plain in deltas[i:j]]
            engine.learn(np.concatenate([b["X"] for b in batches]), np.concatenate([b["y"] for b in batches]))
        else:
            raise ValueError(f"unknown state delta kind {kind!r}")
        i = j
    if engine is None:
        engine = cls.from_state(spec, unpack_state(blob))
        plain = len(blob)
        digests = page_digests(blob) if _patching(engine, plain) else None
    else:
        plain, digests = base_plain, None
    info = LogInfo(base_version=stored.base_version, stored=len(stored.base) + stored.delta_bytes, plain=plain,
                   count=len(deltas), log_bytes=sum(len(p) for _, _, p in deltas), digests=digests,
                   base_bytes=len(stored.base))
    return engine, info


def padded_size(n: int, previous: int | None) -> int:
    """The length a base of ``n`` packed bytes is stored at: the previous base's (``previous``) while ``n`` fits it
    and fills at least 1 - ``PAD_SLACK`` of it, else ``n`` plus half that slack, in whole ``PAD_UNIT``s."""
    if previous is not None and previous * (1 - PAD_SLACK) <= n <= previous:
        return previous
    return -(-int(n * (1 + PAD_SLACK / 2)) // PAD_UNIT) * PAD_UNIT


def base_write(engine: Unlearner, model_id: str, version: int, cipher, blob: bytes | None = None,
               digests: bytes | None = None, previous: int | None = None) -> StateWrite:
    blob = pack_state(engine.stored_state()) if blob is None else blob
    if digests is None and _patching(engine, len(blob)):
        digests = page_digests(blob)
    if digests is None and len(blob) >= DELTA_MIN:  # a large base that page patches never address: padded
        blob += bytes(padded_size(len(blob), previous) - len(blob))
    sealed = blob if cipher is None else cipher.seal_large(blob, "state", model_id)
    return StateWrite("base", sealed, LogInfo(base_version=version, stored=len(sealed), plain=len(blob),
                                              digests=digests, base_bytes=len(sealed)))


def _fits(info: LogInfo, n: int) -> bool:
    return 2 * n <= info.plain and info.count < MAX_DELTAS and info.log_bytes + n <= FOLD * info.plain


def plan(engine: Unlearner, model_id: str, version: int, info: LogInfo | None, cipher,
         learned: tuple[Any, Any] | None = None) -> StateWrite:
    """What to store for ``engine`` at ``version``: a delta for a learn (``learned`` its batch) where one is small
    and the log has room (module docstring), else a new base.  ``info``: the stored state the engine was read at."""
    previous = None if info is None else info.plain
    if learned is None or info is None or info.plain < DELTA_MIN:
        return base_write(engine, model_id, version, cipher, previous=previous)
    if engine.learn_replays_exactly:
        X, y = learned
        plain = pack_state({"X": np.asarray(X, dtype=np.float64), "y": np.asarray(y, dtype=np.float64)})
        if not _fits(info, len(plain)):
            return base_write(engine, model_id, version, cipher, previous=previous)
        return StateWrite("learn", plain, _logged(info, plain, cipher, info.digests))
    blob = pack_state(engine.stored_state())
    patch, digests = page_patch(blob, info.digests)
    if patch is None or not _fits(info, len(patch)):
        return base_write(engine, model_id, version, cipher, blob, digests)
    return StateWrite("patch", patch, _logged(info, patch, cipher, digests, len(blob)))


def _logged(info: LogInfo, delta: bytes, cipher, digests: bytes | None, plain: int | None = None) -> LogInfo:
    """The stored state after logging ``delta``."""
    return LogInfo(base_version=info.base_version, stored=info.stored + state_log.stored_size(len(delta), cipher),
                   plain=info.plain if plain is None else plain, count=info.count + 1,
                   log_bytes=info.log_bytes + len(delta), digests=digests, base_bytes=info.base_bytes)


def logs_examples(engine: Unlearner, info: LogInfo | None) -> bool:
    """Whether the model's writes may have logged learned examples (learn deltas): its forget must then scrub the
    SQLite WAL even when it erased no retained example (a delta folded by an earlier learn may have a WAL frame)."""
    return bool(engine.learn_replays_exactly) and info is not None and info.plain >= DELTA_MIN
