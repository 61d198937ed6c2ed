"""The web page: ``GET /`` (``api/ui/index.html``) and its two assets, ``GET /ui/app.js`` and ``GET /ui/app.css``.

Plain files, no build step, read once per process. The page holds no data, so it needs no API key even when the api
has keys: the script sends the key the user typed (kept in the browser's localStorage) with each call it makes to the
native API, and the page says whether the api has keys (``data-api-keys`` on ``<html>``) so the key field shows only
then. The assets are referenced as ``?v=<hash of their contents>``: such a URL is cached for good (a new version is
a new URL), any other revalidates; the page itself is always revalidated.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import HTMLResponse

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
ASSET_TYPES = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
FOREVER = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' blob: data: http: https:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
"""Only the page's own script and style run; images may come from a result store's presigned URLs elsewhere."""

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True, slots=True)
class UiFiles:
    """The page template and its assets, with the version their URLs carry."""

    page: str
    assets: dict[str, bytes]
    version: str

    def render(self, api_keys: bool) -> str:
        return self.page.replace("{{version}}", self.version).replace("{{api_keys}}", "on" if api_keys else "off")


@cache
def ui_files(folder: Path = UI_DIR) -> UiFiles:
    """The files of ``folder``, read once."""
    assets = {name: (folder / name).read_bytes() for name in ASSET_TYPES}
    digest = hashlib.sha256()
    for name in sorted(assets):
        digest.update(assets[name])
    return UiFiles((folder / "index.html").read_text(encoding="utf-8"), assets, digest.hexdigest()[:12])


@router.get("/", response_class=HTMLResponse)
async def page(request: Request) -> HTMLResponse:
    """The web page: submit requests, watch them run, see their images, abort them; the fleet panel."""
    html = ui_files().render(api_keys=request.app.state.api_keys is not None)
    headers = {"Cache-Control": REVALIDATE, "Content-Security-Policy": CONTENT_SECURITY_POLICY}
    return HTMLResponse(html, headers=headers)


@router.get("/ui/{name}")
async def asset(name: str, v: str = "") -> Response:
    """``app.js`` or ``app.css``; 404 for anything else."""
    files = ui_files()
    if name not in ASSET_TYPES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no asset {name!r}")
    cache_control = FOREVER if v == files.version else REVALIDATE
    return Response(files.assets[name], media_type=ASSET_TYPES[name], headers={"Cache-Control": cache_control})
