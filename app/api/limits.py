"""Request body size limit: 413 problem before the body is parsed."""
from __future__ import annotations

import json

from fastapi import HTTPException

from .problems import MEDIA_TYPE, PROBLEM_BASE


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it instead of answering 400."""

    def __init__(self) -> None:
        super().__init__(status_code=413, detail="The request body is too large.")


class BodySizeLimit:
    """Pure ASGI middleware: rejects a declared Content-Length above the limit and stops streamed bodies at it."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > self.max_bytes:
                        return await self._reject(scope, send)
                except ValueError:
                    return await self._reject(scope, send, status=400)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(scope, send)

    async def _reject(self, scope, send, status: int = 413):
        slug, title = ("payload-too-large", "Request body too large") if status == 413 else ("bad-request", "Bad request")
        body = json.dumps({"type": PROBLEM_BASE + slug, "title": title, "status": status,
                           "detail": f"The request body exceeds {self.max_bytes} bytes." if status == 413
                           else "Invalid Content-Length.", "instance": scope.get("path")}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
