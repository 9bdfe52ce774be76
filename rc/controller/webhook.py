"""The webhook sink: every activity-feed event POSTed to one URL.

Events are rows first (rc.controller.store.events); this sink tails them after each
commit and delivers each as one JSON POST:

    {"id": 17, "event": "device_unhealthy", "device": "gpu1:gpu3", "job": 42,
     "reason": "...", "actor": "...", "at": "2026-11-30T10:00:00Z", "at_unix": 1796032800.0}

Limits (all explicit): a queue of `queue_size` events (256); when it is full
the event is dropped, counted in `dropped` (exported as rc_webhook_dropped)
and logged. One delivery task; 3 attempts per event with backoff 1 s
doubling; 10 s per POST; a non-2xx answer is a failure; 64 KiB of the answer
read at most. On shutdown, up to 5 s to deliver what is queued. Delivery never
blocks a request or the scheduler: the tail reads after commit and the POSTs
run on a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from rc.controller.store import events
from rc.controller.store.db import Database

__all__ = ["Webhook"]

log = logging.getLogger("rc.webhook")

QUEUE_SIZE = 256
ATTEMPTS = 3
BACKOFF_S = 1.0
POST_TIMEOUT_S = 10.0
DRAIN_ON_STOP_S = 5.0
READ_LIMIT_BYTES = 64 << 10
TAIL_BATCH = 500


class Webhook:
    """Delivers feed events to `url`; `dropped` and `failed` count losses."""

    def __init__(
        self,
        url: str,
        db: Database,
        queue_size: int = QUEUE_SIZE,
        backoff: float = BACKOFF_S,
        timeout: float = POST_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.db = db
        self.backoff = backoff
        self.timeout = timeout
        self.queue: asyncio.Queue[dict] = asyncio.Queue(queue_size)
        self.dropped = 0
        self.failed = 0
        self.delivered = 0
        self._wake = asyncio.Event()
        self._last_id = 0
        self._tasks: list[asyncio.Task] = []
        self._stopping = False

    def listener(self) -> Callable[[list[str]], None]:
        """A Hub listener that wakes the tail when events were committed."""

        def on_commit(keys: list[str]) -> None:
            if "events" in keys:
                self._wake.set()

        return on_commit

    async def start(self) -> None:
        """Begin after the newest existing event (history is not replayed)."""
        self._last_id = await self.db.read(events.last_id)
        self._tasks = [
            asyncio.create_task(self._tail(), name="rc-webhook-tail"),
            asyncio.create_task(self._deliver(), name="rc-webhook-deliver"),
        ]

    async def stop(self) -> None:
        """Stop tailing; give queued events up to 5 s, then give up on them."""
        self._stopping = True
        if not self._tasks:
            return
        tail, deliver = self._tasks
        tail.cancel()
        try:
            await asyncio.wait_for(self.queue.join(), DRAIN_ON_STOP_S)
        except TimeoutError:
            left = self.queue.qsize()
            if left:
                log.warning("webhook: %d event(s) not delivered before shutdown", left)
                self.dropped += left
        deliver.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):  # noqa: BLE001, S110 - shutting down
                pass
        self._tasks = []

    async def _tail(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            while True:
                found = await self.db.read(events.after, self._last_id, TAIL_BATCH)
                for e in found:
                    self._last_id = e.id
                    self._offer(_body(e))
                if len(found) < TAIL_BATCH:
                    break

    def _offer(self, body: dict) -> None:
        try:
            self.queue.put_nowait(body)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "webhook: queue full (%d); dropped event %s (%s); %d dropped so far",
                self.queue.maxsize,
                body["id"],
                body["event"],
                self.dropped,
            )

    async def _deliver(self) -> None:
        while True:
            body = await self.queue.get()
            try:
                delay = self.backoff
                for attempt in range(1, ATTEMPTS + 1):
                    err = await asyncio.to_thread(self._post, body)
                    if err is None:
                        self.delivered += 1
                        break
                    if attempt == ATTEMPTS:
                        self.failed += 1
                        self.dropped += 1
                        log.warning(
                            "webhook: gave up on event %s after %d attempts: %s",
                            body["id"],
                            ATTEMPTS,
                            err,
                        )
                    else:
                        await asyncio.sleep(delay)
                        delay *= 2
            finally:
                self.queue.task_done()

    def _post(self, body: dict) -> str | None:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "rc-webhook"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read(READ_LIMIT_BYTES)
                if 200 <= resp.status < 300:
                    return None
                return f"answered {resp.status}"
        except urllib.error.HTTPError as e:
            return f"answered {e.code}"
        except (OSError, ValueError) as e:
            return str(e) or type(e).__name__


def _body(ev) -> dict:
    return {
        "id": ev.id,
        "event": ev.kind.value,
        "device": ev.device_id,
        "job": ev.job_id,
        "reason": ev.text,
        "actor": ev.actor,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ev.at)),
        "at_unix": ev.at,
    }
