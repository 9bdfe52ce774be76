"""GET /v1/events/stream: live updates as Server-Sent Events.

The dashboard's live channel; anything that speaks SSE can use it. Frames:

    retry: 3000                                  reconnect delay for EventSource
    event: hello     data: {"instance", "after", "keepalive_seconds"}
    event: change    data: {"keys": ["devices", "jobs"], "at": <controller time>}
    id: <event id>
    event: feed      data: <an Event of the activity feed, as GET /v1/events>
    : keepalive                                  a comment every KEEPALIVE_S when idle

A `change` frame is a nudge: what changed ("devices", "jobs"), never the data;
the reader fetches GET /v1/state. `feed` frames carry every new row of the
events table in order, each with its id, so a reconnecting EventSource
(`Last-Event-ID`) or `?after=ID` resumes without gaps; without either the
stream starts after the newest row (no replay).

Auth: a user (or admin) token in the Authorization header or, because
EventSource cannot send headers, in `?token=` (the only route that accepts
one). The query string is never logged: the HTTP server's
access log is off and our own logs name the path only.

It never holds up scheduling: the Hub listener that learns about commits only
adds keys to each subscriber's pending set and sets its wake-up (O(subscribers),
no I/O, no await). Per-subscriber state is bounded by construction: at most
the three watched keys plus a cursor into the events table, whatever the
commit rate, so a slow reader can only ever skip intermediate states
(coalesced into one frame per FRAME_INTERVAL_S); feed rows are read from the
table, FEED_BATCH at a time, never buffered in memory. Every write has a
WRITE_TIMEOUT_S deadline: a reader that cannot take a frame in time is
dropped (its EventSource reconnects and resumes from its last event id).
At most MAX_SUBSCRIBERS streams at once (503 unavailable beyond).
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from rc.controller.api import ctl, query_int
from rc.controller.core import Controller
from rc.controller.errors import Refused
from rc.controller.store import events as feed
from rc.proto.codec import encode
from rc.proto.errors import ErrorCode

__all__ = ["Broadcaster", "EventStream", "Subscriber", "stream"]

log = logging.getLogger("rc.stream")

WATCHED = frozenset({"devices", "jobs", "events"})
"""Hub keys a stream reports (rc.controller.hub)."""
KEEPALIVE_S = 15.0
"""An idle stream sends a comment this often (proxies and browsers see it alive)."""
WRITE_TIMEOUT_S = 10.0
"""Longest one write may take before the reader is dropped."""
FRAME_INTERVAL_S = 0.2
"""Changes within this window are coalesced into one frame."""
FEED_BATCH = 200
"""Feed rows read and sent per frame; more follow in the next frame."""
MAX_SUBSCRIBERS = 256
"""Open streams per controller."""
RETRY_MS = 3000
"""Reconnect delay suggested to EventSource, in milliseconds."""
CLOSING_KEY = "stream:closing"
"""A hub key nobody notifies: its waiter fires only when the hub closes."""


class Subscriber:
    """One open stream: changed keys not yet sent, and its wake-up."""

    __slots__ = ("gone", "pending", "wake")

    def __init__(self) -> None:
        self.pending: set[str] = set()
        self.wake = asyncio.Event()
        self.gone = False

    def drop(self) -> None:
        """The stream must end (reader gone, too slow, or shutting down)."""
        self.gone = True
        self.wake.set()


class Broadcaster:
    """Fans commit notifications out to every open stream of one controller.

    Registers itself as a Hub listener and as the `sse_subscribers` metrics
    hook. Its timing attributes (seconds) default to the module constants.
    """

    def __init__(self, c: Controller, max_subscribers: int = MAX_SUBSCRIBERS) -> None:
        self.ctl = c
        self.max = max_subscribers
        self.keepalive_s = KEEPALIVE_S
        self.write_timeout_s = WRITE_TIMEOUT_S
        self.frame_interval_s = FRAME_INTERVAL_S
        self.subs: set[Subscriber] = set()
        self._closer: asyncio.Task | None = None
        c.hub.listeners.append(self.on_commit)
        c.metrics.sse_subscribers = self.count

    def count(self) -> int:
        """Open streams."""
        return len(self.subs)

    def on_commit(self, keys: list[str]) -> None:
        """Hub listener (on the event loop, after a commit): mark and wake."""
        if not self.subs:
            return
        watched = WATCHED.intersection(keys)
        if not watched:
            return
        for sub in self.subs:
            sub.pending |= watched
            sub.wake.set()

    def subscribe(self) -> Subscriber:
        """A new subscriber. Raises Refused(503) past `max` open streams or
        while the controller shuts down."""
        if self.ctl.hub.closing:
            raise Refused(ErrorCode.UNAVAILABLE, "the controller is shutting down")
        if len(self.subs) >= self.max:
            raise Refused(
                ErrorCode.UNAVAILABLE,
                f"{len(self.subs)} live streams are open, the most this controller "
                "serves; the page falls back to polling",
            )
        if self._closer is None:
            self._closer = asyncio.create_task(self._close_on_shutdown(), name="rc-stream-closer")
        sub = Subscriber()
        self.subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subs.discard(sub)

    async def _close_on_shutdown(self) -> None:
        await self.ctl.hub.waiter(CLOSING_KEY).wait()
        for sub in list(self.subs):
            sub.drop()


def _frame(event: str, data: object, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


class _TooSlow(Exception):
    """A write did not finish within WRITE_TIMEOUT_S."""


class EventStream(Response):
    """The streaming response of one subscriber (see the module docstring)."""

    media_type = "text/event-stream"

    def __init__(
        self, c: Controller, broadcaster: Broadcaster, sub: Subscriber, after: int
    ) -> None:
        self.c = c
        self.broadcaster = broadcaster
        self.sub = sub
        self.after = after
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._watch_disconnect(receive))
        try:
            await self._send(
                send,
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                },
            )
            hello = {
                "instance": self.c.instance,
                "after": self.after,
                "keepalive_seconds": self.broadcaster.keepalive_s,
            }
            await self._body(send, f"retry: {RETRY_MS}\n\n".encode() + _frame("hello", hello))
            await self._loop(send)
            if not self.sub.gone or self.c.hub.closing:
                await self._send(
                    send, {"type": "http.response.body", "body": b"", "more_body": False}
                )
        except _TooSlow:
            log.info(
                "dropped a live-update reader that took over %.1fs to accept a frame",
                self.broadcaster.write_timeout_s,
            )
        except OSError:
            pass  # the connection broke; nothing to tell anyone
        finally:
            self.broadcaster.unsubscribe(self.sub)
            watcher.cancel()

    async def _loop(self, send: Send) -> None:
        sub = self.sub
        b = self.broadcaster
        sub.pending.add("events")  # rows after `after` may already exist (a resume)
        last_write = time.monotonic()
        last_frame = last_write - b.frame_interval_s
        while not sub.gone:
            if not sub.pending:
                sub.wake.clear()
                left = last_write + b.keepalive_s - time.monotonic()
                try:
                    await asyncio.wait_for(sub.wake.wait(), max(left, 0.0))
                except TimeoutError:
                    await self._body(send, b": keepalive\n\n")
                    last_write = time.monotonic()
                    continue
                if sub.gone:
                    return
            hold = last_frame + b.frame_interval_s - time.monotonic()
            if hold > 0:
                await asyncio.sleep(hold)  # let a burst of commits coalesce
            keys, sub.pending = sub.pending, set()
            chunk = b""
            changed = sorted(keys - {"events"})
            if changed:
                chunk += _frame("change", {"keys": changed, "at": self.c.clock()})
            if "events" in keys:
                chunk += await self._feed_frames()
            if chunk:
                await self._body(send, chunk)
                last_write = last_frame = time.monotonic()

    async def _feed_frames(self) -> bytes:
        after = self.after
        found = await self.c.db.read(feed.since, after, 0.0, FEED_BATCH)
        if len(found) == FEED_BATCH:
            self.sub.pending.add("events")  # more to read: the next frame continues
        if found:
            self.after = found[-1].id
        return b"".join(_frame("feed", encode(e), e.id) for e in found)

    async def _body(self, send: Send, data: bytes) -> None:
        await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})

    async def _send(self, send: Send, message: Message) -> None:
        try:
            await asyncio.wait_for(send(message), self.broadcaster.write_timeout_s)
        except TimeoutError:
            raise _TooSlow() from None

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.sub.drop()
                return


def _start_after(request: Request, c: Controller) -> int | None:
    """Where the feed resumes: Last-Event-ID, else ?after=, else None (the newest row)."""
    last = request.headers.get("last-event-id", "").strip()
    if last:
        if not (last.isascii() and last.isdigit()):
            raise Refused(ErrorCode.BAD_REQUEST, "Last-Event-ID must be an event id")
        return int(last)
    if request.query_params.get("after", "") != "":
        return query_int(request, "after", 0, 0, 1 << 62)
    return None


async def stream(request: Request) -> Response:
    """GET /v1/events/stream[?token=T&after=ID]: Server-Sent Events (see the module)."""
    c = ctl(request)
    after = _start_after(request, c)
    if after is None:
        after = await c.db.read(feed.last_id)
    broadcaster: Broadcaster = request.app.state.stream
    return EventStream(c, broadcaster, broadcaster.subscribe(), after)
