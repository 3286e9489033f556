"""The audit console: a read-only web page at /console, served from the static files in app/console/.

No build step: plain HTML, CSS and ES modules, plus a vendored charting library (app/console/vendor/). Every
response carries a strict Content-Security-Policy (this origin only, no inline script or style, no framing) and
the headers below. The console talks to the JSON API with the key its user pastes (kept in sessionStorage).
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, RedirectResponse
from starlette.exceptions import HTTPException
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "font-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
    "require-trusted-types-for 'script'",
    "trusted-types 'none'",
])

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
    "Cache-Control": "no-cache",  # revalidate: an upgraded service serves its own console at once
}


class _Route:
    path = "/console/{path}"  # the route label of the access log and metrics (instead of "unmatched")


class ConsoleFiles(StaticFiles):
    """The console's files, each answer (404 included) with the security headers."""

    async def __call__(self, scope: Scope, receive, send) -> None:
        scope["route"] = _Route
        await super().__call__(scope, receive, send)

    async def get_response(self, path: str, scope: Scope):
        try:
            response = await super().get_response(path, scope)
        except HTTPException as exc:
            response = PlainTextResponse("Not Found" if exc.status_code == 404 else exc.detail,
                                         status_code=exc.status_code)
        response.headers.update(SECURITY_HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Serve the console at /console/ (and redirect /console there); not part of the OpenAPI document."""

    @app.get("/console", include_in_schema=False)
    def console_root():
        return RedirectResponse("console/", status_code=308, headers=SECURITY_HEADERS)

    app.mount("/console/", ConsoleFiles(directory=CONSOLE_DIR, html=True), name="console")
