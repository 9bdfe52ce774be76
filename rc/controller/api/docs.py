"""GET /openapi.json: the API described (rc.controller.openapi), from the
route table the app was built with (`app.state.routes`)."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rc.controller import openapi

__all__ = ["openapi_json"]


async def openapi_json(request: Request) -> Response:
    """The OpenAPI document (public: it holds no secret), built once per app."""
    state = request.app.state
    body = getattr(state, "openapi_json", None)
    if body is None:
        body = state.openapi_json = orjson.dumps(openapi.document(state.routes))
    return Response(body, media_type="application/json")
