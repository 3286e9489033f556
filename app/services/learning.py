"""Learning: learn a batch (examples or features), and retrain exactly on the retained data.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
from sqlalchemy import insert

from .request_memory import check_encoded_rows
from ..db.tables import LedgerEntry
from ..errors import Problem
from ..ids import utcnow
from ..registry import (loss_for, spec_from_json)
from ..unlearning import (InputError, validate_examples)
from . import book
from .records import example_mac
from .model_core import (UseCase, class_indices, numeric_guard)


def check_distinct(ids: list[str]) -> None:
    """422 duplicate-record naming the first record id that appears twice in one learn."""
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        for rid in ids:
            if rid in seen:
                raise Problem(422, "duplicate-record", f"Record id {rid!r} appears more than once in this batch.")
            seen.add(rid)


def capacity_problem(engine, left: int) -> Problem:
    """409 horizon-reached naming the spec field that bounds the model and what raises it (issue 36 item 3); a family
    whose capacity is spent for a reason of its own words it (``learn_refusal``: exact_ridge's release horizon,
    which must not state a record count)."""
    field = engine.learn_capacity_field()
    own = engine.learn_refusal()
    if own is not None:
        return Problem(409, "horizon-reached", own, field=field)
    detail = (f"The model was created for a horizon of {engine.step + left} examples and has learned {engine.step}: "
              f"it can learn {left} more.")
    if field == "hyperparameters.max_records":
        detail += (" The bound is its retained-record cap, hyperparameters.max_records (records held at once: "
                   "forgetting records makes room). When a spec does not give it, the service fills it in from its "
                   "work budget, at most the setting OLU_MAX_RETAINED_RECORDS; create a model with a larger "
                   "max_records (accepted up to what the setting OLU_MAX_REQUEST_WORK admits) to keep more.")
    elif field is not None:
        detail += f" The bound is {field}, declared at creation: create a model with a larger value to learn more."
    else:
        detail += " The bound is a constant of the family (its constants say which)."
    return Problem(409, "horizon-reached", detail, field=field)


class Learning(UseCase):
    def learn(self, tenant_id: str, model_id: str, ids: list[str], X: Any, y: Any, guard=None,
              F: list | None = None, digests: Sequence[bytes] | None = None) -> dict[str, Any]:
        """Learn ``ids`` with dense rows ``X`` or, per example, feature dictionaries ``F`` (models with a spec).
        ``digests``: the ids' commitments under the tenant's record key when computed already (the decode pool)."""
        self._check_batch(len(ids))
        check_distinct(ids)
        rows: list = []  # the request's (X, y) once checked against the model's spec (it never changes)

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                spec = spec_from_json(row.spec_json)
                if not rows:
                    rows.append(self._learn_rows(spec, X, y, F))
                Xv, yv = rows[0]
                key = self._record_key(s, tenant_id)
                commits = digests if digests is not None else self._commitments(key, ids)
                held, probe = self.records.find(s.connection(), model_id, commits, version=row.version)
                if held:
                    raise Problem(409, "duplicate-record", f"Record id {ids[min(held)]!r} was already used in this "
                                  "model.")
                engine = self._checkout(s, row)
                # refuse before computing what the quotas would refuse to keep
                self.quotas.check(s, tenant_id, {"records": len(ids), "bytes": len(ids) * self.core.record_bytes(engine)})
            limit = engine.learn_batch_limit()  # the model's work budget per request (issue 21)
            if limit is not None and len(ids) > limit:
                raise Problem(413, "batch-too-large", f"This model learns at most {limit} examples per request (its "
                              "work budget, hyperparameters.max_learn_batch); send them in several requests.")
            left = engine.learn_capacity()
            if left is not None and len(ids) > left:
                raise capacity_problem(engine, left)
            store = self._reader(work, row, engine) if engine.needs_retained_data else None

            def compute():
                with numeric_guard():
                    return engine.learn(Xv, yv, store)  # on any refusal the engine copy is dropped

            steps = work.run(compute, "The learn")
            now = utcnow()
            macs = ([bytes.fromhex(example_mac(key, xi, yi)) for xi, yi in zip(Xv, yv)]
                    if engine.needs_deletion_features and not engine.needs_retained_data else None)
            prepared = self._prepare(row, engine, learned=(Xv, yv))  # outside the write lock
            with self.db.write() as s:
                self._confirm(s, row)  # the state the engine computed from is still the model's
                batch_id = self.records.insert(s.connection(), probe, tenant_id, steps, macs, now)
                if store is not None:
                    self._retained(s, row, engine).add(steps, Xv, yv)
                old_bytes = row.bytes_stored
                self._store(s, row, engine, now, prepared=prepared, n_records=row.n_records + len(ids))
                # under the tenant's row lock: concurrent learns of the tenant's models do not pass a quota together
                self.quotas.check_locked(s, tenant_id, {"records": len(ids), "bytes": row.bytes_stored - old_bytes})
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
        if spec.features is not None or spec.feature_map is not None or F is not None:
            check_encoded_rows(spec, len(y), self.settings.max_request_memory)  # before any row is encoded
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

    def retrain(self, tenant_id: str, model_id: str, guard=None) -> dict[str, Any]:
        """Exact retrain on the retained examples: a new ledger epoch, recorded in the ledger."""

        def attempt(work):
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
                engine = self._checkout(s, row)
            if not engine.supports_retrain:
                raise Problem(409, "retrain-not-supported", f"{row.algorithm} keeps no data to retrain on; "
                              "its forgets never need a retrain (one its analysis cannot certify restarts the "
                              "model exactly).")
            store = self._reader(work, row, engine)

            def compute():
                with numeric_guard():
                    engine.retrain(store)

            work.run(compute, "The retrain")
            now = utcnow()
            prepared = self._prepare(row, engine)  # outside the write lock
            with self.db.write() as s:
                self._confirm(s, row)
                row.epoch += 1
                row.rho_spent = 0.0
                s.execute(insert(LedgerEntry), [{"model_id": model_id, "epoch": row.epoch, "receipt_id": None,
                                                 "kind": "retrain", "step": engine.step, "sigma": 0.0, "rho": 0.0,
                                                 "created_at": now}])
                self._store(s, row, engine, now, book=book.new_epoch(json.loads(row.ledger_json).get("book")),
                            prepared=prepared)
                result = {"version": row.version, "epoch": row.epoch}
                if guard is not None:
                    guard.complete(s, result)
            self.registry.checkin(model_id, row.version, engine)
            return result

        return self._optimistic(model_id, "The retrain", attempt)
