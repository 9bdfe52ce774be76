"""The queue, edited (README "Editing the queue"), in-process on a fake
clock and on both engines: a stashed job takes nothing and keeps its place,
a begin time holds a job until it comes, and rc update's rules."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.controller.store import edits
from rc.proto.model import JobState, Role
from rc.proto.wire import UpdateRequest
from tests.helpers.inprocess import Lab, local_user

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


def _edit(lb: Lab, job_id: int, who: str = "alice", **fields) -> list[str]:
    """rc update as `who` ("root": an admin) on a controller whose users may ask up to priority 0."""
    caller = local_user(who, Role.ADMIN if who == "root" else Role.USER)
    return lb.write(edits.update, job_id, caller, UpdateRequest(**fields), 0, lb.ctl.match_cache)


def _state(lb: Lab, job_id: int) -> JobState:
    return lb.job(job_id).state


def test_a_stashed_job_keeps_its_place(lab):
    lb = lab()
    lb.register("h", {"cpu0": (0, {"kind": "cpu"})})
    first, _ = lb.submit()
    lb.kick()
    a, _ = lb.submit()
    b, _ = lb.submit()
    assert _edit(lb, a, stashed=True) == ["stashed"]
    assert _edit(lb, a, stashed=True) == []  # nothing changed, nothing said
    lb.finish(first)
    lb.kick()
    assert (_state(lb, a), _state(lb, b)) == (JobState.QUEUED, JobState.ASSIGNED)
    assert "It is stashed" in lb.explain(a).reasons[0]
    assert _edit(lb, a, stashed=False) == ["unstashed"]
    c, _ = lb.submit()
    lb.finish(b)
    lb.kick()
    assert (_state(lb, a), _state(lb, c)) == (JobState.ASSIGNED, JobState.QUEUED)


def test_a_begin_time_holds_a_job_until_it_comes(lab):
    lb = lab()
    lb.register("h", {"cpu0": (0, {"kind": "cpu"})})
    later, _ = lb.submit(begin_at=lb.now + 600)
    now, _ = lb.submit()
    lb.kick()
    assert (_state(lb, later), _state(lb, now)) == (JobState.QUEUED, JobState.ASSIGNED)
    assert "It begins at" in lb.explain(later).reasons[0]
    lb.finish(now)
    lb.now += 601
    lb.kick()
    assert _state(lb, later) is JobState.ASSIGNED


def test_update_rules(lab):
    lb = lab()
    lb.register("h", {"cpu0": (3600, {"kind": "cpu"})})
    j, _ = lb.submit(max_runtime_seconds=1800, begin_at=lb.now + 600)
    assert _edit(lb, j, max_runtime_seconds=600, name="short") == [
        "name - → short",
        "max runtime 30m → 10m",
    ]
    with pytest.raises(Refused, match="only an admin lengthen it"):
        _edit(lb, j, max_runtime_seconds=900)
    with pytest.raises(Refused, match="above this controller's limit"):
        _edit(lb, j, priority=3)
    with pytest.raises(Refused, match="only its owner or an admin"):
        _edit(lb, j, "bob", priority=-1)
    assert _edit(lb, j, "root", max_runtime_seconds=3600, priority=3) == [
        "priority 0 → 3",
        "max runtime 10m → 1h",
    ]
    with pytest.raises(Refused, match="highest ceiling among devices matching .* is 1h"):
        _edit(lb, j, "root", max_runtime_seconds=7200)
    assert _edit(lb, j, begin_at=0) == ["begin time cleared"]
    lb.kick()
    with pytest.raises(Refused, match="only a queued job can be changed"):
        _edit(lb, j, name="x")


def test_a_queued_jobs_target_changes_within_what_the_fleet_has(lab):
    lb = lab()
    lb.register("h", {f"cpu{i}": (0, {"kind": "cpu", "model": "x"}) for i in range(2)})
    lb.submit()
    lb.submit()
    lb.kick()  # both devices taken
    j, _ = lb.submit(selector="model=x")
    assert _edit(lb, j, selector="kind=cpu", count=2) == [
        "selector 'model=x' → 'kind=cpu'",
        "count 1 → 2",
    ]
    got = lb.job(j)
    assert (got.selector, got.count) == ("kind=cpu", 2)
    with pytest.raises(Refused, match="no device matches|matching"):
        _edit(lb, j, selector="model=h100")
    with pytest.raises(Refused, match="bad_selector|selector"):
        _edit(lb, j, selector="model==")
    pinned, _ = lb.submit(selector="", device_id="h:cpu0")
    with pytest.raises(Refused, match="pinned to its devices"):
        _edit(lb, pinned, count=2)
