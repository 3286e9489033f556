"""415 for a request body whose Content-Type the route does not read (issue 40): a body sent without a content type,
or as text/plain or a form, was answered 422 "Input should be a valid dictionary".  Pure ASGI middleware, before
anything reads the body: a POST, PUT or PATCH with a body must say application/json (or a +json type); a learn may
also say one of the MessagePack types (app/api/learn_body.py).  The answer names the accepted types."""
from __future__ import annotations

import json
import re

from .learn_body import MSGPACK_TYPES
from .problems import MEDIA_TYPE, PROBLEM_BASE

JSON_TYPES = ("application/json",)
_LEARN = re.compile(r"^/v1/models/[^/]+/learn/?$")


def accepted_types(path: str) -> tuple[str, ...]:
    return JSON_TYPES + MSGPACK_TYPES if _LEARN.match(path) else JSON_TYPES


def _is_accepted(content_type: str, accepted: tuple[str, ...]) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in accepted or (media.startswith("application/") and media.endswith("+json"))


class RequireMediaType:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        content_type, has_body = None, False
        for name, value in scope.get("headers", ()):
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                has_body = value.strip() not in (b"0", b"")
            elif name == b"transfer-encoding":
                has_body = True
        if not has_body:
            return await self.app(scope, receive, send)
        accepted = accepted_types(scope.get("path", ""))
        if content_type is not None and _is_accepted(content_type, accepted):
            return await self.app(scope, receive, send)
        sent = "no Content-Type header" if content_type is None else f"Content-Type {content_type.strip()!r}"
        detail = (f"The request body was sent with {sent}; this operation reads {' or '.join(accepted)} "
                  f"(send the header Content-Type: application/json).")
        body = json.dumps({"type": PROBLEM_BASE + "unsupported-media-type", "title": "Unsupported media type",
                           "status": 415, "detail": detail, "accepted": list(accepted),
                           "instance": scope.get("path")}).encode()
        await send({"type": "http.response.start", "status": 415,
                    "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode()),
                                (b"accept-post", ", ".join(accepted).encode())]})
        await send({"type": "http.response.body", "body": body})
