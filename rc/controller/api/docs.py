"""GET /openapi.json: the API described (rc.controller.openapi)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rc.controller import openapi

__all__ = ["routes"]

_CACHED: bytes | None = None


async def openapi_json(request: Request) -> Response:
    """The OpenAPI document (public: it holds no secret)."""
    global _CACHED
    if _CACHED is None:
        _CACHED = orjson.dumps(openapi.document())
    return Response(_CACHED, media_type="application/json")


routes = [Route("/openapi.json", openapi_json, methods=["GET"])]
