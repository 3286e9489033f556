"""What a tenant's audit trail occupies (issue 37, F5-A): the bytes its forgets, model deletions and checkpoints
leave for audit, which no forget may refuse to write and nothing ever removes.

Per certificate receipt (one per forgotten record): the signed receipt (its canonical JSON and the row around it),
the RFC 6962 nodes its append wrote (1 + the trailing one bits of the old log size: 2 on average), the forgotten
record's ``records`` row (commitment, step, receipt id) and its ledger entry.  Per model deletion: the erasure
receipt and its nodes, one ``records`` row per record the model still held (status ``erased``), its ledger entry, and
the deleted model's own row, which stays for audit (spec, ledger, constants, guarantee).  Per signed checkpoint
(one per log size read through the audit routes): its JSON and row.  Each row is counted by the byte lengths of
its values (8 per number or time, the characters of each text): like the bytes quota, an estimate without the
database's page and index overhead.

The sum is kept on the tenant row (``tenants.usage_audit_bytes``), added in the transaction that writes the audit
rows: a forget's and a deletion's already hold the tenant's row for the log index (receipts.py ``allocate``), so
counting costs one more UPDATE of a row the transaction has locked.  The quota ``audit_bytes``
(app/services/quotas.py) refuses learns and model creations once it is spent; forgets and deletions are never
refused, so the trail can pass it by what the records held at that moment leave when forgotten or erased.
"""
from __future__ import annotations

from sqlalchemy import bindparam, update

from ..db.tables import Tenant

ID = 40          # an id column (tenant, model, receipt), as the schema sizes it
TIME = NUMBER = 8
HASH_HEX = 64
# receipts row around its body: id, tenant, model, log index, commitment, kind, issued_at
RECEIPT_ROW = 3 * ID + NUMBER + HASH_HEX + 16 + TIME
NODE_ROW = ID + 4 + NUMBER + 32        # merkle_nodes: tenant, level, idx, hash
RECORD_ROW = 2 * ID + HASH_HEX + 2 * NUMBER + 12 + 2 * TIME + ID  # records: tenant, model, commitment, lookup, step,
# status, learned_at, forgotten_at, receipt id
LEDGER_ROW = NUMBER + ID + 4 + ID + 20 + 3 * NUMBER + TIME  # ledger_entries: id, model, epoch, receipt, kind, step,
# sigma, rho, created_at
CHECKPOINT_ROW = ID + NUMBER + TIME   # checkpoints: tenant, tree size, created_at (plus the body)
MODEL_ROW = 3 * ID + 40 + 20 + 6 * NUMBER + 4 + 5 * TIME  # models: the fixed columns of a deleted model's row

_T = Tenant.__table__
_ADD = update(_T).where(_T.c.id == bindparam("tid")).values(
    usage_audit_bytes=_T.c.usage_audit_bytes + bindparam("n"))


def receipt_bytes(leaf: bytes, nodes: int) -> int:
    """A receipt's row and body and the Merkle nodes its append wrote."""
    return RECEIPT_ROW + len(leaf) + nodes * NODE_ROW


def forget_bytes(leaf: bytes, nodes: int, ledger_entries: int = 1) -> int:
    """One forgotten record's audit trail: its receipt, nodes, ``records`` row and ledger entries."""
    return receipt_bytes(leaf, nodes) + RECORD_ROW + ledger_entries * LEDGER_ROW


def model_row_bytes(row) -> int:
    """A deleted model's row, kept for audit (its secret state and published parameters are erased)."""
    return MODEL_ROW + sum(len(getattr(row, c) or "") for c in ("name", "spec_json", "ledger_json", "constants_json",
                                                               "guarantee_json", "algorithm", "status"))


def erasure_bytes(leaf: bytes, nodes: int, n_erased: int, row) -> int:
    """A model deletion's audit trail: the erasure receipt, a ``records`` row per record erased, a ledger entry and
    the model's own row."""
    return receipt_bytes(leaf, nodes) + n_erased * RECORD_ROW + LEDGER_ROW + model_row_bytes(row)


def checkpoint_bytes(body: str) -> int:
    return CHECKPOINT_ROW + len(body)


def add(s, tenant_id: str, n: int) -> None:
    """Add ``n`` bytes to the tenant's audit usage in the caller's transaction (a rollback takes them back)."""
    if n:
        s.connection().execute(_ADD, {"tid": tenant_id, "n": int(n)})
