"""GET /v1/events/stream: Server-Sent Events for the
dashboard. Over HTTP against a real `rc serve`: auth (header or ?token=, the
only route that takes one), change and feed frames, resume. In process, driving
the ASGI app of a real Controller (real SQLite) with a reader we control:
keepalives, a slow reader dropped within the write deadline while commits keep
flowing, the subscriber limit, and shutdown."""

from __future__ import annotations

import asyncio
import json
import time

from tests.helpers.dashboard_stream import Reader, in_process, scope_for
from tests.helpers.wait import until

# -------------------------------------------------------------- in process


def test_an_idle_stream_sends_keepalives(tmp_path):
    async def body(ctl, app, b, token):
        b.keepalive_s = 0.05
        r = Reader()
        task = asyncio.create_task(app(scope_for(token), r.receive, r.send))
        await until(
            lambda: r.body().count(b": keepalive\n\n") >= 2,
            timeout=5.0,
            interval=0.01,
            what="two keepalives",
        )
        r.gone.set()
        await asyncio.wait_for(task, 5)
        assert b.count() == 0

    in_process(tmp_path, body)


def test_a_reader_that_stops_reading_is_dropped_and_never_buffers(tmp_path):
    async def body(ctl, app, b, token):
        b.write_timeout_s = 0.3
        b.frame_interval_s = 0.0
        r = Reader(allow=1)  # takes the hello, then never reads again
        task = asyncio.create_task(app(scope_for(token), r.receive, r.send))
        await until(
            lambda: b.count() == 1 and b"hello" in r.body(),
            timeout=5.0,
            interval=0.01,
            what="the hello frame",
        )
        sub = next(iter(b.subs))
        deadline = time.monotonic() + 30  # a bound on the test, not a timing claim
        most = 0
        while not task.done() and time.monotonic() < deadline:
            for _ in range(200):  # commits keep coming; none of them waits for the reader
                ctl.hub.notify(["devices", "jobs", "events", "log:1", "job:1"])
            most = max(most, len(sub.pending))
            await asyncio.sleep(0.01)
        assert task.done(), "the stalled reader was never dropped"
        assert most <= 3
        assert b.count() == 0

    in_process(tmp_path, body)


def test_streams_past_the_limit_are_refused_in_the_error_shape(tmp_path):
    async def body(ctl, app, b, token):
        b.max = 1
        first = Reader()
        task = asyncio.create_task(app(scope_for(token), first.receive, first.send))
        await until(lambda: b.count() == 1, timeout=5.0, interval=0.01, what="one subscriber")
        second = Reader()
        await app(scope_for(token), second.receive, second.send)
        assert second.status() == 503
        assert json.loads(second.body())["error"] == "unavailable"
        first.gone.set()
        await asyncio.wait_for(task, 5)

    in_process(tmp_path, body)


def test_shutdown_ends_every_stream_at_once(tmp_path):
    async def body(ctl, app, b, token):
        readers = [Reader() for _ in range(3)]
        tasks = [asyncio.create_task(app(scope_for(token), r.receive, r.send)) for r in readers]
        await until(lambda: b.count() == 3, timeout=5.0, interval=0.01, what="three subscribers")
        ctl.hub.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        for r in readers:
            assert r.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert b.count() == 0

    in_process(tmp_path, body)
