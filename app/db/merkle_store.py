"""SQL ``NodeStore`` for a tenant's Merkle log (app.receipts.merkle), bound to one transaction.

Every read is a batch of point look-ups on the primary key (tenant_id, level, idx), so a proof of a log of n
receipts reads its O(log n) nodes in O(log n) index searches, whatever n (issue 37, F5-H).  The batch was one
``tenant_id = ? AND ((level = ? AND idx = ?) OR ...)``: with more than a few terms SQLite's planner took the
tenant prefix of the key and scanned every node of the tenant, so each proof cost O(n) and an export of a model's
n receipts O(n^2) (70 s for 10 000).  Now the wanted coordinates are a list the query joins against, outermost:
SQLite ``WITH w(level, idx) AS (VALUES ...) ... FROM w CROSS JOIN merkle_nodes`` (CROSS JOIN fixes the loop order),
PostgreSQL ``JOIN unnest(levels, indices)`` with two array parameters (one statement text whatever the batch)."""
from __future__ import annotations

from sqlalchemy import insert

from .tables import MerkleNode

_T = MerkleNode.__tablename__
CHUNK = 300  # coordinates per SQLite statement (2 parameters each, under SQLite's historical limit of 999)
_PG = (f"SELECT m.level, m.idx, m.hash FROM unnest(%s::int[], %s::bigint[]) AS w(level, idx) "
       f"JOIN {_T} m ON m.tenant_id = %s AND m.level = w.level AND m.idx = w.idx")


def _sqlite_sql(n: int) -> str:
    values = ",".join(["(?,?)"] * n)
    return (f"WITH w(level, idx) AS (VALUES {values}) SELECT m.level, m.idx, m.hash FROM w CROSS JOIN {_T} m "
            "ON m.tenant_id = ? AND m.level = w.level AND m.idx = w.idx")


class SqlNodeStore:
    """Reads go through a per-transaction buffer, so nodes put earlier in the same append are visible;
    ``flush()`` writes the new nodes in one statement.  ``reads`` counts the nodes asked of the database."""

    def __init__(self, session, tenant_id: str):
        self.s, self.tenant_id = session, tenant_id
        self._new: dict[tuple[int, int], bytes] = {}
        self.reads = 0

    def get(self, level: int, index: int) -> bytes | None:
        found = self.get_many([(level, index)])
        return found.get((level, index))

    def get_many(self, coords):
        out = {c: self._new[c] for c in coords if c in self._new}
        wanted = list(dict.fromkeys(c for c in coords if c not in out))
        self.reads += len(wanted)
        conn = self.s.connection()
        postgres = conn.dialect.name == "postgresql"
        for i in range(0, len(wanted), CHUNK):
            part = wanted[i: i + CHUNK]
            if postgres:
                rows = conn.exec_driver_sql(_PG, ([int(lv) for lv, _ in part], [int(ix) for _, ix in part],
                                                  self.tenant_id))
            else:
                params = (*(int(v) for c in part for v in c), self.tenant_id)
                rows = conn.exec_driver_sql(_sqlite_sql(len(part)), params)
            for level, idx, h in rows:
                out[(int(level), int(idx))] = bytes(h)
        return out

    def put(self, level: int, index: int, hash: bytes) -> None:
        self._new[(level, index)] = bytes(hash)

    def flush(self) -> int:
        """Write the new nodes; how many."""
        n = len(self._new)
        if self._new:
            self.s.connection().execute(insert(MerkleNode.__table__), [
                {"tenant_id": self.tenant_id, "level": lv, "idx": ix, "hash": h} for (lv, ix), h in self._new.items()])
            self._new = {}
        return n
