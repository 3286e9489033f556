"""SQL ``NodeStore`` for a tenant's Merkle log (app.receipts.merkle), bound to one transaction."""
from __future__ import annotations

from sqlalchemy import insert

from .tables import MerkleNode


class SqlNodeStore:
    """Reads go through a per-transaction buffer, so nodes put earlier in the same append are visible;
    ``flush()`` writes the new nodes in one statement."""

    def __init__(self, session, tenant_id: str):
        self.s, self.tenant_id = session, tenant_id
        self._new: dict[tuple[int, int], bytes] = {}

    def get(self, level: int, index: int) -> bytes | None:
        found = self.get_many([(level, index)])
        return found.get((level, index))

    def get_many(self, coords):
        out = {c: self._new[c] for c in coords if c in self._new}
        wanted = [c for c in coords if c not in out]
        p = "?" if self.s.bind.dialect.paramstyle == "qmark" else "%s"
        for i in range(0, len(wanted), 200):
            part = wanted[i : i + 200]
            # driver-level SQL: the ORM's tuple IN costs several times the primary-key lookups themselves
            cond = " OR ".join([f"(level = {p} AND idx = {p})"] * len(part))
            params = (self.tenant_id, *(int(v) for c in part for v in c))
            rows = self.s.connection().exec_driver_sql(
                f"SELECT level, idx, hash FROM {MerkleNode.__tablename__} WHERE tenant_id = {p} AND ({cond})", params)
            for level, idx, h in rows:
                out[(int(level), int(idx))] = bytes(h)
        return out

    def put(self, level: int, index: int, hash: bytes) -> None:
        self._new[(level, index)] = bytes(hash)

    def flush(self) -> None:
        if self._new:
            self.s.connection().execute(insert(MerkleNode.__table__), [{"tenant_id": self.tenant_id, "level": lv, "idx": ix, "hash": h}
                                                for (lv, ix), h in self._new.items()])
            self._new = {}
