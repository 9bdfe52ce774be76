"""GET /metrics: every series in the Prometheus text format (rc.controller.metrics).

Any token role may scrape (user, worker or admin): the series name hosts and
carry the fleet's shape, so the route is not public.
"""

from __future__ import annotations

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from rc.controller.api import ctl

__all__ = ["metrics"]


async def metrics(request: Request) -> Response:
    """The exposition text, from one consistent store snapshot."""
    body = await ctl(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})
