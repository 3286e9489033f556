"""Public identifiers: a type prefix, a microsecond timestamp (so ids sort by creation) and 64 random bits."""
from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone


def new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns() // 1000:014x}{secrets.token_hex(8)}"


def id_pattern(prefix: str) -> str:
    """The regular expression every ``new_id(prefix)`` matches (a cursor made of an id is checked with it)."""
    return rf"^{prefix}_[0-9a-f]{{30}}$"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(dt: datetime) -> str:
    """RFC 3339 UTC with microseconds and a Z (receipts are canonical JSON: one spelling only)."""
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
