"""Certificate receipts: canonical JSON (RFC 8785), signed with Ed25519, numbered in the tenant's log."""
from __future__ import annotations

import base64
import json
from typing import Any, Sequence

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..db.merkle_store import SqlNodeStore
from ..db.tables import Checkpoint, Receipt, Tenant
from ..errors import Problem
from ..feature_map import map_summary
from ..ids import iso, new_id, utcnow
from ..receipts.canonical import parameters_sha256, signed_receipt_bytes
from ..receipts.checkpoint import make_checkpoint, receipt_proof, tenant_origin
from ..receipts.merkle import MerkleLog
from ..unlearning import Certificate, Unlearner
from ..unlearning.mechanism.release import MECHANISM, ROUNDING
from . import audit_usage
from .receipt_figures import receipt_figures


def guarantee_of(engine: Unlearner) -> dict[str, str]:
    """The guarantee as the engine instance states it (wording may depend on hyperparameters), and for a model with
    a public feature map what the map is and that nothing in it depends on data (app/feature_map.py)."""
    words = map_summary(getattr(engine.spec, "feature_map", None))
    return {"definition": engine.guarantee_definition,
            "statement": engine.guarantee_words if words is None else f"{engine.guarantee_words} {words}"}


def mechanism_fields(cert: Certificate) -> dict[str, Any]:
    """The receipt's ``mechanism``: type ("discrete_gaussian" or "exact"), sigma, sensitivity and rho, and for the
    discrete Gaussian the declared grid resolution g (published = g * integer before any projection) and the
    rounding of the secret state onto it (app/unlearning/mechanism/release.py).  A ``dp_from_start`` certificate (paid at
    creation) names the grid of the discrete Gaussian its releases used when it has one (sigma, sensitivity: the
    per-release figures)."""
    out: dict[str, Any] = {"type": cert.mechanism, "sigma": cert.sigma, "sensitivity": cert.sensitivity,
                           "rho": cert.rho}
    if cert.mechanism == MECHANISM or (cert.mechanism == "dp_from_start" and cert.details.get("grid", 0.0) > 0.0):
        out["grid"] = float(cert.details.get("grid", 0.0))
        out["rounding"] = ROUNDING
    if is_restart(cert):  # this forget discarded the whole learned state (exact); a new ledger epoch begins
        out["restart"] = True
    for name in SHARD_WORK:  # an exact forget that recomputed one shard: which, and the work done
        if name in cert.details:
            out[name] = int(cert.details[name])
    return out


SHARD_WORK = ("shard", "from_slice", "records_replayed")


def is_restart(cert: Certificate) -> bool:
    """An exact forget that discarded the whole state (000 Alg. 3): a new ledger epoch begins."""
    return bool(cert.details.get("restart"))


ERASURE = "model_erasure"  # receipts.kind and the receipt's "kind" member; certificate receipts have no "kind"
ERASURE_STATEMENT = ("The model was deleted: its secret state, published parameters, retained examples and "
                     "learned-record index were erased in the transaction that appended this receipt. Every "
                     "record it still held is forgotten exactly; it answers no further request.")

_TENANTS = Tenant.__table__
_ALLOCATE = (update(_TENANTS).where(_TENANTS.c.id == bindparam("tid"))
             .values(log_size=_TENANTS.c.log_size + bindparam("n")).returning(_TENANTS.c.log_size))


class ReceiptIssuer:
    def __init__(self, keyring):
        self.keyring = keyring

    def allocate(self, s, tenant_id: str, n: int) -> int:
        """Reserve n consecutive log indices (0-based) in the tenant's append-only log; returns the first.

        The UPDATE holds the tenant's log row until commit, so indices are gap-free and never reused.
        """
        # Core on the connection, built once: no ORM autoflush or session synchronisation
        new_size = s.connection().execute(_ALLOCATE, {"tid": tenant_id, "n": n}).scalar_one()
        return new_size - n

    def issue(self, s, row, engine: Unlearner, records: Sequence, certs: Sequence[Certificate], now) -> list[dict]:
        spec = json.loads(row.spec_json)
        delta = spec["delta"]
        ledger = engine.ledger()
        theta = engine.published()
        params_hash = parameters_sha256(theta[:-1], float(theta[-1]))
        version = row.version + 1  # the version this write commits
        first = self.allocate(s, row.tenant_id, len(certs))
        guarantee = guarantee_of(engine)
        epoch = row.epoch
        figures = receipt_figures(row, engine, certs, ledger, delta)  # as the ledger states them (item 7)
        signer = self.keyring.active
        store = SqlNodeStore(s, row.tenant_id)
        log = MerkleLog(store)
        out, rows = [], []
        counts = engine.publishes_counts(engine.spec)  # else steps and deletion indices are withheld (null)
        audit = 0  # the bytes these forgets leave for audit (audit_usage.py), nodes added after the flush
        entries = 1 + (engine.creation_charge() is not None)  # ledger entries of a restart (its new creation charge)
        for j, (rec, cert) in enumerate(zip(records, certs)):
            if is_restart(cert):
                epoch += 1
            stated, after = figures[j]
            body: dict[str, Any] = {
                "id": new_id("rcp"), "tenant_id": row.tenant_id, "model_id": row.id,
                "record_commitment": rec.commitment, "learned_step": cert.learned_step if counts else None,
                "forgotten_step": cert.forgotten_step if counts else None,
                "deletion_index": cert.deletion_index if counts else None, "epoch": epoch,
                "algorithm": row.algorithm,
                "mechanism": mechanism_fields(cert),
                "guarantee": {"definition": guarantee["definition"], "alpha": None, **stated,
                              "statement": guarantee["statement"]},
                "ledger_after": after,
                "published_parameters_sha256": params_hash, "model_version": version, "issued_at": iso(now),
                "log_index": first + j, "key_id": signer.key_id,
            }
            # the signature covers the body; the leaf is the signed body (a receipt has no proof when issued)
            body["signature"], leaf = signed_receipt_bytes(body, signer.sign)
            log.append(leaf, first + j)  # RFC 6962 leaf: the signed receipt
            audit += audit_usage.forget_bytes(leaf, 0, entries if is_restart(cert) else 1)
            out.append(body)
            rows.append({"id": body["id"], "tenant_id": row.tenant_id, "model_id": row.id,
                         "log_index": first + j, "record_commitment": rec.commitment,
                         "body": leaf, "issued_at": now})
        audit += store.flush() * audit_usage.NODE_ROW
        s.connection().execute(insert(Receipt.__table__), rows)
        audit_usage.add(s, row.tenant_id, audit)
        return out

    def issue_erasure(self, s, row, n_erased: int, records_sha256: str, now) -> dict[str, Any]:
        """The one signed receipt of a model's deletion, appended to the tenant's log in the caller's transaction.

        An exact forget of every record the model still held (rho = 0: nothing of them remains to be bounded);
        ``records`` names how many and ``erased_records_sha256`` over their commitments (app/receipts/canonical.py).
        Records forgotten before (``records_forgotten_before``) have their own certificate receipts."""
        index = self.allocate(s, row.tenant_id, 1)
        signer = self.keyring.active
        body: dict[str, Any] = {
            "id": new_id("rcp"), "kind": ERASURE, "tenant_id": row.tenant_id, "model_id": row.id,
            "algorithm": row.algorithm,
            "mechanism": {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0},
            "guarantee": {"definition": "exact", "epsilon": 0.0, "delta": 0.0, "statement": ERASURE_STATEMENT},
            "records": {"erased": int(n_erased), "commitments_sha256": records_sha256},
            "records_learned": int(row.n_records), "records_forgotten_before": int(row.n_forgotten),
            "model_version": int(row.version) + 1, "issued_at": iso(now), "log_index": index,
            "key_id": signer.key_id,
        }
        body["signature"], leaf = signed_receipt_bytes(body, signer.sign)
        store = SqlNodeStore(s, row.tenant_id)
        MerkleLog(store).append(leaf, index)
        audit_usage.add(s, row.tenant_id, audit_usage.erasure_bytes(leaf, store.flush(), n_erased, row))
        s.connection().execute(insert(Receipt.__table__), [{
            "id": body["id"], "tenant_id": row.tenant_id, "model_id": row.id, "log_index": index,
            "record_commitment": records_sha256, "body": leaf, "issued_at": now, "kind": ERASURE}])
        return body

    # ---- the tenant's log ---------------------------------------------------------------------------------
    @staticmethod
    def log_size(s, tenant_id: str) -> int:
        return int(s.execute(select(Tenant.log_size).where(Tenant.id == tenant_id)).scalar_one())

    def checkpoint(self, s, tenant_id: str, size: int | None = None) -> dict[str, Any]:
        """The signed checkpoint at ``size`` (default: the current size); signed once per size and kept."""
        size = self.log_size(s, tenant_id) if size is None else size
        row = s.get(Checkpoint, (tenant_id, size))
        if row is not None:
            return json.loads(row.body)
        root = MerkleLog(SqlNodeStore(s, tenant_id)).root(size)
        cp = make_checkpoint(tenant_origin(tenant_id), size, root, iso(utcnow()), self.keyring)
        # concurrent readers may sign the same size at once: keep whichever was stored first
        body = json.dumps(cp)
        stmt = (pg_insert if s.bind.dialect.name == "postgresql" else sqlite_insert)(Checkpoint).values(
            tenant_id=tenant_id, tree_size=size, body=body, created_at=utcnow()).on_conflict_do_nothing()
        if s.execute(stmt).rowcount == 1:  # signed here: kept for audit like the receipts (audit_usage.py)
            audit_usage.add(s, tenant_id, audit_usage.checkpoint_bytes(body))
        stored = s.get(Checkpoint, (tenant_id, size), populate_existing=True)
        return json.loads(stored.body) if stored is not None else cp

    def proof(self, s, tenant_id: str, log_index: int) -> dict[str, Any]:
        return self.proof_at(s, tenant_id, log_index, self.checkpoint(s, tenant_id))

    @staticmethod
    def proof_at(s, tenant_id: str, log_index: int, cp: dict[str, Any]) -> dict[str, Any]:
        return receipt_proof(MerkleLog(SqlNodeStore(s, tenant_id)), log_index, cp)

    def consistency(self, s, tenant_id: str, from_size: int, to_size: int | None) -> dict[str, Any]:
        size = self.log_size(s, tenant_id)
        need = f"Need 1 <= from_size <= to_size <= {size} (the log size)."
        if from_size < 1 or (to_size is not None and from_size > to_size):  # the request's own shape
            raise Problem(422, "validation-error", need)
        to_size = size if to_size is None else to_size
        if from_size > size or to_size > size:  # the tenant's log is shorter: its state, not the request's shape
            raise Problem(422, "log-size-exceeded", need, log_size=size)
        hashes = MerkleLog(SqlNodeStore(s, tenant_id)).consistency_proof(from_size, to_size)
        return {"from_size": from_size, "to_size": to_size, "hashes": [base64.b64encode(h).decode() for h in hashes],
                "from_checkpoint": self.checkpoint(s, tenant_id, from_size),
                "to_checkpoint": self.checkpoint(s, tenant_id, to_size)}
