"""Service errors.  Each names an RFC 9457 problem type (API.md) and the HTTP status it maps to."""
from __future__ import annotations

from typing import Any


class Problem(Exception):
    """Raise to answer with a problem document.  ``slug`` names the problem type."""

    def __init__(self, status: int, slug: str, detail: str | None = None, headers: dict[str, str] | None = None,
                 **extra: Any):
        super().__init__(detail or slug)
        self.status, self.slug, self.detail, self.extra = status, slug, detail, extra
        self.headers = headers  # response headers (e.g. Retry-After)
