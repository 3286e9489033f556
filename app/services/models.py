"""Use cases on models: create, learn, unlearn, predict, and the audit reads.

A learn / unlearn / retrain reads the model in a short read transaction, computes on a private engine copy
(cached copy if its version matches) with no transaction open and under a deadline, then writes state + records +
ledger + receipts in a short transaction that first checks, under the model's lock, that the model's version has
not moved (app/services/concurrency.py; ARCHITECTURE.md §4); commit, answer.
Nothing here branches on algorithm names: the engine supplies behaviour, constants and accounting.
"""
from __future__ import annotations

import hmac
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from sqlalchemy import BigInteger, any_, bindparam, delete, insert, select, update
from sqlalchemy.dialects.postgresql import ARRAY as PG_ARRAY

from ..db.session import Database
from ..db.record_batches import Found, RecordBook, lookups_of
from ..db.tables import LedgerEntry, Model, ModelState, Receipt, Record, RecordBatch, Tenant
from ..errors import Problem
from ..features import FeatureError, FeatureSpecError, dense_rows, normalize_spec
from ..ids import id_pattern, new_id, utcnow
from ..registry import (ModelRegistry, build_spec, request_budget, loss_for, published_array, published_bytes, spec_from_json,
                        spec_to_json)
from ..unlearning.base import NumericError
from ..unlearning.calibration import require_finite_array
from ..unlearning import (ArrayRetained, CapacityExhausted, ForgetError, InputError, NotDeletable, SpecError, Unlearner,
                          validate_examples)
from ..db.retained import ShortReadRetained, SqlRetained
from . import book
from .concurrency import ATTEMPTS, ModelGates, Moved, conflict_problem
from .ledger import ledger_summary, ledger_view
from ..receipts.canonical import erased_records_sha256
from .receipts import ERASURE, ReceiptIssuer, guarantee_of, is_restart
from .tenants import commitment, commitment_digests, example_mac, lookup_key, open_record_key

IN_CHUNK = 500  # bound on bound parameters per IN (...) query


def class_indices(spec, y: Any) -> Any:
    """Labels as the engine takes them: a softmax model's declared class names become their indices (0..K-1).
    A name the model did not declare is refused (422 invalid-label, nothing changed); a model without class names
    takes numbers only (422 validation-error, as the schema answered before names existed); numeric labels pass
    through unchanged (the engine checks them)."""
    if isinstance(y, np.ndarray) or not any(isinstance(v, str) for v in y):
        return y
    names = {c: k for k, c in enumerate(spec.classes or ())}
    out = []
    for i, v in enumerate(y):
        if isinstance(v, str):
            k = names.get(v)
            if k is None and not spec.classes:  # a model without class names takes numbers only, as before
                raise Problem(422, "validation-error", f"example {i}: y must be a number (this model declared no "
                              "class names)", errors=[{"loc": ["body", "examples", i, "y"],
                                                      "msg": "Input should be a valid number", "type": "float_type"}])
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
    """422 invalid-model-spec naming the field to change (API path and JSON pointer) and its accepted range with
    every other field as given (registry.locate), when one exists."""
    field = getattr(e, "field", None)
    accepted = getattr(e, "accepted", None)
    detail = str(e)
    if field is None:
        return Problem(422, "invalid-model-spec", detail)
    item: dict[str, Any] = {"field": field, "pointer": "/" + field.replace(".", "/"), "loc": ["body", *field.split(".")]}
    if accepted is not None:
        item["minimum"], item["maximum"] = accepted
        detail += f". {field} is accepted in [{accepted[0]:.6g}, {accepted[1]:.6g}] with the other fields as given"
    else:
        detail += f". No value of {field} alone makes this specification valid; change {field} or the fields it is combined with"
    item["msg"] = detail
    return Problem(422, "invalid-model-spec", detail, errors=[item])


def feature_problem(e: FeatureError, examples: bool) -> Problem:
    """422 naming the example (``index``) and the field of a refused feature dictionary; never echoes a value.
    ``examples``: the body holds ``examples: [{x | features}]`` (learn, unlearn), else ``{x: [..]}`` or
    ``{features: [..]}`` (predict)."""
    i = [] if e.index is None else [e.index]
    if e.code in ("features-required", "features-not-declared"):  # e.field is the shape sent: "x" or "features"
        where = ["body", "examples", *i, e.field] if examples else ["body", e.field, *i]
    else:
        where = ["body", "examples", *i, "features"] if examples else ["body", "features", *i]
        if e.field is not None:
            where.append(e.field)
    return Problem(422, e.code, str(e), index=e.index, field=e.field,
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
_STORE_STATE = update(ModelState.__table__).where(ModelState.__table__.c.model_id == bindparam("mid")).values(
    version=bindparam("version"), blob=bindparam("blob"))


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
_PREDICT_COLUMNS = select(_MODELS.c.version, _MODELS.c.spec_json, _MODELS.c.published, _MODELS.c.ledger_json).where(
    _MODELS.c.id == bindparam("mid"), _MODELS.c.tenant_id == bindparam("tid"), _MODELS.c.status != "deleted")
# what the write paths read of the model row (the columns they only write, and the view's, are not fetched)
_WRITE_PATH_COLUMNS = ("id", "tenant_id", "algorithm", "spec_json", "status", "step", "n_records", "n_forgotten",
                       "version", "epoch", "rho_spent", "ledger_json")
_SELECT_MODEL = select(*(_MODELS.c[c] for c in _WRITE_PATH_COLUMNS)).where(
    _MODELS.c.id == bindparam("mid"), _MODELS.c.tenant_id == bindparam("tid"), _MODELS.c.status != "deleted")
_SELECT_VERSION = select(_MODELS.c.version, _MODELS.c.status).where(_MODELS.c.id == bindparam("mid"))
_SELECT_VERSION_FOR_UPDATE = _SELECT_VERSION.with_for_update()


_UPDATES: dict[tuple[str, ...], Any] = {}


class _ModelRow:
    """A model row read with one Core query for a write path (``_WRITE_PATH_COLUMNS``; any column may be assigned);
    assignments are remembered and written back by ``flush`` with one UPDATE (the ORM's identity map and unit of
    work cost more than the write)."""

    def __init__(self, mapping):
        object.__setattr__(self, "_values", dict(mapping))
        object.__setattr__(self, "_dirty", set())

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


class ModelService:
    def __init__(self, db: Database, registry: ModelRegistry, issuer: ReceiptIssuer, settings, metrics=None):
        self.db, self.registry, self.issuer, self.settings = db, registry, issuer, settings
        # (model id, version) -> (dim, published theta, loss, inference-gate message): public data only
        self._published: dict[tuple[str, int], tuple] = {}
        self.metrics = metrics
        # per model, the in-memory index of its learned records' commitments (app/db/record_batches.py)
        self.records = RecordBook(settings.record_index_max_entries, is_postgresql=not db.is_sqlite)
        self._record_keys: dict[str, bytes] = {}  # tenant id -> opened record key (secret; never served)
        # per-model gates and the compute deadline of learn / unlearn / retrain (app/services/concurrency.py)
        self.gates = ModelGates(getattr(settings, "request_deadline_seconds", 10.0))

    # ---- reading helpers ------------------------------------------------------------------------------
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

    def _reader(self, work, row: _ModelRow, dim: int) -> ShortReadRetained:
        """The model's retained examples for a computation made outside any transaction."""
        return ShortReadRetained(self.db, row.id, dim, self.registry.cipher, check=work.check)

    def view(self, row: Model) -> dict[str, Any]:
        spec = json.loads(row.spec_json)
        ledger = json.loads(row.ledger_json)
        return {
            "id": row.id, "name": row.name, "algorithm": row.algorithm, "loss": spec["loss"], "dim": spec["dim"],
            "bounds": {"x_norm": spec["x_norm"], "y_abs": spec["y_abs"]},
            "domain_radius": spec["domain_radius"], "l2": spec["l2"],
            "privacy": {"epsilon": spec["epsilon"], "delta": spec["delta"]},
            "hyperparameters": spec["hyperparameters"], "features": spec.get("features"),
            "created_at": row.created_at,
            "status": row.status, "step": row.step, "n_records": row.n_records, "n_forgotten": row.n_forgotten,
            "version": row.version, "epoch": row.epoch, "constants": json.loads(row.constants_json),
            "ledger_summary": ledger_summary(ledger, spec),
            "guarantee": json.loads(row.guarantee_json),
            "n_classes": spec.get("n_classes"), "classes": spec.get("classes"),
        }

    # ---- models ------------------------------------------------------------------------------------------
    def create(self, tenant_id: str, payload: dict[str, Any], guard=None) -> dict[str, Any]:
        if payload.get("features") is not None:
            try:
                payload = {**payload, "features": normalize_spec(payload["features"], payload["dim"])}
            except FeatureSpecError as e:
                field = f"features.{e.field}"
                raise Problem(422, "invalid-model-spec", f"{field}: {e}", errors=[{
                    "field": field, "pointer": "/" + field.replace(".", "/"), "loc": ["body", *field.split(".")],
                    "msg": str(e)}]) from None
        try:
            spec = build_spec(payload, max_dim=self.settings.max_dim, budget=request_budget(self.settings))
        except SpecError as e:
            raise spec_problem(e) from None
        engine = self.registry.new_engine(spec)
        if not all(np.isfinite(v) for v in engine.constants().values() if isinstance(v, (int, float))):
            # e.g. domain_radius near 1e308: D = 2R overflows; such a model could certify nothing (was served as null)
            raise Problem(422, "invalid-model-spec", "The declared bounds give no finite constants.")
        now = utcnow()
        model_id = new_id("mdl")
        charge = engine.creation_charge()  # families private from the start pay their whole budget now
        row = Model(
            id=model_id, tenant_id=tenant_id, name=payload["name"], algorithm=spec.algorithm,
            spec_json=spec_to_json(spec), status=engine.status, step=0, n_records=0, n_forgotten=0, version=1,
            epoch=1, rho_spent=0.0 if charge is None else float(charge["rho"]),
            ledger_json=json.dumps({**engine.ledger(), "book": book.open_book(engine)}),
            constants_json=json.dumps(engine.constants()), guarantee_json=json.dumps(guarantee_of(engine)),
            published=published_bytes(engine.published()),
            published_at=now, created_at=now, updated_at=now,
        )
        with self.db.write() as s:
            # a deleted tenant gets no new model (the share lock orders this against DELETE /v1/tenants/{id})
            q = select(Tenant.deleted_at).where(Tenant.id == tenant_id)
            if s.execute(q if self.db.is_sqlite else q.with_for_update(read=True)).scalar_one_or_none() is not None:
                raise Problem(404, "tenant-not-found", "This tenant is deleted.")
            s.add(row)
            s.flush()
            s.add(ModelState(model_id=model_id, version=1, blob=self.registry.dump(engine, model_id)))
            if charge is not None:
                s.add(LedgerEntry(model_id=model_id, epoch=1, receipt_id=None, kind="creation", step=0,
                                  sigma=float(charge["sigma"]), rho=float(charge["rho"]), created_at=now))
            result = self.view(row)
            if guard is not None:
                guard.complete(s, result)
        self.registry.checkin(model_id, 1, engine)
        if self.metrics:
            self.metrics.models_created.inc()
        return result

    def get(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            return self.view(self._row(s, tenant_id, model_id))

    def list(self, tenant_id: str, cursor: str | None, limit: int) -> dict[str, Any]:
        if cursor is not None and not _MODEL_CURSOR.fullmatch(cursor):
            raise Problem(422, "validation-error", "cursor must be a value returned as next_cursor.")
        q = select(Model).where(Model.tenant_id == tenant_id, Model.status != "deleted")
        if cursor:
            q = q.where(Model.id > cursor)
        with self.db.read() as s:
            rows = list(s.scalars(q.order_by(Model.id).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return {"items": [self.view(r) for r in rows], "next_cursor": rows[-1].id if more else None}

    def delete(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        """Erase the model (``_erase``) under its lock and answer its erasure receipt; a deleted model is 404."""
        with self.db.write() as s:
            row = self._row(s, tenant_id, model_id, lock=True)
            receipt = self._erase(s, row)
        self.registry.evict(model_id)
        self.records.evict(model_id)
        self.db.scrub_wal()  # the model's examples and sealed state leave the SQLite WAL too, before the answer
        return receipt

    def erase_tenant_models(self, s, tenant_id: str) -> list[dict[str, Any]]:
        """``_erase`` every live model of the tenant in the caller's transaction (tenant deletion); their
        erasure receipts, in model id order.  The caller evicts the models after commit (``evict``)."""
        q = select(Model).where(Model.tenant_id == tenant_id, Model.status != "deleted").order_by(Model.id)
        rows = list(s.scalars(q if self.db.is_sqlite else q.with_for_update()))
        return [self._erase(s, row) for row in rows]

    def evict(self, model_ids: Iterable[str]) -> None:
        for mid in model_ids:
            self.registry.evict(mid)
            self.records.evict(mid)
        self.db.scrub_wal()  # after a tenant's erasure commits: its models' examples leave the SQLite WAL too

    def _erase(self, s, row: Model) -> dict[str, Any]:
        """Erase the secret state, the learned-record batches, the retained data and the published parameters,
        and append one signed erasure receipt, all in the caller's transaction.

        The records the model still held (learned, not forgotten) are counted and hashed into the receipt
        (``erased_records_sha256``) and each keeps one ``records`` row (status ``erased``: commitment, step, the
        receipt's id), so ``GET /v1/audit/records/{id}`` can answer "erased with model X under receipt R"; nothing
        about the example itself (features, label, example MAC) is kept.  Records forgotten before keep their
        certificate receipts (their ``records`` rows go, as before).  Receipts, ledger entries and the log stay."""
        model_id, now = row.id, utcnow()
        conn = s.connection()
        forgotten = {bytes.fromhex(c) for c in conn.execute(
            select(_RECORDS.c.commitment).where(_RECORDS.c.model_id == model_id)).scalars()}
        packed, steps, learned = [], [], []
        for n, commits, first, step_bytes, at in conn.execute(
                select(RecordBatch.n, RecordBatch.commitments, RecordBatch.first_step, RecordBatch.steps,
                       RecordBatch.learned_at).where(RecordBatch.model_id == model_id).order_by(RecordBatch.id)):
            commits = bytes(commits)
            batch_steps = (np.arange(first, first + n, dtype=np.int64) if step_bytes is None
                           else np.frombuffer(step_bytes, "<i8").astype(np.int64))
            for i in range(n):
                c = commits[i * 32:(i + 1) * 32]
                if c not in forgotten:
                    packed.append(c)
                    steps.append(int(batch_steps[i]))
                    learned.append(at)
        receipt = self.issuer.issue_erasure(s, row, len(packed), erased_records_sha256(packed), now)
        s.execute(delete(ModelState).where(ModelState.model_id == model_id))
        s.execute(delete(Record).where(Record.model_id == model_id))
        s.execute(delete(RecordBatch).where(RecordBatch.model_id == model_id))
        SqlRetained(s, model_id, 0).erase_all()
        lookups = lookups_of(b"".join(packed)).tolist() if packed else []
        _insert_erased(conn, [(row.tenant_id, model_id, c.hex(), k, t, ERASED, at, now, receipt["id"])
                              for c, k, t, at in zip(packed, lookups, steps, learned)])
        conn.execute(insert(LedgerEntry.__table__), [
            {"model_id": model_id, "epoch": row.epoch, "receipt_id": receipt["id"], "kind": "erasure",
             "step": row.step, "sigma": 0.0, "rho": 0.0, "created_at": now}])
        row.status, row.published, row.deleted_at, row.updated_at = "deleted", None, now, now
        row.version += 1
        s.flush()
        return receipt

    # ---- learn --------------------------------------------------------------------------------------------
    def _optimistic(self, model_id: str, what: str, attempt) -> Any:
        """``attempt(work)`` (read, compute, write; it raises ``Moved`` when the model moved on before its write)
        under the model's gate, at most ``ATTEMPTS`` times (app/services/concurrency.py)."""
        with self.gates.hold(model_id, what) as work:
            for _ in range(ATTEMPTS):
                try:
                    return attempt(work)
                except Moved:
                    if self.metrics:
                        self.metrics.refusals.labels("write-retry").inc()
        raise conflict_problem(model_id)

    def learn(self, tenant_id: str, model_id: str, ids: list[str], X: Any, y: Any, guard=None,
              F: list | None = None) -> dict[str, Any]:
        """Learn ``ids`` with dense rows ``X`` or, per example, feature dictionaries ``F`` (models with a spec)."""
        self._check_batch(len(ids))
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            for rid in ids:
                if rid in seen:
                    raise Problem(422, "duplicate-record", f"Record id {rid!r} appears more than once in this batch.")
                seen.add(rid)
        rows: list = []  # the request's (X, y) once checked against the model's spec (it never changes)

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                spec = spec_from_json(row.spec_json)
                if not rows:
                    rows.append(self._learn_rows(spec, X, y, F))
                Xv, yv = rows[0]
                key = self._record_key(s, tenant_id)
                digests = commitment_digests(key, ids)
                held, probe = self.records.find(s.connection(), model_id, digests, version=row.version)
                if held:
                    raise Problem(409, "duplicate-record", f"Record id {ids[min(held)]!r} was already used in this "
                                  "model.")
                engine = self._checkout(s, row)
            limit = engine.learn_batch_limit()  # the model's work budget per request (issue 21)
            if limit is not None and len(ids) > limit:
                raise Problem(413, "batch-too-large", f"This model learns at most {limit} examples per request (its "
                              "work budget, hyperparameters.max_learn_batch); send them in several requests.")
            left = engine.learn_capacity()
            if left is not None and len(ids) > left:
                raise Problem(409, "horizon-reached", f"The model was created for a horizon of {engine.step + left} "
                              f"examples and has learned {engine.step}: it can learn {left} more.")
            store = self._reader(work, row, spec.dim) if engine.needs_retained_data else None

            def compute():
                with numeric_guard():
                    return engine.learn(Xv, yv, store)  # on any refusal the engine copy is dropped

            steps = work.run(compute, "The learn")
            now = utcnow()
            macs = ([bytes.fromhex(example_mac(key, xi, yi)) for xi, yi in zip(Xv, yv)]
                    if engine.needs_deletion_features and not engine.needs_retained_data else None)
            with self.db.write() as s:
                self._confirm(s, row)  # the state the engine computed from is still the model's
                batch_id = self.records.insert(s.connection(), probe, tenant_id, steps, macs, now)
                if store is not None:
                    SqlRetained(s, model_id, spec.dim, self.registry.cipher).add(steps, Xv, yv)
                self._store(s, row, engine, now, n_records=row.n_records + len(ids))
                result = {"accepted": len(ids), "first_step": int(steps[0]), "last_step": int(steps[-1]),
                          "version": row.version}
                restarts = engine.restart_steps(steps)  # steps whose forget will be an exact restart (public)
                if restarts is not None:
                    result["restart_on_forget"] = {"first_step": restarts[0], "last_step": restarts[1]}
                if guard is not None:
                    guard.complete(s, result)
            self.registry.checkin(model_id, row.version, engine)
            self.records.committed(probe, batch_id, row.version)
            return result

        result = self._optimistic(model_id, "The learn", attempt)
        if self.metrics:
            self.metrics.examples_learned.inc(len(ids))
        return result

    def _learn_rows(self, spec, X: Any, y: Any, F: list | None) -> tuple[Any, Any]:
        """The examples of a learn as the engine takes them, checked against the model's spec (422 otherwise)."""
        if spec.features is not None or F is not None:
            X = self._encode(spec, X, F)
        if isinstance(X, np.ndarray) and X.ndim == 2:  # columnar bodies arrive as one array
            bad = None if X.shape[1] == spec.dim else 0
        else:
            bad = next((i for i, x in enumerate(X) if len(x) != spec.dim), None)
        if bad is not None:  # ragged rows make numpy raise ValueError (was a 500)
            raise Problem(422, "invalid-dimension", f"features must have dimension {spec.dim}", index=bad)
        try:
            return validate_examples(spec, loss_for(spec), X, class_indices(spec, y))
        except InputError as e:
            raise Problem(422, e.code, str(e), index=e.index) from None

    # ---- unlearn ------------------------------------------------------------------------------------------
    def unlearn(self, tenant_id: str, model_id: str, ids: list[str], guard=None,
                examples: list[tuple] | None = None) -> dict[str, Any]:
        self._check_batch(len(ids))
        if len(set(ids)) != len(ids):
            raise Problem(422, "validation-error", "Each record id may appear only once in an unlearn request.")

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                if row.status == "retrain_required":
                    raise Problem(409, "retrain-required", "The model can certify no further deletion; retrain it.")
                key = self._record_key(s, tenant_id)
                digests = commitment_digests(key, ids)
                commits = [d.hex() for d in digests]
                learned, probe = self.records.find(s.connection(), model_id, digests, version=row.version)
                missing = next((i for i in range(len(ids)) if i not in learned), None)
                if missing is not None:
                    raise Problem(404, "record-not-found", f"Record {ids[missing]!r} was never learned by this model.")
                lookups = probe.lookups.tolist()  # computed once by find
                forgotten = _forgotten(s, model_id, commits, lookups)
                gone = next((i for i, c in enumerate(commits) if c in forgotten), None)
                if gone is not None:
                    raise Problem(409, "record-already-forgotten", f"Record {ids[gone]!r} was already forgotten.",
                                  receipt_id=forgotten[commits[gone]])
                engine = self._checkout(s, row)
            records = [_Rec(c, k, f.step, None if f.example_mac is None else f.example_mac.hex(), f.learned_at, f)
                       for c, k, f in zip(commits, lookups, (learned[i] for i in range(len(ids))))]
            dim = json.loads(row.spec_json)["dim"]
            if engine.needs_retained_data:
                if examples:
                    raise Problem(422, "validation-error", "This model keeps its data: send only the ids.")
                store = self._reader(work, row, dim)
            elif engine.needs_deletion_features:
                store = self._client_examples(row, key, ids, records, examples)
            else:
                store = None

            def compute():
                with numeric_guard():
                    certs = engine.forget([r.step for r in records], store)
                    require_finite_array([v for c in certs for v in (c.sigma, c.rho, c.sensitivity)],
                                         "a deletion certificate")
                return certs

            try:
                certs = work.run(compute, "The unlearn")
            except CapacityExhausted as e:
                with self.db.write() as s:
                    self._confirm(s, row)
                    row.status, row.updated_at = "retrain_required", utcnow()
                    row.flush(s)
                self.registry.evict(model_id)
                raise Problem(409, "deletion-capacity-exhausted",
                              str(e) or "The model's deletion capacity is spent.") from None
            except NotDeletable as e:
                bad = {rec.step: rid for rid, rec in zip(ids, records)}
                raise Problem(409, "record-not-deletable", str(e),
                              record_ids=[bad[t] for t in e.steps if t in bad] or None) from None
            except ForgetError as e:
                raise Problem(422, "forget-rejected", str(e)) from None
            erased = 0
            now = utcnow()
            with self.db.write() as s:
                self._confirm(s, row)  # the records checked above and the state forgotten from are still current
                if engine.needs_retained_data:
                    # crypto-shredding: the data keys and the sealed examples leave the database
                    erased = SqlRetained(s, model_id, dim, self.registry.cipher).erase([r.step for r in records])
                receipts = self.issuer.issue(s, row, engine, records, certs, now)
                conn = s.connection()
                conn.execute(_INSERT_FORGOTTEN, [
                    {"tenant_id": tenant_id, "model_id": model_id, "commitment": rec.commitment,
                     "lookup": rec.lookup, "step": rec.step, "status": "forgotten",
                     "learned_at": rec.learned_at, "forgotten_at": now, "receipt_id": receipt["id"],
                     "example_mac": None} for rec, receipt in zip(records, receipts)])
                self.records.erase_macs(conn, [rec.found for rec in records])
                conn.execute(insert(LedgerEntry.__table__), [
                    {"model_id": model_id, "epoch": r["epoch"], "receipt_id": r["id"],
                     "kind": "restart" if is_restart(c) else "deletion",
                     "step": c.forgotten_step, "sigma": c.sigma, "rho": c.rho, "created_at": now}
                    for r, c in zip(receipts, certs)])
                row.epoch = receipts[-1]["epoch"]
                row.rho_spent = float(engine.ledger().get("rho_spent") or 0.0)
                row.n_forgotten += len(records)
                self._store(s, row, engine, now, book=book.record(json.loads(row.ledger_json).get("book"), certs))
                result = {"receipts": receipts, "version": row.version}
                if guard is not None:
                    guard.complete(s, result)
            self.registry.checkin(model_id, row.version, engine)
            self.records.committed(probe, None, row.version)
            if erased:
                self.db.scrub_wal()  # no WAL frame keeps the forgotten examples or their keys once we answer
            return result, certs

        result, certs = self._optimistic(model_id, "The unlearn", attempt)
        if self.metrics:
            for c in certs:
                self.metrics.deletions.labels(c.mechanism).inc()
            self.metrics.rho_spent.inc(sum(c.rho for c in certs))
        return result

    # ---- retrain ------------------------------------------------------------------------------------------
    def retrain(self, tenant_id: str, model_id: str, guard=None) -> dict[str, Any]:
        """Exact retrain on the retained examples: a new ledger epoch, recorded in the ledger."""

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                engine = self._checkout(s, row)
            if not engine.supports_retrain:
                raise Problem(409, "retrain-not-supported", f"{row.algorithm} keeps no data to retrain on.")
            store = self._reader(work, row, json.loads(row.spec_json)["dim"])

            def compute():
                with numeric_guard():
                    engine.retrain(store)

            work.run(compute, "The retrain")
            now = utcnow()
            with self.db.write() as s:
                self._confirm(s, row)
                row.epoch += 1
                row.rho_spent = 0.0
                s.execute(insert(LedgerEntry), [{"model_id": model_id, "epoch": row.epoch, "receipt_id": None,
                                                 "kind": "retrain", "step": engine.step, "sigma": 0.0, "rho": 0.0,
                                                 "created_at": now}])
                self._store(s, row, engine, now, book=book.new_epoch(json.loads(row.ledger_json).get("book")))
                result = {"version": row.version, "epoch": row.epoch}
                if guard is not None:
                    guard.complete(s, result)
            self.registry.checkin(model_id, row.version, engine)
            return result

        return self._optimistic(model_id, "The retrain", attempt)

    # ---- predict and published parameters --------------------------------------------------------------
    INLINE_PREDICT_VALUES = 65_536  # larger prediction requests are computed on a worker thread

    def predict_inline(self, X: list[list[float]]) -> bool:
        """Whether ``predict(..., inline=True)`` may run on the event loop: on SQLite (one indexed read of the
        model row on this thread's own connection, ~0.1 ms; a WAL reader never waits for a writer) and for
        small inputs.  It saves the worker-thread hop (0.35-0.5 ms of a ~2 ms predict on this project's machine);
        PostgreSQL reads go over the network and keep the hop."""
        return self.db.is_sqlite and sum(len(row) for row in X) <= self.INLINE_PREDICT_VALUES

    def predict(self, tenant_id: str, model_id: str, X: list[list[float]] | None, inline: bool = False,
                features: list | None = None) -> dict[str, Any]:
        self._check_batch(len(X) if X is not None else len(features or ()))
        # one prebuilt Core query of the columns a prediction needs
        with (self.db.own_read() if inline else self.db.read_connection()) as conn:
            found = conn.execute(_PREDICT_COLUMNS, {"mid": model_id, "tid": tenant_id}).first()
        if found is None:
            raise Problem(404, "model-not-found", f"No model {model_id}.")
        version = found[0]
        published = self._published.get((model_id, version))
        if published is None:  # decoded once per (model, version): a version never changes once written
            ledger = json.loads(found[3])
            spec = spec_from_json(found[1])
            gate = None
            if ledger.get("inference_allowed") is False:
                gate = (f"The model answers predictions once it has learned {ledger.get('sample_complexity')} "
                        f"examples (it has {ledger.get('n_inserts')}); its inference gate is on.")
            theta = published_array(found[2])
            theta.setflags(write=False)  # shared by later requests
            published = (spec, theta, loss_for(spec), gate)
            if len(self._published) >= 1024:
                self._published.clear()
            self._published[(model_id, version)] = published
        spec, theta, loss, gate = published
        dim = spec.dim
        if gate is not None:
            raise Problem(409, "inference-not-ready", gate)
        if spec.features is not None or features is not None:
            X = self._encode(spec, X, features, examples=False)
        if any(len(row) != dim for row in X):  # ragged rows would make numpy raise (was a 500)
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        Xa = np.asarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] != dim:
            raise Problem(422, "invalid-dimension", f"Each feature vector must have {dim} values.")
        if loss.n_out > 1:  # softmax: K scores per input (losses.py)
            return self._predict_classes(loss, theta, Xa, spec.classes, version)
        with np.errstate(over="ignore", invalid="ignore"):
            scores = Xa @ theta[:-1] + theta[-1]
        if not np.all(np.isfinite(scores)):  # would not serialise as JSON (was a 500)
            raise Problem(422, "out-of-bounds-input", "Feature values too large to score.")
        return {"predictions": loss.predict(scores).tolist(), "scores": loss.score_output(scores).tolist(),
                "version": version}

    @staticmethod
    def _predict_classes(loss, theta, Xa, names, version: int) -> dict[str, Any]:
        """Softmax: the class index (and name, if declared), its probability and all K class probabilities."""
        with np.errstate(over="ignore", invalid="ignore"):
            scores = loss.linear_scores(theta, Xa)
            probs = loss.score_output(scores) if np.all(np.isfinite(scores)) else scores
        if not np.all(np.isfinite(probs)):
            raise Problem(422, "out-of-bounds-input", "Feature values too large to score.")
        pred = np.argmax(probs, axis=1)
        out = {"predictions": pred.astype(np.float64).tolist(),
               "scores": probs[np.arange(len(pred)), pred].tolist(), "version": version,
               "probabilities": probs.tolist()}
        if names is not None:
            out["classes"] = [names[k] for k in pred.tolist()]
        return out

    def parameters(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            row = self._row(s, tenant_id, model_id)
        theta = published_array(row.published)
        if not np.all(np.isfinite(theta)):  # never served as null weights (stored before the finite guard)
            raise Problem(409, "non-finite-result", "The model's stored parameters are not finite numbers; "
                                                    "retrain or delete the model.")
        spec = json.loads(row.spec_json)
        if spec.get("n_classes"):  # K outputs (stored for softmax only): the K x (d + 1) matrix, row-major (losses.py)
            return {"version": row.version, "weights": theta.tolist(), "bias": None,
                    "published_at": row.published_at, "shape": [spec["n_classes"], spec["dim"] + 1],
                    "classes": spec.get("classes")}
        return {"version": row.version, "weights": theta[:-1].tolist(), "bias": float(theta[-1]),
                "published_at": row.published_at}

    # ---- audit reads --------------------------------------------------------------------------------------
    def ledger(self, tenant_id: str, model_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            row = self._row(s, tenant_id, model_id, include_deleted=True)
            entries = list(s.scalars(select(LedgerEntry).where(LedgerEntry.model_id == model_id)
                                     .order_by(LedgerEntry.id)))
            gone = self._deletion_mark(s, row)
        return {**ledger_view(row, json.loads(row.ledger_json), json.loads(row.spec_json), entries), **gone}

    @staticmethod
    def _deletion_mark(s, row: Model) -> dict[str, Any]:
        """Whether the model is deleted, when, and under which erasure receipt (audit reads of deleted models)."""
        receipt_id = None
        if row.status == "deleted":
            receipt_id = s.scalars(select(Receipt.id).where(Receipt.model_id == row.id, Receipt.kind == ERASURE,
                                                            Receipt.tenant_id == row.tenant_id)).first()
        return {"model_status": "deleted" if row.status == "deleted" else "live",
                "deleted_at": row.deleted_at if row.status == "deleted" else None, "erasure_receipt_id": receipt_id}

    def deletions(self, tenant_id: str, model_id: str, cursor: str | None, limit: int, since=None,
                  until=None) -> dict[str, Any]:
        try:
            after = int(cursor) if cursor else -1
        except ValueError:
            raise Problem(422, "validation-error", "cursor must be a value returned as next_cursor.") from None
        with self.db.read() as s:
            gone = self._deletion_mark(s, self._row(s, tenant_id, model_id, include_deleted=True))
            q = select(Receipt).where(Receipt.model_id == model_id, Receipt.tenant_id == tenant_id,
                                      Receipt.kind != ERASURE, Receipt.log_index > after)
            if since is not None:
                q = q.where(Receipt.issued_at >= since)
            if until is not None:
                q = q.where(Receipt.issued_at < until)
            rows = list(s.scalars(q.order_by(Receipt.log_index).limit(limit + 1)))
        more = len(rows) > limit
        rows = rows[:limit]
        return {"items": [json.loads(r.body) for r in rows], "next_cursor": str(rows[-1].log_index) if more else None,
                **gone}

    def receipt(self, tenant_id: str, receipt_id: str) -> dict[str, Any]:
        with self.db.write() as s:  # may store a newly signed checkpoint
            row = s.scalars(select(Receipt).where(Receipt.id == receipt_id, Receipt.tenant_id == tenant_id)).first()
            if row is None:
                raise Problem(404, "receipt-not-found", f"No receipt {receipt_id}.")
            body = json.loads(row.body)
            body["proof"] = self.issuer.proof(s, tenant_id, row.log_index)
        return body

    def checkpoint(self, tenant_id: str) -> dict[str, Any]:
        with self.db.write() as s:  # may store a newly signed checkpoint
            return self.issuer.checkpoint(s, tenant_id)

    def consistency(self, tenant_id: str, from_size: int, to_size: int | None) -> dict[str, Any]:
        with self.db.write() as s:
            return self.issuer.consistency(s, tenant_id, from_size, to_size)

    def export(self, tenant_id: str, record_id: str | None, model_id: str | None) -> dict[str, Any]:
        """Receipts with inclusion proofs against one checkpoint, plus the public keys; and the erasure receipts
        of deleted models (of this model, or that erased this record), each with its inclusion proof and, in a
        model's bundle, the sorted commitments of the records it erased (the verifier recomputes count and hash)."""
        if (record_id is None) == (model_id is None):
            raise Problem(422, "validation-error", "Give exactly one of record_id or model_id.")
        with self.db.write() as s:
            q = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind != ERASURE)
            if record_id is not None:
                key = self._record_key(s, tenant_id)
                c = commitment(key, record_id)
                q = q.where(Receipt.record_commitment == c)
                erased = list(s.scalars(select(Record.receipt_id).where(
                    Record.lookup == lookup_key(c), Record.tenant_id == tenant_id, Record.commitment == c,
                    Record.status == ERASED)))
                eq = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind == ERASURE,
                                           Receipt.id.in_(erased or [""]))
            else:
                self._row(s, tenant_id, model_id, include_deleted=True)
                q = q.where(Receipt.model_id == model_id)
                eq = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind == ERASURE,
                                           Receipt.model_id == model_id)
            rows = list(s.scalars(q.order_by(Receipt.log_index)))
            erasure_rows = list(s.scalars(eq.order_by(Receipt.log_index)))
            if record_id is not None and not rows and not erasure_rows:
                raise Problem(404, "record-not-found", "No receipt of this tenant concerns this record.")
            cp = self.issuer.checkpoint(s, tenant_id)
            receipts = []
            for r in rows:
                body = json.loads(r.body)
                body["proof"] = self.issuer.proof_at(s, tenant_id, r.log_index, cp)
                receipts.append(body)
            erasures = []
            for r in erasure_rows:
                body = json.loads(r.body)
                body["proof"] = self.issuer.proof_at(s, tenant_id, r.log_index, cp)
                commits = None
                if model_id is not None:
                    commits = sorted(s.scalars(select(Record.commitment).where(
                        Record.model_id == r.model_id, Record.receipt_id == r.id, Record.status == ERASED)))
                erasures.append({"receipt": body, "commitments": commits})
        return {"receipts": receipts, "erasures": erasures, "checkpoint": cp,
                "public_keys": self.issuer.keyring.public_keys()}

    def record_status(self, tenant_id: str, record_id: str) -> dict[str, Any]:
        with self.db.read() as s:
            key = self._record_key(s, tenant_id)
            digest = commitment_digests(key, [record_id])[0]
            c = digest.hex()
            conn = s.connection()
            models = []
            for mid in s.scalars(select(Model.id).where(Model.tenant_id == tenant_id, Model.status != "deleted")
                                 .order_by(Model.id)):
                learned, _ = self.records.find(conn, mid, [digest])
                if 0 in learned:
                    models.append({"model_id": mid, "status": "learned", "step": learned[0].step, "receipt_id": None})
            rows = list(s.scalars(select(Record).where(
                Record.lookup == lookup_key(c), Record.tenant_id == tenant_id, Record.commitment == c)))
            forgotten = {r.model_id: r for r in rows if r.status != ERASED}
            erased = [r for r in rows if r.status == ERASED]
            # models deleted since: their records are erased, but the receipts remain in the log
            extra = list(s.scalars(select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind != ERASURE,
                                                         Receipt.record_commitment == c)))
        for m in models:
            if m["model_id"] in forgotten:
                m["status"], m["receipt_id"] = "forgotten", forgotten[m["model_id"]].receipt_id
        seen = {m["model_id"] for m in models}
        for r in sorted(erased, key=lambda r: r.model_id):  # learned by a model deleted since: erased with it
            models.append({"model_id": r.model_id, "status": "erased_with_model", "step": r.step,
                           "receipt_id": r.receipt_id, "erased_at": r.forgotten_at})
            seen.add(r.model_id)
        for rc in extra:
            if rc.model_id not in seen:
                body = json.loads(rc.body)
                models.append({"model_id": rc.model_id, "status": "forgotten", "step": body["learned_step"],
                               "receipt_id": rc.id})
                seen.add(rc.model_id)
        if not models:
            raise Problem(404, "record-not-found", "No model of this tenant has learned this record.")
        return {"record_id": record_id, "models": models}

    # ---- internals ----------------------------------------------------------------------------------------
    @staticmethod
    def _client_examples(row: _ModelRow, key: bytes, ids: list[str], records: list[_Rec], examples) -> ArrayRetained:
        """The features a client sent to forget records of a model that keeps no data, checked against their MAC."""
        # (id, x, y) or (id, x, y, features): x None when the example was sent as a feature dictionary
        by_id = {rid: (x, yv, f[0] if f else None) for rid, x, yv, *f in (examples or [])}
        missing = [rid for rid in ids if rid not in by_id]
        if missing:
            raise Problem(422, "deletion-features-required",
                          f"This model keeps no data: send each forgotten record's x (or features) and y in 'examples' "
                          f"(missing {missing[0]!r}).")
        spec = spec_from_json(row.spec_json)
        X = [by_id[rid][0] for rid in ids]
        F = [by_id[rid][2] for rid in ids]
        if spec.features is not None or any(f is not None for f in F):
            order = {e[0]: i for i, e in enumerate(examples)}
            try:
                X = dense_rows(spec.features, spec.x_norm, X, F)
            except FeatureError as e:  # name the example by its place in the request
                e.index = order[ids[e.index]] if e.index is not None else None
                raise feature_problem(e, examples=True) from None
        try:
            X, y = validate_examples(spec, loss_for(spec), X,
                                     class_indices(spec, [by_id[rid][1] for rid in ids]))
        except InputError as e:
            raise Problem(422, e.code, str(e), index=e.index) from None
        for rid, rec, xi, yi in zip(ids, records, X, y):
            if rec.example_mac is None or not hmac.compare_digest(rec.example_mac, example_mac(key, xi, yi)):
                raise Problem(422, "example-mismatch", f"The features sent for {rid!r} are not the ones learned.")
        return ArrayRetained([r.step for r in records], X, y)

    @staticmethod
    def _encode(spec, X: Any, F: list | None, *, examples: bool = True) -> Any:
        """Dense rows of a request for the model's spec: feature dictionaries hashed (app/features.py), the same
        function at learning, forgetting and prediction; a request of the wrong shape is a 422 (``examples``: the
        request lists examples, as learn and unlearn do, rather than predict's inputs)."""
        try:
            return dense_rows(spec.features, spec.x_norm, X, F)
        except FeatureError as e:
            raise feature_problem(e, examples=examples) from None

    def _check_batch(self, n: int) -> None:
        if n > self.settings.max_batch:
            raise Problem(413, "batch-too-large", f"At most {self.settings.max_batch} items per request.")

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

    def _checkout(self, s, row: _ModelRow) -> Unlearner:
        def load_blob() -> bytes:
            return s.execute(select(ModelState.blob).where(ModelState.model_id == row.id)).scalar_one()

        return self.registry.checkout(row.id, row.version, row.spec_json, load_blob)

    def _store(self, s, row: _ModelRow, engine: Unlearner, now, book: Any = _KEEP, **fields: Any) -> None:
        if book is _KEEP:
            book = json.loads(row.ledger_json).get("book")
        row.version += 1
        row.step = engine.step
        row.status = engine.status
        with numeric_guard():
            row.published = published_bytes(engine.published())
        row.published_at = now
        row.updated_at = now
        row.ledger_json = json.dumps({**engine.ledger(), "book": book})
        for k, v in fields.items():
            setattr(row, k, v)
        row.flush(s)
        # Core on the connection: no ORM autoflush of the model row here
        s.connection().execute(_STORE_STATE, {"mid": row.id, "version": row.version,
                                              "blob": self.registry.dump(engine, row.id)})
