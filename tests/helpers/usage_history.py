"""A known usage history made on the in-process controller's clock."""

from __future__ import annotations

from rc.proto.model import JobKind


def _known_days(lb, today: float):
    """alice: 2 devices for 1h two days before `today` (a UTC midnight); bob: 1
    device for 3h the day before, queued 10 minutes behind a hold."""
    lb.register("h", {"cpu0": (0, {}), "cpu1": (0, {})})
    lb.now = today - 2 * 86400 + 36000
    a, _ = lb.submit("alice", count=2)
    lb.now += 3600
    lb.finish(a)
    lb.now = today - 86400 + 36000
    hold, _ = lb.submit("carol", kind=JobKind.HOLD, max_runtime_seconds=600, reason="r",
                        device_id="h:cpu0")  # fmt: skip
    b, _ = lb.submit("bob", device_id="h:cpu0")
    lb.now += 600
    lb.finish(hold)
    lb.now += 3 * 3600
    lb.finish(b)
    lb.now = today + 3600
