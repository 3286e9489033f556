"""What the model use cases share (app/services/lifecycle.py, learning.py, forgetting.py, prediction.py,
audit.py): the SQL they read and write models with, the problems they answer, and ``UseCase``, the base of each
service, over one ``ModelCore`` (database, engine registry, receipt issuer, and the per-process state every use
case must see alike: the model gates, the record index, the opened record keys, the published-parameter cache).

A learn / unlearn / retrain reads the model in a short read transaction, computes on a private engine copy
(cached copy if its version matches) with no transaction open and under a deadline, then writes state + records +
ledger + receipts in a short transaction that first checks, under the model's lock, that the model's version has
not moved (app/services/concurrency.py; ARCHITECTURE.md §4); commit, answer.
Nothing here branches on algorithm names: the engine supplies behaviour, constants and accounting.
"""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from sqlalchemy import BigInteger, any_, bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY

from ..db.session import Database
from ..db.record_batches import Found, RecordBook, index_budget
from ..db import state_log
from ..db.tables import Model, Record, Tenant
from ..errors import Problem
from ..features import FeatureError, dense_rows
from ..feature_map import encode as map_encode
from ..ids import id_pattern
from ..registry import (ModelRegistry, published_bytes, spec_from_json)
from ..unlearning.contract.errors import NumericError
from ..unlearning import (SpecError, Unlearner, engine_class)
from ..db.retained import ShortReadRetained, SqlRetained
from .concurrency import ATTEMPTS, ModelGates, Moved, conflict_problem
from .ledger import ledger_summary
from .quotas import Quotas, bump, model_bytes, record_bytes
from .receipts import ReceiptIssuer
from .records import commitment_digests, open_record_key

IN_CHUNK = 500  # bound on bound parameters per IN (...) query
BESIDE_STATE_BYTES = 256 << 10  # a packed state from 256 KiB: its solve runs beside its packing (``UseCase._prepare``)
_PUBLISHER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="olu-publish")


def class_indices(spec, y: Any) -> Any:
    """Labels as the engine takes them: a softmax model's declared class names become their indices (0..K-1).
    A name the model did not declare is refused (422 invalid-label, nothing changed); a model without class names
    takes numbers only (422 invalid-label too: the schema takes a class name for any model, since which labels a
    model takes is the model's own rule); numeric labels pass through unchanged (the engine checks them)."""
    if isinstance(y, np.ndarray) or not any(isinstance(v, str) for v in y):
        return y
    names = {c: k for k, c in enumerate(spec.classes or ())}
    out = []
    for i, v in enumerate(y):
        if isinstance(v, str):
            k = names.get(v)
            if k is None and not spec.classes:  # a model without class names takes numbers only
                raise Problem(422, "invalid-label", f"example {i}: y must be a number (this model declared no "
                              "class names)", index=i, errors=[{"loc": ["body", "examples", i, "y"],
                                                               "msg": "Input should be a valid number",
                                                               "type": "float_type"}])
            if k is None:
                raise Problem(422, "invalid-label", f"example {i}: unknown class name {v!r}; declared: "
                              f"{', '.join(spec.classes)}", index=i)
            v = float(k)
        out.append(v)
    return out


_MODEL_CURSOR = re.compile(id_pattern("mdl"))  # a models page's next_cursor is the last model id
ERASED = "erased"  # records.status of a record erased with its model (see ModelService._erase)
_KEEP = object()


@contextmanager
def numeric_guard():
    """Runtime guard behind the creation-time calibration check: a computation that leaves the finite float range
    (NumericError from the publish guard, or Python's own OverflowError / ZeroDivisionError) becomes a 422 problem;
    raised inside the write transaction, it rolls everything back and the engine is not checked in."""
    try:
        yield
    except (NumericError, ArithmeticError) as e:
        raise Problem(422, "non-finite-result",
                      f"This request would make the model compute a number outside the finite range ({e}); "
                      "nothing was changed.") from None


def spec_problem(e: SpecError) -> Problem:
    """422 invalid-model-spec naming the field to change (API path and JSON pointer) and what it would accept with
    every other field as given, where that was found: a numeric range (registry.locate), the values of a field of
    few values that were each tried (spec_hints.with_choices), or the accepted hyperparameter names and the closest
    to a misspelt one (the family's knob table)."""
    field = getattr(e, "field", None) or (e.fields[0] if e.fields else None)
    accepted = getattr(e, "accepted", None)
    values = getattr(e, "accepted_values", None)
    detail = str(e)
    if field is None:
        return Problem(422, "invalid-model-spec", detail)
    item: dict[str, Any] = {"field": field, "pointer": "/" + field.replace(".", "/"), "loc": ["body", *field.split(".")]}
    names = getattr(e, "accepted_names", None)
    if names is not None:  # an unknown hyperparameter: the detail lists them and the closest
        item["accepted"] = names
        if getattr(e, "closest", None):
            item["closest"] = e.closest  # type: ignore[attr-defined]
    elif accepted is not None:
        item["minimum"], item["maximum"] = accepted
        detail += f". {field} is accepted in [{accepted[0]:.6g}, {accepted[1]:.6g}] with the other fields as given"
    elif values:
        item["accepted"] = values
        shown = " or ".join(json.dumps(v) for v in values)
        detail += f". With the other fields as given, {field} is accepted as {shown}"
    elif getattr(e, "tried", False):
        detail += (f". No value of {field} alone makes this specification valid (each was tried); change the fields "
                   "it is combined with")
    else:
        detail += f". Change {field} or the fields it is combined with"
    item["msg"] = detail
    return Problem(422, "invalid-model-spec", detail, errors=[item])


# refusals about the rows' shape (the hashed spec's) and a feature map's checks of the raw rows (app/feature_map.py)
SHAPE_CODES = ("features-required", "features-not-declared", "invalid-dimension", "out-of-bounds-input",
               "batch-too-large")


def feature_problem(e: FeatureError, examples: bool) -> Problem:
    """422 naming the example (``index``) and the field of a refused feature dictionary; never echoes a value.
    ``examples``: the body holds ``examples: [{x | features}]`` (learn, unlearn), else ``{x: [..]}`` or
    ``{features: [..]}`` (predict)."""
    i = [] if e.index is None else [e.index]
    if e.code in SHAPE_CODES:  # e.field is the shape sent: "x" or "features"
        where = ["body", "examples", *i, e.field] if examples else ["body", e.field, *i]
    else:
        where = ["body", "examples", *i, "features"] if examples else ["body", "features", *i]
        if e.field is not None:
            where.append(e.field)
    return Problem(413 if e.code == "batch-too-large" else 422, e.code, str(e), index=e.index, field=e.field,
                   errors=[{"loc": where, "msg": str(e), "type": e.code}])


def _chunks(seq: Sequence, n: int = IN_CHUNK) -> Iterable[Sequence]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


@dataclass
class _Rec:
    """A record being forgotten: where it was learned and, once forgotten, its receipt."""
    commitment: str
    lookup: int
    step: int
    example_mac: str | None
    learned_at: Any
    found: Found


_RECORDS = Record.__table__
# statements of the hot paths, built once (building one costs about as much as running it on SQLite)
_FORGOTTEN_COLUMNS = (_RECORDS.c.model_id, _RECORDS.c.commitment, _RECORDS.c.receipt_id)
_SELECT_FORGOTTEN = select(*_FORGOTTEN_COLUMNS).where(_RECORDS.c.lookup.in_(bindparam("keys", expanding=True)))
# PostgreSQL: one array parameter (see _forgotten)
_SELECT_FORGOTTEN_ANY = select(*_FORGOTTEN_COLUMNS).where(
    _RECORDS.c.lookup == any_(bindparam("keys", type_=PG_ARRAY(BigInteger))))
_INSERT_FORGOTTEN = insert(_RECORDS)
_RECORD_KEY = select(Tenant.__table__.c.record_key).where(Tenant.__table__.c.id == bindparam("tid"))


def _forgotten(s, model_id: str, commits: Sequence[str], lookups: Sequence[int]) -> dict[str, str | None]:
    """The forgotten records of ``model_id`` among ``commits`` (with their ``lookups``): commitment -> receipt id.
    The lookup index finds the candidates, the full commitment and the model decide (distinct commitments may
    share their first 8 bytes; the same record id in the tenant's other models has the same commitment).  The
    model is checked here, not in SQL: given ``model_id = ?`` SQLite's planner prefers (model_id, step) and scans
    the whole model.  PostgreSQL gets one array parameter: psycopg re-parses SQL text longer than its cache limit
    on every call (13 ms for a 500-placeholder statement), so the statement must not grow with the batch."""
    wanted = set(commits)
    found: dict[str, str | None] = {}
    conn = s.connection()
    if s.bind.dialect.name == "postgresql":
        queries = [(_SELECT_FORGOTTEN_ANY, lookups)]
    else:
        queries = [(_SELECT_FORGOTTEN, part) for part in _chunks(lookups)]
    for query, part in queries:
        for mid, c, receipt_id in conn.execute(query, {"keys": sorted(set(part))}):
            if mid == model_id and c in wanted:
                found[c] = receipt_id
    return found


_ERASED_COLUMNS = ("tenant_id", "model_id", "commitment", "lookup", "step", "status", "learned_at", "forgotten_at",
                   "receipt_id")


def _insert_erased(conn, rows: Sequence[tuple]) -> None:
    """Insert ``records`` rows (``_ERASED_COLUMNS``) with the driver's executemany: a deleted model may have held
    millions of records, and the statement layer's per-row parameter processing cost 10x the insert (100 000
    rows: 1.2 s of 2.5 s on SQLite).  The two datetime columns take few distinct values (one per learn batch,
    one erasure time): each is converted once with the column type's own bind processor."""
    if not rows:
        return
    dialect = conn.dialect
    to_db = _RECORDS.c.learned_at.type.dialect_impl(dialect).bind_processor(dialect) or (lambda v: v)
    seen: dict[Any, Any] = {}

    def when(v):
        out = seen.get(v)
        if out is None:
            out = seen[v] = to_db(v)
        return out

    mark = "?" if dialect.paramstyle == "qmark" else "%s"
    sql = (f"INSERT INTO {_RECORDS.name} ({', '.join(_ERASED_COLUMNS)}) "
           f"VALUES ({', '.join([mark] * len(_ERASED_COLUMNS))})")
    for i in range(0, len(rows), 10_000):
        conn.exec_driver_sql(sql, [r[:6] + (when(r[6]), when(r[7]), r[8]) for r in rows[i:i + 10_000]])


_MODELS = Model.__table__
# a predict reads the version alone while its published parameters are cached (213 kB at D = 1 025 x 26 classes)
_PREDICT_VERSION = select(_MODELS.c.version).where(
    _MODELS.c.id == bindparam("mid"), _MODELS.c.tenant_id == bindparam("tid"), _MODELS.c.status != "deleted")
_PREDICT_COLUMNS = select(_MODELS.c.version, _MODELS.c.spec_json, _MODELS.c.published, _MODELS.c.ledger_json).where(
    _MODELS.c.id == bindparam("mid"), _MODELS.c.tenant_id == bindparam("tid"), _MODELS.c.status != "deleted")
# what the write paths read of the model row (the columns they only write, and the view's, are not fetched)
_WRITE_PATH_COLUMNS = ("id", "tenant_id", "algorithm", "spec_json", "status", "step", "n_records", "n_forgotten",
                       "version", "epoch", "rho_spent", "ledger_json", "bytes_stored", "n_dropped", "dropped_through")
_SELECT_MODEL = select(*(_MODELS.c[c] for c in _WRITE_PATH_COLUMNS)).where(
    _MODELS.c.id == bindparam("mid"), _MODELS.c.tenant_id == bindparam("tid"), _MODELS.c.status != "deleted")
_SELECT_VERSION = select(_MODELS.c.version, _MODELS.c.status).where(_MODELS.c.id == bindparam("mid"))
_SELECT_VERSION_FOR_UPDATE = _SELECT_VERSION.with_for_update()


_UPDATES: dict[tuple[str, ...], Any] = {}


class _ModelRow:
    """A model row read with one Core query for a write path (``_WRITE_PATH_COLUMNS``; any column may be assigned);
    assignments are remembered and written back by ``flush`` with one UPDATE (the ORM's identity map and unit of
    work cost more than the write).  ``flush`` also adds the change of the model's records held and bytes stored
    since the row was read (or last flushed) to the tenant's usage counters, in the same transaction
    (app/services/quotas.py ``bump``)."""

    def __init__(self, mapping):
        object.__setattr__(self, "_values", dict(mapping))
        object.__setattr__(self, "_dirty", set())
        object.__setattr__(self, "_usage", self._held())

    def _held(self) -> tuple[int, int]:
        v = self._values  # records held: learned, neither forgotten nor dropped by a restart (dropped.py)
        return int(v["n_records"]) - int(v["n_forgotten"]) - int(v["n_dropped"] or 0), int(v["bytes_stored"] or 0)

    def __getattr__(self, name: str):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        if name not in _MODELS.c:
            raise AttributeError(name)
        self._values[name] = value
        self._dirty.add(name)

    def flush(self, s) -> None:
        if self._dirty:
            columns = tuple(sorted(self._dirty))
            stmt = _UPDATES.get(columns)
            if stmt is None:  # one prebuilt statement per set of columns (a handful: learn, unlearn, retrain)
                stmt = _UPDATES[columns] = update(_MODELS).where(_MODELS.c.id == bindparam("row_id")).values(
                    {k: bindparam(k) for k in columns})
            s.connection().execute(stmt, {"row_id": self._values["id"], **{k: self._values[k] for k in columns}})
            self._dirty.clear()
            held = self._held()
            bump(s, self._values["tenant_id"], self._values["id"], records=held[0] - self._usage[0], stored=held[1] - self._usage[1])
            object.__setattr__(self, "_usage", held)



@dataclass(frozen=True)
class Prepared:
    """A computed engine's published bytes and state write (``UseCase._prepare``)."""
    published: bytes
    write: Any


class ModelCore:
    """The state the model use cases share in one process (each service holds the same core)."""

    def __init__(self, db: Database, registry: ModelRegistry, issuer: ReceiptIssuer, settings, metrics=None):
        self.db, self.registry, self.issuer, self.settings = db, registry, issuer, settings
        # (model id, version) -> (dim, published theta, loss, inference-gate message): public data only
        self._published: dict[tuple[str, int], tuple] = {}
        self.metrics = metrics
        # per model, the in-memory index of its learned records' commitments (app/db/record_batches.py)
        self.records = RecordBook(index_budget(settings.record_index_max_entries), is_postgresql=not db.is_sqlite)
        if metrics is not None:
            metrics.watch_records(self.records)
        self._record_keys: dict[str, bytes] = {}  # tenant id -> opened record key (secret; never served)
        # per-model gates and the compute deadline of learn / unlearn / retrain (app/services/concurrency.py)
        self.gates = ModelGates(getattr(settings, "request_deadline_seconds", 10.0))
        self.quotas = Quotas(db, settings)  # per-tenant quotas of models, records held and bytes stored
        self._wrapped_key_bytes: int | None = None
        # ``commitment_digests`` for a request's ids; the app hands many ids to its decode pool's processes instead
        # (app/api/decode_pool.py DecodePool.commitments), so that ~1 us of Python per id does not hold this
        # process's GIL in turns with the event loop (issue 37, fairness)
        self.commitments: Callable[[bytes, list[str]], list[bytes]] = commitment_digests

    def record_bytes(self, engine: Unlearner) -> int:
        """The bytes one record held by ``engine``'s model occupies (app/services/quotas.py)."""
        if self._wrapped_key_bytes is None:
            from ..db.retained import KEY, PURPOSE
            cipher = self.registry.cipher
            self._wrapped_key_bytes = KEY if cipher is None else len(cipher.seal(bytes(KEY), PURPOSE, "size:0"))
        return record_bytes(engine, engine.spec.dim, self._wrapped_key_bytes)


class UseCase:
    """The base of each model service: the shared core's objects as attributes, and the helpers the use cases
    share (reading and confirming a model row, checking out and storing its engine, the optimistic write)."""

    def __init__(self, core: ModelCore):
        self.core = core
        self.db, self.registry, self.issuer, self.settings = core.db, core.registry, core.issuer, core.settings
        self.metrics, self.records, self.gates, self.quotas = core.metrics, core.records, core.gates, core.quotas
        self._published, self._record_keys = core._published, core._record_keys

    def _row(self, s, tenant_id: str, model_id: str, *, lock: bool = False, include_deleted: bool = False) -> Model:
        q = select(Model).where(Model.id == model_id, Model.tenant_id == tenant_id)
        if not include_deleted:
            q = q.where(Model.status != "deleted")
        if lock and not self.db.is_sqlite:  # SQLite: BEGIN IMMEDIATE already holds the write lock
            q = q.with_for_update()
        row = s.scalars(q).first()
        if row is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        return row

    def _model_row(self, s, tenant_id: str, model_id: str) -> _ModelRow:
        """The model row a learn / unlearn / retrain computes from, read without a lock (``_confirm`` checks it)."""
        found = s.connection().execute(_SELECT_MODEL, {"mid": model_id, "tid": tenant_id}).mappings().first()
        if found is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        return _ModelRow(found)

    def _confirm(self, s, row: _ModelRow) -> None:
        """In the write transaction, under the model's lock (BEGIN IMMEDIATE on SQLite, FOR UPDATE on PostgreSQL):
        the model is still at the version and status ``row`` was read at, so everything checked and computed
        against that snapshot holds (every change of a model's state, records or retained data moves its
        version); else ``Moved`` (the transaction rolls back and the request computes again)."""
        q = _SELECT_VERSION if self.db.is_sqlite else _SELECT_VERSION_FOR_UPDATE
        found = s.connection().execute(q, {"mid": row.id}).first()
        if found is None or found[0] != row.version or found[1] != row.status:
            raise Moved()

    def _reader(self, work, row: _ModelRow, engine: Unlearner) -> ShortReadRetained:
        """The model's retained examples for a computation made outside any transaction."""
        return ShortReadRetained(self.db, row.id, engine.spec.dim, self.registry.cipher, check=work.check,
                                 groups=engine.retained_groups)

    def _retained(self, s, row: _ModelRow, engine: Unlearner) -> SqlRetained:
        """The model's retained examples in the write transaction ``s``."""
        return SqlRetained(s, row.id, engine.spec.dim, self.registry.cipher, groups=engine.retained_groups)

    def view(self, row: Model) -> dict[str, Any]:
        spec = json.loads(row.spec_json)
        ledger = json.loads(row.ledger_json)
        # a family private with respect to each record's presence withholds its counts (the engine contract says)
        counts = engine_class(row.algorithm).publishes_counts(spec_from_json(row.spec_json))
        return {
            "id": row.id, "name": row.name, "algorithm": row.algorithm, "loss": spec["loss"],
            "dim": (spec.get("feature_map") or {}).get("input_dim", spec["dim"]), "feature_map": spec.get("feature_map"),
            "bounds": {"x_norm": spec["x_norm"], "y_abs": spec["y_abs"]},
            "domain_radius": spec["domain_radius"], "l2": spec["l2"],
            "privacy": {"epsilon": spec["epsilon"], "delta": spec["delta"]},
            "hyperparameters": spec["hyperparameters"], "features": spec.get("features"),
            "created_at": row.created_at,
            "status": row.status, **({"step": row.step, "n_records": row.n_records, "n_forgotten": row.n_forgotten}
                                     if counts else {"step": None, "n_records": None, "n_forgotten": None}),
            "version": row.version, "epoch": row.epoch, "constants": json.loads(row.constants_json),
            "ledger_summary": ledger_summary(ledger, spec),
            "guarantee": json.loads(row.guarantee_json),
            "n_classes": spec.get("n_classes"), "classes": spec.get("classes"),
        }

    def _hold(self, model_id: str, what: str):
        """The model's gate and the computation's ``Work`` (its deadline): a request's (app/services/concurrency.py);
        an operation holds it with its own wait and work (app/services/operation_steps.py)."""
        return self.gates.hold(model_id, what)

    def _optimistic(self, model_id: str, what: str, attempt) -> Any:
        """``attempt(work)`` (read, compute, write; it raises ``Moved`` when the model moved on before its write)
        under the model's gate, at most ``ATTEMPTS`` times (app/services/concurrency.py)."""
        with self._hold(model_id, what) as work:
            for _ in range(ATTEMPTS):
                try:
                    return attempt(work)
                except Moved:
                    if self.metrics:
                        self.metrics.refusals.labels("write-retry").inc()
        raise conflict_problem(model_id)

    @staticmethod
    def _encode(spec, X: Any, F: list | None, *, examples: bool = True) -> Any:
        """Dense rows of a request for the model's spec: feature dictionaries hashed (app/features.py), the same
        function at learning, forgetting and prediction, then a public feature map's phi (app/feature_map.py); a
        request of the wrong shape is a 422 (``examples``: the request lists examples, as learn and unlearn do,
        rather than predict's inputs, whose phi is neither summed nor checked: its last block unpadded)."""
        try:
            return map_encode(spec.feature_map, dense_rows(spec.features, spec.x_norm, X, F), fixed=examples)
        except FeatureError as e:
            raise feature_problem(e, examples=examples) from None

    def _check_batch(self, n: int) -> None:
        if n > self.settings.max_batch:
            raise Problem(413, "batch-too-large", f"At most {self.settings.max_batch} items per request.")

    def record_key(self, tenant_id: str) -> bytes:
        """The tenant's record key (``_record_key``) outside a request's transaction: for the decode pool, which
        computes a large body's commitments where it decodes the body (app/api/decode_pool.py)."""
        key = self._record_keys.get(tenant_id)
        if key is None:
            with self.db.read() as s:
                key = self._record_key(s, tenant_id)
        return key

    def _record_key(self, s, tenant_id: str) -> bytes:
        """The tenant's HMAC key for record commitments, kept per process once opened (it never changes; a
        re-seal under a new encryption key seals the same key)."""
        key = self._record_keys.get(tenant_id)
        if key is None:
            stored = s.connection().execute(_RECORD_KEY, {"tid": tenant_id}).scalar_one()
            key = open_record_key(self.registry.cipher, tenant_id, stored)
            if len(self._record_keys) >= 10_000:
                self._record_keys.clear()
            self._record_keys[tenant_id] = key
        return key

    def _commitments(self, key: bytes, ids: list[str]) -> list[bytes]:
        """The commitments of ``ids`` under the tenant's record ``key`` (an operation, which stores commitments and
        never the ids, answers them itself: app/services/operation_steps.py)."""
        return self.core.commitments(key, ids)

    def _checkout(self, s, row: _ModelRow) -> Unlearner:
        return self.registry.checkout(row.id, row.version, row.spec_json,
                                      lambda: state_log.load(s, self.registry.cipher, row.id))

    def _prepare(self, row: _ModelRow, engine: Unlearner, learned: tuple | None = None) -> "Prepared":
        """What ``_store`` writes of a computed engine, made before the write transaction so that the model's lock
        (SQLite's write lock: every tenant's writes wait for it) is not held while the published parameters are
        solved (exact_ridge: a p x p system) nor while the state is packed, diffed and sealed: the published bytes
        and the state write (a base, or a delta when ``learned``, the batch a learn consumed, is one the stored
        state may log: app/state_store.py), for the version after ``row``'s."""
        stored = self.registry.stored_of(engine)
        if engine.publish_beside_state and stored is not None and stored.plain >= BESIDE_STATE_BYTES:
            # a large state: the solve (BLAS, without the GIL) runs beside the packing and sealing of the state
            solving = _PUBLISHER.submit(engine.published)
            try:
                write = self.registry.plan_write(engine, row.id, row.version + 1, learned)
            finally:
                wait([solving])  # the engine is never handed on while the solve still reads it
            with numeric_guard():
                return Prepared(published_bytes(solving.result()), write)
        with numeric_guard():
            published = published_bytes(engine.published())
        return Prepared(published, self.registry.plan_write(engine, row.id, row.version + 1, learned))

    def _store(self, s, row: _ModelRow, engine: Unlearner, now, book: Any = _KEEP, learned: tuple | None = None,
               prepared: "Prepared | None" = None, **fields: Any) -> None:
        """Write the model row and the engine's state at the next version, in the write transaction ``s``
        (``prepared`` by ``_prepare`` outside it, else made here)."""
        if prepared is None:
            prepared = self._prepare(row, engine, learned)
        if book is _KEEP:
            book = json.loads(row.ledger_json).get("book")
        row.version += 1
        row.step = engine.step
        row.status = engine.status
        row.published = prepared.published
        row.published_at = now
        row.updated_at = now
        row.ledger_json = json.dumps({**engine.ledger(), "book": book})
        for k, v in fields.items():
            setattr(row, k, v)
        write = prepared.write
        row.bytes_stored = model_bytes(write.info.stored, row.n_records - row.n_forgotten,
                                       self.core.record_bytes(engine))
        row.flush(s)
        if write.kind == "base":
            before = self.registry.stored_of(engine)
            state_log.rebase(s, row.id, row.version, write.payload, None if before is None else before.count)
        else:
            state_log.append(s, self.registry.cipher, row.id, row.version, write.kind, write.payload)
