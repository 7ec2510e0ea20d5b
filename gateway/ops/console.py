"""The operator console at /console/: one page on the admin API, served from the package.

The page holds no data of its own and changes nothing itself: it reads and acts only through
/admin, with the admin token the operator signs in with (kept in the browser tab's session
storage, sent as a bearer header). Every asset ships in gateway/ops/console/, so nothing loads
from another origin, which the Content-Security-Policy below also forbids.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from fastapi import FastAPI, Response
from fastapi.responses import RedirectResponse

from gateway.compare.measures import SHOWN
from gateway.errors import AdminDisabled, NotFound
from gateway.ops.parts import OpsParts

ASSETS = Path(__file__).resolve().parent / "console"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
}
# Only this origin, no inline script or style, no frames, no forms posting elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def install(app: FastAPI, gateway: OpsParts) -> None:
    """Serve the console's files, read once, while the admin API is enabled."""
    files = {
        p.name: (p.read_bytes(), TYPES[p.suffix]) for p in ASSETS.iterdir() if p.suffix in TYPES
    }
    # The measures shown over many pairs, as Diff declares them: the shadow view lists these.
    shown = [
        {"key": shown.key(name), "label": shown.label, "rate": shown.rate} for name, shown in SHOWN
    ]
    files["measures.json"] = (orjson.dumps(shown), TYPES[".json"])

    @app.get("/console", include_in_schema=False)
    async def console_root() -> Response:
        return RedirectResponse("/console/")

    @app.get("/console/{name:path}", include_in_schema=False)
    async def console_file(name: str) -> Response:
        if gateway.settings.admin_token is None:
            raise AdminDisabled("the console needs the admin API: set GATEWAY_ADMIN_TOKEN")
        found = files.get(name or "index.html")
        if found is None:
            raise NotFound(f"no console file {name!r}")
        content, media_type = found
        return Response(content, media_type=media_type, headers=HEADERS)
