"""Audit queries: the ledger, the deletion log, receipts, checkpoints and consistency proofs of the
tenant's transparency log, export bundles and a record's status.

A service of its own over the shared ``ModelCore`` (app/services/model_core.py); the route modules call it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import select

from ..db.merkle_store import SqlNodeStore
from ..db.tables import LedgerEntry, Model, Receipt, Record
from ..errors import Problem
from ..receipts.checkpoint import proof_member
from ..receipts.merkle import MerkleLog
from .ledger import ledger_view
from .receipts import ERASURE
from .records import commitment, commitment_digests, lookup_key
from .model_core import (ERASED, UseCase)


EXPORT_PAGE = 500  # receipts per export page when the request names no limit (GET /v1/audit/export)
EXPORT_MAX_PAGE = 5000
EXPORT_CURSOR = r"^([0-9]{1,18})\.([0-9]{1,18})$"
_EXPORT_CURSOR = re.compile(EXPORT_CURSOR)


def _parse_export_cursor(cursor: str | None) -> tuple[int | None, int]:
    """(tree size the bundle is pinned to, first log index of the page) of an export cursor "<size>.<index>"."""
    if not cursor:
        return None, 0
    m = _EXPORT_CURSOR.fullmatch(cursor)
    if m is None:
        raise Problem(422, "validation-error", "cursor must be a value returned as next_cursor.")
    return int(m[1]), int(m[2])


class AuditQueries(UseCase):
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

    def export(self, tenant_id: str, record_id: str | None, model_id: str | None, cursor: str | None = None,
               limit: int = EXPORT_PAGE) -> dict[str, Any]:
        """One page of an offline-verifiable bundle: at most ``limit`` receipts in log order, each with its inclusion
        proof against one signed checkpoint, the public keys, and ``next_cursor`` (None on the last page).

        The first page (no ``cursor``) pins the checkpoint of the log's current size; its cursor carries that size,
        so every later page proves against the same checkpoint and the pages together are the bundle of the log at
        that size (receipts appended since are not in it).  A page reads its receipts with one range scan of an
        index ((model_id, log_index), or the record's commitment) and their proofs' nodes in one batch: its cost is
        linear in what it returns, whatever the log's size (issue 37, F5-H).  The erasure receipts of deleted models
        (of this model, or that erased this record), each with its proof and, in a model's bundle, the sorted
        commitments of the records it erased, come with the first page."""
        if (record_id is None) == (model_id is None):
            raise Problem(422, "validation-error", "Give exactly one of record_id or model_id.")
        size, start = _parse_export_cursor(cursor)
        with self.db.write() as s:  # the first page may sign the checkpoint of the current size
            q = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind != ERASURE)
            if record_id is not None:
                c = commitment(self._record_key(s, tenant_id), record_id)
                q = q.where(Receipt.record_commitment == c)
            else:
                self._row(s, tenant_id, model_id, include_deleted=True)
                q = q.where(Receipt.model_id == model_id)
            if size is None:
                cp = self.issuer.checkpoint(s, tenant_id)
                size = int(cp["tree_size"])
            else:  # the checkpoint the first page pinned (signed then; any size of the log can be signed, as
                # consistency proofs do: once per size, counted in the audit trail)
                log_size = self.issuer.log_size(s, tenant_id)
                if size > log_size:
                    raise Problem(422, "log-size-exceeded", f"The cursor names log size {size}; the tenant's log "
                                  f"has {log_size} receipts.", log_size=log_size)
                cp = self.issuer.checkpoint(s, tenant_id, size)
            rows = list(s.scalars(q.where(Receipt.log_index >= start, Receipt.log_index < size)
                                  .order_by(Receipt.log_index).limit(limit + 1)))
            more = len(rows) > limit
            rows = rows[:limit]
            erasures = self._erasures(s, tenant_id, record_id, model_id, size, cp) if cursor is None else []
            if cursor is None and record_id is not None and not rows and not erasures:
                raise Problem(404, "record-not-found", "No receipt of this tenant concerns this record.")
            log = MerkleLog(SqlNodeStore(s, tenant_id))
            receipts = []
            for r, path in zip(rows, log.inclusion_proofs([r.log_index for r in rows], size)):
                body = json.loads(r.body)
                body["proof"] = proof_member(r.log_index, path, cp)
                receipts.append(body)
        return {"receipts": receipts, "erasures": erasures, "checkpoint": cp,
                "public_keys": self.issuer.keyring.public_keys(),
                "next_cursor": f"{size}.{rows[-1].log_index + 1}" if more else None}

    def _erasures(self, s, tenant_id: str, record_id: str | None, model_id: str | None, size: int,
                  cp: dict[str, Any]) -> list[dict[str, Any]]:
        """The erasure receipts of a bundle's first page, with their proofs (and a model's erased commitments)."""
        if record_id is not None:
            c = commitment(self._record_key(s, tenant_id), record_id)
            erased = list(s.scalars(select(Record.receipt_id).where(
                Record.lookup == lookup_key(c), Record.tenant_id == tenant_id, Record.commitment == c,
                Record.status == ERASED)))
            eq = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind == ERASURE,
                                       Receipt.id.in_(erased or [""]))
        else:
            eq = select(Receipt).where(Receipt.tenant_id == tenant_id, Receipt.kind == ERASURE,
                                       Receipt.model_id == model_id)
        rows = list(s.scalars(eq.where(Receipt.log_index < size).order_by(Receipt.log_index)))
        log = MerkleLog(SqlNodeStore(s, tenant_id))
        out = []
        for r, path in zip(rows, log.inclusion_proofs([r.log_index for r in rows], size)):
            body = json.loads(r.body)
            body["proof"] = proof_member(r.log_index, path, cp)
            commits = None
            if model_id is not None:
                commits = sorted(s.scalars(select(Record.commitment).where(
                    Record.model_id == r.model_id, Record.receipt_id == r.id, Record.status == ERASED)))
            out.append({"receipt": body, "commitments": commits})
        return out

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
