"""Who is calling: the admin, or a tenant key with scopes."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    tenant_id: str | None  # None for the admin
    scopes: frozenset[str]
    key_id: str | None
    is_admin: bool = False
