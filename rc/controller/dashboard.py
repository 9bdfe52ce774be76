"""GET /: the dashboard, one self-contained page (README "Dashboard and metrics").

The page is assembled once per process from rc/controller/static/:
dashboard.html with dashboard.css and dashboard.js inlined where it says
`/*@css*/` and `/*@js*/`, and the script's words for every state, reason and
event kind (rc.controller.wording, built from the rc.proto enums) put where
it says `/*@words*/null`. The response needs nothing else: no external
request of any kind, no build step, works offline.

The Content-Security-Policy admits exactly those two inline blocks (by their
sha256), connections to this origin and `data:` images (the empty favicon),
nothing else, so even a bug that inserted a user's string as markup could not
run a script or fetch an image. The page holds no data and needs no token;
it asks for one and keeps it in the tab's sessionStorage (`rc_token`) only,
or takes a one-time code from its address (`#code=`, from `rc dashboard`),
removes it from the address bar and spends it for a session token
(rc.controller.signin).
Every user-supplied string is inserted as text (the script has no innerHTML).

What the page shows and where each part comes from is in README.md,
"Dashboard and metrics".
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.resources
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rc.controller import wording

__all__ = ["Page", "dashboard", "page", "words_json"]

STATIC = "rc.controller.static"
CSS_MARK = "/*@css*/"
JS_MARK = "/*@js*/"
WORDS_MARK = "/*@words*/null"


@dataclass(frozen=True, slots=True)
class Page:
    """The assembled page and the security headers that go with it."""

    html: bytes
    headers: dict[str, str]


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@functools.cache
def page() -> Page:
    """Read and assemble the page (once). Raises ValueError if the static files
    are malformed (a marker missing, or a block that would end its own tag)."""
    files = importlib.resources.files(STATIC)
    html = files.joinpath("dashboard.html").read_text(encoding="utf-8")
    css = files.joinpath("dashboard.css").read_text(encoding="utf-8")
    js = files.joinpath("dashboard.js").read_text(encoding="utf-8")
    if js.count(WORDS_MARK) != 1:
        raise ValueError(f"dashboard.js must contain {WORDS_MARK} exactly once")
    js = js.replace(WORDS_MARK, words_json())
    for mark, block, tag in ((CSS_MARK, css, "</style"), (JS_MARK, js, "</script")):
        if html.count(mark) != 1:
            raise ValueError(f"dashboard.html must contain {mark} exactly once")
        if tag in block.lower():
            raise ValueError(f"an inlined block contains {tag}>")
    html = html.replace(CSS_MARK, css).replace(JS_MARK, js)
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src {_sha256(js)}",
            f"style-src {_sha256(css)}",
            "img-src data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return Page(
        html.encode(),
        {
            "Content-Security-Policy": csp,
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
        },
    )


def words_json() -> str:
    """rc.controller.wording.vocabulary() as a JavaScript literal (JSON with
    every "<" escaped, so no string in it can end or open a tag)."""
    return orjson.dumps(wording.vocabulary()).decode().replace("<", "\\u003c")


async def dashboard(request: Request) -> Response:
    """GET /: the dashboard page (no token needed: it holds no data)."""
    p = page()
    return Response(p.html, media_type="text/html", headers=p.headers)
