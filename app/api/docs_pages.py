"""The API's documentation pages and the front page, with nothing loaded from elsewhere (issue 40).

``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) render ``/openapi.json`` with the assets the ``fastapi-offline``
package ships (Swagger UI 5, ReDoc standalone, a favicon), served here under ``/docs-assets/``: FastAPI's own pages
load them from a CDN (and ReDoc its fonts from Google), so they were blank offline or behind a strict egress policy.
``/`` names the audit console, the API documentation and the health endpoints.  None of these is in the OpenAPI
document."""
from __future__ import annotations

import html
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
# what the pages may load: this origin only (Swagger UI's page starts it with an inline script; both style inline;
# ReDoc's search runs in a blob: worker).  ReDoc's menu shows a logo from its vendor's CDN: refused here, so the
# browser never asks for it (the image hides itself)
DOCS_POLICY = "; ".join([
    "default-src 'self'", "script-src 'self' 'unsafe-inline'", "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:", "font-src 'self' data:", "connect-src 'self'", "worker-src 'self' blob:",
    "frame-ancestors 'none'", "base-uri 'none'", "form-action 'none'",
])
DOCS_HEADERS = {**HEADERS, "Content-Security-Policy": DOCS_POLICY}


class _Route:
    path = ASSETS + "/{path}"  # the route label of the access log and metrics (instead of "unmatched")


class _Assets(StaticFiles):
    async def __call__(self, scope, receive, send) -> None:
        scope["route"] = _Route
        await super().__call__(scope, receive, send)


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


LINKS = (
    ("/console/", "Audit console", "sign in with an API key that has the audit scope: models, privacy ledgers, "
                                    "deletion logs and receipts, verified in the browser"),
    ("/docs", "API documentation (Swagger UI)", "every operation, tried from the browser"),
    ("/redoc", "API documentation (ReDoc)", "the same document, for reading"),
    ("/openapi.json", "OpenAPI document", "the contract, for SDK generators"),
    ("/v1/algorithms", "Model families", "each family's guarantee, losses and hyperparameters (JSON Schema)"),
    ("/healthz", "Liveness", "the process answers"),
    ("/readyz", "Readiness", "database, schema, signing key and compiled kernels"),
    ("/metrics", "Metrics", "Prometheus"),
)


def _front_page(title: str, version: str) -> str:
    items = "\n".join(f'<li><a href="{href}">{html.escape(name)}</a> <code>{href}</code>: {html.escape(what)}</li>'
                      for href, name, what in LINKS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="{ASSETS}/favicon.png"></head>
<body style="font-family: system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; line-height: 1.5">
<h1>{html.escape(title)} <small style="color:#666">{html.escape(version)}</small></h1>
<p>A multi-tenant REST service for streaming models that can forget: every forget is answered with a signed
certificate receipt.</p>
<ul>
{items}
</ul>
</body></html>
"""


def install(app: FastAPI) -> None:
    """Serve /docs, /redoc and / from the packaged assets (the app is created with docs_url and redoc_url None)."""
    app.mount(ASSETS, _Assets(directory=assets_dir()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2 = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=f"{root}{oauth2}",
                                   swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None})  # no online validator badge
        page.headers.update(DOCS_HEADERS)
        return page

    @app.get(oauth2, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{ASSETS}/favicon.png", with_google_fonts=False)
        page.headers.update(DOCS_HEADERS)
        return page

    @app.get("/", include_in_schema=False)
    async def front(request: Request):
        """HTML for a browser; the same links as JSON for a client that asks for JSON."""
        if "application/json" in request.headers.get("accept", "") and "text/html" not in request.headers.get(
                "accept", ""):
            return JSONResponse({"name": app.title, "version": app.version,
                                 "links": [{"href": h, "title": n, "description": w} for h, n, w in LINKS]})
        return HTMLResponse(_front_page(app.title, app.version), headers=HEADERS)
