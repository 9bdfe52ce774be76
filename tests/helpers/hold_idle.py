"""What tests/e2e/test_hold_idle.py and its fast-lane half
tests/store/test_hold_idle.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import pytest

from rc.controller.store import events, jobs
from rc.proto.model import JobKind


@pytest.fixture
def lab(engine, lab):
    """conftest's Lab factory, each test on SQLite, then PostgreSQL (the
    engine fixture)."""
    return lab


def _running_hold(lb, idle=None, who="alice"):
    lb.register("h", {"cpu0": (0, {}), "gpu1": (0, {})})
    fields = {"kind": JobKind.HOLD, "max_runtime_seconds": 86400, "reason": "debugging"}
    if idle is not None:
        fields["hold_idle_timeout_seconds"] = idle
    hold_id, _ = lb.submit(who, device_id="h:cpu0", **fields)
    assert lb.write(jobs.mark_running, hold_id, "h", lb.now)
    return hold_id


def _kinds(lb, hold_id):
    return [e.kind for e in lb.read(events.after, 0, 100) if e.job_id == hold_id]


STAT = "4242 (python3 (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 {u} {s} 0 0 20 0 1 0 1 0 0"
