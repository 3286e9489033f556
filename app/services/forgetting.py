"""Forgetting: unlearn records, with a signed certificate receipt per record.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import hmac
import json
from typing import Any, Sequence

from sqlalchemy import insert

from ..db.tables import LedgerEntry
from ..errors import Problem
from ..features import FeatureError, dense_rows
from ..feature_map import encode as map_encode
from ..ids import utcnow
from ..registry import (loss_for, spec_from_json)
from ..unlearning.mechanism.calibration import require_finite_array
from ..unlearning import (ArrayRetained, CapacityExhausted, ForgetError, InputError, NotDeletable, validate_examples)
from . import book
from .dropped import count_dropped
from .idempotency import erase_learned
from .receipts import is_restart
from .records import example_mac
from .request_memory import check_encoded_rows
from .model_core import (UseCase, _INSERT_FORGOTTEN, _ModelRow, _Rec, _forgotten, class_indices, feature_problem, numeric_guard)


def spent_problem(slug: str, model_id: str, engine, why: str) -> Problem:
    """A forget the model cannot certify now (409), with the advice its family can follow (issue 29 item 5): a retrain
    where the engine can retrain (the ``retrain`` member names the operation), else the deletion of the model, which
    forgets every record it learned exactly.  The advice comes from the engine contract, never the algorithm name."""
    why = why.rstrip(".")
    if engine.supports_retrain:
        path = f"/v1/models/{model_id}/retrain"
        return Problem(409, slug, f"{why}. Retrain the model (POST {path}): an exact retrain on the records it keeps "
                                  "opens a new epoch, after which this forget is certified.", retrain=path)
    path = f"/v1/models/{model_id}"
    return Problem(409, slug, f"{why}. This model keeps no data to retrain on: delete it (DELETE {path}), which "
                              "forgets every record it learned exactly, and create a new one.", delete=path)


class Forgetting(UseCase):
    def unlearn(self, tenant_id: str, model_id: str, ids: list[str], guard=None,
                examples: list[tuple] | None = None, digests: Sequence[bytes] | None = None) -> dict[str, Any]:
        """Forget ``ids`` (``digests``: their commitments under the tenant's record key when computed already, by
        the decode pool)."""
        self._check_batch(len(ids))
        if len(set(ids)) != len(ids):
            raise Problem(422, "validation-error", "Each record id may appear only once in an unlearn request.")

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                engine = None
                if row.status == "retrain_required":
                    engine = self._checkout(s, row)
                    if engine.supports_retrain:  # else (a row stored so before) the engine forgets exactly
                        raise spent_problem("retrain-required", model_id, engine,
                                            "The model can certify no further deletion")
                key = self._record_key(s, tenant_id)
                commits_of = digests if digests is not None else self._commitments(key, ids)
                learned, probe = self.records.find(s.connection(), model_id, commits_of, version=row.version)
                missing = next((i for i in range(len(ids)) if i not in learned), None)
                if missing is not None:
                    raise Problem(404, "record-not-found", f"Record {ids[missing]!r} was never learned by this model.")
                commits = [d.hex() for d in commits_of]
                lookups = probe.lookups.tolist()  # computed once by find
                forgotten = _forgotten(s, model_id, commits, lookups)
                gone = next((i for i, c in enumerate(commits) if c in forgotten), None)
                if gone is not None:
                    raise Problem(409, "record-already-forgotten", f"Record {ids[gone]!r} was already forgotten.",
                                  receipt_id=forgotten[commits[gone]])
                engine = self._checkout(s, row) if engine is None else engine
            records = [_Rec(c, k, f.step, None if f.example_mac is None else f.example_mac.hex(), f.learned_at, f)
                       for c, k, f in zip(commits, lookups, (learned[i] for i in range(len(ids))))]
            if engine.needs_retained_data:
                if examples:
                    raise Problem(422, "examples-not-accepted", "This model keeps its data: send only the ids.")
                store = self._reader(work, row, engine)
            elif engine.needs_deletion_features:
                store = self._client_examples(row, key, ids, records, examples, self.settings.max_request_memory)
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
                raise spent_problem("deletion-capacity-exhausted", model_id, engine,
                                    str(e) or "The model's deletion capacity is spent") from None
            except NotDeletable as e:
                bad = {rec.step: rid for rid, rec in zip(ids, records)}
                raise Problem(409, "record-not-deletable", str(e),
                              record_ids=[bad[t] for t in e.steps if t in bad] or None) from None
            except ForgetError as e:
                raise Problem(422, "forget-rejected", str(e)) from None
            erased = 0
            now = utcnow()
            prepared = self._prepare(row, engine)  # outside the write lock
            with self.db.write() as s:
                self._confirm(s, row)  # the records checked above and the state forgotten from are still current
                if engine.needs_retained_data:
                    # crypto-shredding: the data keys and the sealed examples leave the database
                    erased = self._retained(s, row, engine).erase([r.step for r in records])
                receipts = self.issuer.issue(s, row, engine, records, certs, now)
                conn = s.connection()
                conn.execute(_INSERT_FORGOTTEN, [
                    {"tenant_id": tenant_id, "model_id": model_id, "commitment": rec.commitment,
                     "lookup": rec.lookup, "step": rec.step, "status": "forgotten",
                     "learned_at": rec.learned_at, "forgotten_at": now, "receipt_id": receipt["id"],
                     "example_mac": None} for rec, receipt in zip(records, receipts)])
                self.records.erase_macs(conn, [rec.found for rec in records])
                erase_learned(conn, tenant_id, model_id, [rec.step for rec in records])  # journals (idempotency.py)
                count_dropped(conn, row, engine, [rec.step for rec in records])  # a restart's records (dropped.py)
                charge = engine.creation_charge()  # private from the start: a restarted epoch is charged afresh
                entries = []
                for r, c in zip(receipts, certs):
                    entries.append({"model_id": model_id, "epoch": r["epoch"], "receipt_id": r["id"],
                                    "kind": "restart" if is_restart(c) else "deletion",
                                    "step": c.forgotten_step, "sigma": c.sigma, "rho": c.rho, "created_at": now})
                    if charge is not None and is_restart(c):
                        entries.append({**entries[-1], "receipt_id": None, "kind": "creation",
                                        "sigma": float(charge["sigma"]), "rho": float(charge["rho"])})
                conn.execute(insert(LedgerEntry.__table__), entries)
                row.epoch = receipts[-1]["epoch"]
                row.rho_spent = float(engine.ledger().get("rho_spent") or 0.0)
                row.n_forgotten += len(records)
                self._store(s, row, engine, now, book=book.record(json.loads(row.ledger_json).get("book"), certs),
                            prepared=prepared)
                result = {"receipts": receipts, "version": row.version}
                if guard is not None:
                    guard.complete(s, result)
            self.registry.checkin(model_id, row.version, engine)
            self.records.committed(probe, None, row.version)
            if erased or self.registry.logs_examples(engine):
                self.db.scrub_wal()  # no WAL frame keeps the forgotten examples (retained or logged) once we answer
            return result, certs

        result, certs = self._optimistic(model_id, "The unlearn", attempt)
        if self.metrics:
            for c in certs:
                self.metrics.deletions.labels(c.mechanism).inc()
            self.metrics.rho_spent.inc(sum(c.rho for c in certs))
        return result

    @staticmethod
    def _client_examples(row: _ModelRow, key: bytes, ids: list[str], records: list[_Rec], examples,
                         memory: int | None = None) -> ArrayRetained:
        """The features a client sent to forget records of a model that keeps no data, checked against their MAC;
        ``memory``: OLU_MAX_REQUEST_MEMORY, which their encoded rows must fit."""
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
        if spec.features is not None or spec.feature_map is not None or any(f is not None for f in F):
            if memory is not None:
                check_encoded_rows(spec, len(ids), memory)
            order = {e[0]: i for i, e in enumerate(examples)}
            try:  # the same encoding as at learn: the check codes below compare what the model summed
                X = map_encode(spec.feature_map, dense_rows(spec.features, spec.x_norm, X, F))
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
