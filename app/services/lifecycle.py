"""Model lifecycle: create, get, list, delete, and erasure with the model or its tenant.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np
from sqlalchemy import delete, insert, select

from ..db import state_log
from ..db.record_batches import lookups_of
from ..db.tables import LedgerEntry, Model, ModelState, Record, RecordBatch, Tenant
from ..errors import Problem
from ..features import FeatureSpecError, normalize_spec
from ..ids import new_id, utcnow
from ..registry import (build_spec, request_budget, published_bytes, spec_to_json)
from ..unlearning import (SpecError, check_new_hyperparameters)
from .spec_hints import with_choices, with_default_loss
from ..db.retained import SqlRetained
from .idempotency import erase_model
from .quotas import bump
from . import book, feature_maps
from ..receipts.canonical import erased_records_sha256
from .receipts import guarantee_of
from .model_core import (ERASED, UseCase, _MODEL_CURSOR, _RECORDS, _insert_erased, spec_problem)


class ModelLifecycle(UseCase):
    def create(self, tenant_id: str, payload: dict[str, Any], guard=None) -> dict[str, Any]:
        if payload.get("features") is not None:
            try:
                payload = {**payload, "features": normalize_spec(payload["features"], payload["dim"])}
            except FeatureSpecError as e:
                field = f"features.{e.field}"
                raise Problem(422, "invalid-model-spec", f"{field}: {e}", errors=[{
                    "field": field, "pointer": "/" + field.replace(".", "/"), "loc": ["body", *field.split(".")],
                    "msg": str(e)}]) from None
        payload, fm = feature_maps.engine_payload(payload)  # a public feature map: the engine sees phi(x)
        budget, max_dim = request_budget(self.settings), self.settings.max_dim
        engine_budget = feature_maps.engine_budget(budget, fm)
        try:
            payload = with_default_loss(payload)
            check_new_hyperparameters(payload["algorithm"], payload["loss"], payload.get("hyperparameters"))
            spec = build_spec(payload, max_dim=max_dim, budget=engine_budget)
        except SpecError as e:
            raise spec_problem(feature_maps.renamed(with_choices(e, payload, max_dim, engine_budget), fm, payload, budget,
                                                    max_dim)) from None
        spec = feature_maps.finish(spec, fm, budget, payload, max_dim)
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
        blob = self.registry.dump(engine, model_id)
        row.bytes_stored = len(blob)
        with self.db.write() as s:
            # a deleted tenant gets no new model, and concurrent creations of one tenant pass its models quota one
            # at a time (the row lock orders this against DELETE /v1/tenants/{id} and other creations)
            q = select(Tenant.deleted_at).where(Tenant.id == tenant_id)
            if s.execute(q if self.db.is_sqlite else q.with_for_update()).scalar_one_or_none() is not None:
                raise Problem(404, "tenant-not-found", "This tenant is deleted.")
            self.quotas.check(s, tenant_id, {"models": 1, "bytes": len(blob)})  # before the model's writes
            bump(s, tenant_id, model_id, models=1, stored=row.bytes_stored)  # the tenant's usage counters (quotas.py)
            self.quotas.check_locked(s, tenant_id, {"models": 1, "bytes": len(blob)})  # against concurrent learns
            s.add(row)
            s.flush()
            s.add(ModelState(model_id=model_id, version=1, blob=blob))
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
        state_log.erase(s, model_id)  # the base, the deltas and their keys
        s.execute(delete(Record).where(Record.model_id == model_id))
        s.execute(delete(RecordBatch).where(RecordBatch.model_id == model_id))
        SqlRetained(s, model_id, 0).erase_all()
        erase_model(conn, row.tenant_id, model_id)  # the fingerprints of its learns in the journals (idempotency.py)
        lookups = lookups_of(b"".join(packed)).tolist() if packed else []
        _insert_erased(conn, [(row.tenant_id, model_id, c.hex(), k, t, ERASED, at, now, receipt["id"])
                              for c, k, t, at in zip(packed, lookups, steps, learned)])
        conn.execute(insert(LedgerEntry.__table__), [
            {"model_id": model_id, "epoch": row.epoch, "receipt_id": receipt["id"], "kind": "erasure",
             "step": row.step, "sigma": 0.0, "rho": 0.0, "created_at": now}])
        # the model leaves the tenant's usage: one live model, its records held and its bytes (quotas.py)
        bump(s, row.tenant_id, model_id, models=-1, records=-(row.n_records - row.n_forgotten - (row.n_dropped or 0)),
             stored=-(row.bytes_stored or 0))
        row.status, row.published, row.deleted_at, row.updated_at = "deleted", None, now, now
        row.last_evaluation = None  # its figures go with the model
        row.version += 1
        s.flush()
        return receipt
