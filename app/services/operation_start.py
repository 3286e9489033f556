"""Starting an operation (app/services/operations.py): which requests become one, and their checks at creation.

A request becomes an operation when its work exceeds one request's budget (Settings.max_request_work, estimated
from the engine's ``estimate`` as at creation, app/registry.py) or when it asks for it (``Prefer: respond-async``):

- a retrain whose ``estimate(spec, 1).retrain`` for the records the model holds now is over the budget;
- an unlearn of more ids than the model's ``max_forget_batch`` (the most one request may forget within the budget);
- a learn of more examples than the model's ``max_learn_batch``.

Everything a request would be refused for at once is refused here too, with the same problem and before anything is
stored (unknown model, a retrain the family cannot do, unknown or already forgotten ids, duplicate or already
learned ids, bad examples, quotas, the horizon), so that an operation fails later only on what changed meanwhile.
The request is then stored as sealed chunks of commitments and checked examples (never the ids), one chunk per
step, in the transaction that creates the operation and, with an Idempotency-Key, stores the 202 answer.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from ..db.record_batches import packed_digests
from ..errors import Problem
from ..registry import spec_from_json
from ..unlearning import engine_class
from .forgetting import Forgetting, spent_problem
from .learning import Learning, check_distinct
from .model_core import UseCase, _forgotten, _Rec
from .operations import OperationStore, view

_CACHE = 10_000  # models whose per-request limits this process remembers (a spec never changes)


class OperationStarts(UseCase):
    def __init__(self, core, store: OperationStore):
        super().__init__(core)
        self.store = store
        self._learning, self._forgetting = Learning(core), Forgetting(core)
        self._limits: OrderedDict[tuple[str, str], tuple[int | None, int | None]] = OrderedDict()

    # ---- which requests become operations ------------------------------------------------------------------------
    def _per_request(self, tenant_id: str, model_id: str) -> tuple[int | None, int | None] | None:
        """(max_learn_batch, max_forget_batch) of the model, None when there is no such model (the request path
        answers 404)."""
        key = (tenant_id, model_id)
        got = self._limits.get(key)
        if got is None:
            try:
                with self.db.read() as s:
                    row = self._model_row(s, tenant_id, model_id)
            except Problem:
                return None
            hp = spec_from_json(row.spec_json).hyperparameters
            got = self._limits[key] = (hp.get("max_learn_batch"), hp.get("max_forget_batch"))
            if len(self._limits) > _CACHE:
                self._limits.popitem(last=False)
        return got

    def unlearn_is_long(self, tenant_id: str, model_id: str, n: int) -> bool:
        limits = self._per_request(tenant_id, model_id)
        return limits is not None and limits[1] is not None and n > int(limits[1])

    def learn_is_long(self, tenant_id: str, model_id: str, n: int) -> bool:
        limits = self._per_request(tenant_id, model_id)
        return limits is not None and limits[0] is not None and n > int(limits[0])

    def retrain_is_long(self, tenant_id: str, model_id: str) -> bool:
        """Whether one exact retrain of the records the model holds now exceeds the request budget."""
        try:
            with self.db.read() as s:
                row = self._model_row(s, tenant_id, model_id)
        except Problem:
            return False
        cls = engine_class(row.algorithm)
        if not cls.supports_retrain:
            return False
        spec = spec_from_json(row.spec_json)
        held = max(1, int(row.n_records) - int(row.n_forgotten))
        if cls.keeps_records(spec):
            cap = spec.hyperparameters.get("max_records")
            spec = spec.with_hyperparameters({**spec.hyperparameters,
                                              "max_records": held if cap is None else min(int(cap), held)})
        try:
            work = cls.estimate(spec, 1).retrain
        except Exception:  # noqa: BLE001 - no estimate: the request path decides
            return False
        return not work <= float(self.settings.max_request_work)

    # ---- creation ------------------------------------------------------------------------------------------------
    def _create(self, tenant_id: str, model_id: str, kind: str, total: int, chunks: list[dict] | None,
                guard) -> dict[str, Any]:
        with self.db.write() as s:
            self._model_row(s, tenant_id, model_id)  # not deleted meanwhile
            out = view(self.store.create(s, tenant_id, model_id, kind, total, chunks))
            if guard is not None:
                guard.complete(s, out)
        self.store.created()
        return out

    def retrain(self, tenant_id: str, model_id: str, guard=None) -> dict[str, Any]:
        with self.db.read() as s:
            row = self._model_row(s, tenant_id, model_id)
        if not engine_class(row.algorithm).supports_retrain:
            raise Problem(409, "retrain-not-supported", f"{row.algorithm} keeps no data to retrain on; its forgets "
                          "never need a retrain (one its analysis cannot certify restarts the model exactly).")
        return self._create(tenant_id, model_id, "retrain", int(row.n_records) - int(row.n_forgotten), None, guard)

    def unlearn(self, tenant_id: str, model_id: str, ids: list[str], examples: list[tuple] | None = None,
                guard=None) -> dict[str, Any]:
        """The checks of ``Forgetting.unlearn`` before it computes, then the operation: commitments (and the
        features a client sent, for a family that needs them) in chunks of ``max_forget_batch``."""
        if len(set(ids)) != len(ids):
            raise Problem(422, "validation-error", "Each record id may appear only once in an unlearn request.")
        with self.db.read() as s:
            row = self._model_row(s, tenant_id, model_id)
            engine = None
            if row.status == "retrain_required":
                engine = self._checkout(s, row)
                if engine.supports_retrain:
                    raise spent_problem("retrain-required", model_id, engine,
                                        "The model can certify no further deletion")
            key = self._record_key(s, tenant_id)
            digests = self._commitments(key, ids)
            learned, probe = self.records.find(s.connection(), model_id, digests, version=row.version)
            missing = next((i for i in range(len(ids)) if i not in learned), None)
            if missing is not None:
                raise Problem(404, "record-not-found", f"Record {ids[missing]!r} was never learned by this model.")
            commits = [d.hex() for d in digests]
            forgotten = _forgotten(s, model_id, commits, probe.lookups.tolist())
            gone = next((i for i, c in enumerate(commits) if c in forgotten), None)
            if gone is not None:
                raise Problem(409, "record-already-forgotten", f"Record {ids[gone]!r} was already forgotten.",
                              receipt_id=forgotten[commits[gone]])
            # only now the engine (a checkout may replay the model's state log): a 404 or 409 above costs the
            # lookups of the ids, never a replay (issue 37, F5-G)
            engine = self._checkout(s, row) if engine is None else engine
        kept = None
        if engine.needs_retained_data:
            if examples:
                raise Problem(422, "examples-not-accepted", "This model keeps its data: send only the ids.")
        elif engine.needs_deletion_features:
            records = [_Rec(c, 0, learned[i].step, None if learned[i].example_mac is None else
                            learned[i].example_mac.hex(), learned[i].learned_at, learned[i])
                       for i, c in enumerate(commits)]
            Forgetting._client_examples(row, key, ids, records, examples, self.settings.max_request_memory)  # the same checks as the request's
            by_id = {e[0]: [e[1], e[2], e[3] if len(e) > 3 else None] for e in examples or ()}
            kept = [by_id[rid] for rid in ids]
        batch = int(engine.spec.hyperparameters.get("max_forget_batch") or self.settings.max_batch)
        chunks = [{"start": a, "digests": packed_digests(digests[a : a + batch]),
                   "examples": None if kept is None else kept[a : a + batch]} for a in range(0, len(ids), batch)]
        return self._create(tenant_id, model_id, "unlearn", len(ids), chunks, guard)

    def learn(self, tenant_id: str, model_id: str, ids: list[str], X: Any, y: Any, F: list | None = None,
              guard=None) -> dict[str, Any]:
        """The checks of ``Learning.learn`` before it computes, then the operation: commitments and the checked
        examples in chunks of ``max_learn_batch``."""
        check_distinct(ids)
        with self.db.read() as s:
            row = self._model_row(s, tenant_id, model_id)
            Xv, yv = self._learning._learn_rows(spec_from_json(row.spec_json), X, y, F)
            key = self._record_key(s, tenant_id)
            digests = self._commitments(key, ids)
            held, _ = self.records.find(s.connection(), model_id, digests, version=row.version)
            if held:
                raise Problem(409, "duplicate-record", f"Record id {ids[min(held)]!r} was already used in this model.")
            engine = self._checkout(s, row)
            self.quotas.check(s, tenant_id, {"records": len(ids), "bytes": len(ids) * self.core.record_bytes(engine)})
        left = engine.learn_capacity()
        if left is not None and len(ids) > left:
            raise Problem(409, "horizon-reached", f"The model was created for a horizon of {engine.step + left} "
                          f"examples and has learned {engine.step}: it can learn {left} more.")
        Xv, yv = np.asarray(Xv, dtype=np.float64), np.asarray(yv, dtype=np.float64)
        batch = int(engine.learn_batch_limit() or self.settings.max_batch)
        chunks = [{"start": a, "digests": packed_digests(digests[a : a + batch]), "X": Xv[a : a + batch],
                   "y": yv[a : a + batch]} for a in range(0, len(ids), batch)]
        return self._create(tenant_id, model_id, "learn", len(ids), chunks, guard)
