"""Jobs on several devices of one host (README "Several devices for one
job"), in-process on a fake clock (tests.helpers.inprocess.Lab): what submit
refuses, and how a wide job is granted, kept and released."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.controller.store import devices, jobs, queue, views, workers
from rc.proto.model import JobKind, JobState, Link, device_list
from rc.proto.wire import DeviceDecl, DeviceLink, RegisterRequest
from tests.helpers.inprocess import Lab

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


def refused(fn, *args, **kw) -> Refused:
    with pytest.raises(Refused) as e:
        fn(*args, **kw)
    return e.value


def cpu_host(n: int, ceiling: int = 0, **labels) -> dict:
    return {f"cpu{i}": (ceiling, {"kind": "cpu", **labels}) for i in range(n)}


def queued(lb: Lab) -> list[int]:
    return lb.read(lambda tx: [r["id"] for r in tx.all("queued_jobs", {"now": tx.now})])


# ---------------------------------------------------------------- refused at submit


def test_bad_counts_and_pins_are_refused_naming_the_problem(lab):
    lb = lab()
    lb.register("a", cpu_host(3, model="x"))
    lb.register("b", cpu_host(2, model="x"))
    cases = [
        ({"count": 0}, "bad_request", "count 0 is outside 1..64"),
        ({"count": 65}, "bad_request", "count 65 is outside 1..64"),
        ({"device_ids": ("a:cpu0", "b:cpu0")}, "bad_request", "span hosts 'a', 'b'"),
        ({"device_ids": ("a:cpu0", "a:cpu0")}, "bad_request", "'a:cpu0' is pinned twice"),
        ({"device_ids": ("a:cpu0", "a:cpu1"), "count": 3}, "bad_request", "count 3 does not"),
        ({"device_ids": ("a:cpu0",), "device_id": "a:cpu0"}, "bad_request", "not both"),
        ({"device_ids": tuple(f"a:cpu{i}" for i in range(65))}, "bad_request", "at most 64"),
        ({"device_ids": ("a:cpu0", "a:cpu9")}, "unknown_device", "no device 'a:cpu9'"),
        # no host has 4 matching devices: the answer names the largest
        ({"count": 4, "selector": "model=x"}, "no_matching_device", "most on one host is 3 (on a)"),
        ({"count": 2, "selector": "host=b,device=cpu1"}, "no_matching_device", "is 1 (on b)"),
    ]
    for fields, code, words in cases:
        fields.setdefault(
            "selector", "" if "device_ids" in fields or "device_id" in fields else "*"
        )
        e = refused(lb.submit, **fields)
        assert (e.status, e.code) == (400, code), (fields, e.message)
        assert words in e.message, (fields, e.message)
    assert queued(lb) == []  # nothing was queued


def test_the_runtime_must_fit_the_ceiling_of_every_device_a_job_gets(lab):
    lb = lab()
    lb.register("a", {"cpu0": (600, {}), "cpu1": (3600, {}), "cpu2": (3600, {})})
    e = refused(lb.submit, device_ids=("a:cpu0", "a:cpu1"), max_runtime_seconds=1800)
    assert (e.code, e.message) == (
        "runtime_above_ceiling",
        "a:cpu0 allows at most 10m; asked for 30m",
    )
    e = refused(lb.submit, count=3, max_runtime_seconds=1800)
    assert e.code == "runtime_above_ceiling"
    assert "no host has 3 whose ceiling allows it (the most on one host is 2, on a)" in e.message
    lb.submit(count=2, max_runtime_seconds=1800)  # cpu1 and cpu2 allow it


def test_a_job_wider_than_the_per_user_cap_is_refused(lab):
    lb = lab(cap=2)
    lb.register("a", cpu_host(4))
    e = refused(lb.submit, count=3)
    assert e.code == "limit_exceeded"
    assert e.message == (
        "3 devices is more than the per-user cap of 2 (rc serve --max-devices-per-user); "
        "it could never start"
    )
    lb.submit(count=2, kind=JobKind.HOLD, max_runtime_seconds=60, reason="r")


# ---------------------------------------------------------------- granted, kept, released together


def live(lb: Lab) -> dict[str, int]:
    return lb.read(lambda tx: {r["device_id"]: r["job_id"] for r in tx.all("leases_live")})


def states(lb: Lab) -> dict[str, str]:
    return lb.read(lambda tx: {r["id"]: r["state"] for r in tx.all("device_slots")})


def test_a_wide_job_is_granted_all_its_devices_at_once_and_releases_them_together(lab):
    lb = lab()
    lb.register("a", {"cpu0": (0, {}), "cpu1": (3600, {}), "cpu2": (600, {})})
    job_id, _ = lb.submit(count=3)
    j = lb.job(job_id)
    assert (j.state, j.count, j.device_ids, j.device_id) == (
        "assigned",
        3,
        ("a:cpu0", "a:cpu1", "a:cpu2"),
        "a:cpu0",
    )
    assert j.max_runtime_seconds == 600  # no runtime of its own: the lowest ceiling
    assert live(lb) == dict.fromkeys(j.device_ids, job_id)
    assert set(states(lb).values()) == {"busy"}
    lb.finish(job_id)
    assert live(lb) == {} and set(states(lb).values()) == {"ready"}


def test_a_wide_job_waits_behind_a_hold_and_runs_when_it_is_released(lab):
    lb = lab()
    lb.register("a", cpu_host(4))
    hold, _ = lb.submit(
        "bob", device_id="a:cpu2", kind=JobKind.HOLD, max_runtime_seconds=3600, reason="r"
    )
    wide, _ = lb.submit(count=4)
    narrow, _ = lb.submit("carol")  # no bound: never onto the devices the wide job reserved
    assert lb.job(wide).state == "queued" and lb.job(narrow).state == "queued"
    ex = lb.explain(wide)
    assert ex.reservation is not None
    assert ex.reservation.device_ids == tuple(f"a:cpu{i}" for i in range(4))
    assert ex.reservation.start_at == lb.now + 3600  # when the hold ends at the latest
    [fit] = ex.hosts
    assert (fit.host, fit.matching, fit.free, fit.count) == ("a", 4, 3, 4)
    assert [(h.device_id, h.job_id, h.holder) for h in fit.held] == [("a:cpu2", hold, "bob")]
    assert (
        "No host has 4 of the devices it could use free at once: a: 3 of 4 free; " in ex.reasons[0]
    )
    assert f"cpu2 held by hold {hold} (bob) for at most 1h more" in ex.reasons[0]
    assert any(
        r.startswith("It has reserved a:cpu0..3, expected free within 1h") for r in ex.reasons
    )
    why = lb.explain(narrow)
    assert any("reserved for job" in r and "this one has none" in r for r in why.reasons), why
    lb.kill(hold, "bob")
    lb.finish(hold, JobState.KILLED)
    assert lb.job(wide).state == "assigned"
    assert lb.job(narrow).state == "queued"


def test_a_bounded_job_backfills_a_reserved_device_until_the_reservation_starts(lab):
    lb = lab()
    lb.register("a", cpu_host(2))
    lb.submit("bob", device_id="a:cpu0", kind=JobKind.HOLD, max_runtime_seconds=3600, reason="r")
    wide, _ = lb.submit(count=2)
    short, _ = lb.submit("carol", max_runtime_seconds=1800)  # ends before the hold does
    assert lb.job(short).state == "assigned" and lb.job(short).device_ids == ("a:cpu1",)
    lb.finish(short)
    lb.now += 3000
    late, _ = lb.submit("carol", max_runtime_seconds=1800)  # would end after the hold's end
    assert lb.job(late).state == "queued" and lb.job(wide).state == "queued"


def test_cancelling_a_queued_wide_job_frees_what_it_reserved_at_once(lab):
    """Found by the scheduler state machine: a cancel asked for no pass, so a
    job waited beside free devices until the next tick."""
    lb = lab()
    lb.register("a", cpu_host(2))
    lb.submit("bob", device_id="a:cpu0", kind=JobKind.HOLD, max_runtime_seconds=3600, reason="r")
    wide, _ = lb.submit(count=2)
    narrow, _ = lb.submit("carol")
    assert lb.job(narrow).state == "queued"
    lb.kill(wide)
    assert lb.job(narrow).state == "assigned" and lb.job(narrow).device_ids == ("a:cpu1",)


def test_an_expired_lease_loses_the_job_and_quarantines_every_device_of_it(lab):
    lb = lab(startup_grace=0.0)
    lb.register("a", cpu_host(3))
    job_id, _ = lb.submit(count=2)
    lb.now += 301  # the default lease, never renewed
    lb.write(workers.heartbeat, "a", (), lb.ctl.thresholds)
    lb.write(workers.sweep, lb.ctl.thresholds, lb.ctl.started_at)
    assert lb.job(job_id).state == "lost"
    assert states(lb) == {"a:cpu0": "unhealthy", "a:cpu1": "unhealthy", "a:cpu2": "ready"}
    assert live(lb) == {}


def test_a_worker_registering_again_quarantines_every_device_of_its_job(lab):
    lb = lab()
    lb.register("a", cpu_host(3))
    job_id, _ = lb.submit(count=2)
    lb.register("a", cpu_host(3))  # the same boot: nothing proves the job is gone
    assert lb.job(job_id).state == "lost"
    assert states(lb) == {"a:cpu0": "unhealthy", "a:cpu1": "unhealthy", "a:cpu2": "ready"}
    lb.register("a", cpu_host(3), boot_id="boot-2")  # a reboot returns them
    assert set(states(lb).values()) == {"ready"}


def test_a_leaving_worker_hands_back_a_wide_job_it_never_started(lab):
    lb = lab()
    req = RegisterRequest("a", (DeviceDecl("cpu0"), DeviceDecl("cpu1")), instance="w1")
    lb.write(workers.register, req, lb.ctl.match_cache, lb.ctl.thresholds)
    job_id, _ = lb.submit(count=2)
    requeued, _ = lb.write(workers.leave, "a", "w1", ())
    assert requeued == [job_id]
    j = lb.job(job_id)
    assert (j.state, j.device_ids, j.device_id) == ("queued", (), "")
    assert live(lb) == {}


def test_a_pinned_list_runs_in_its_order_once_all_of_it_is_free(lab):
    lb = lab()
    lb.register("a", cpu_host(3))
    hold, _ = lb.submit(
        "bob", device_id="a:cpu2", kind=JobKind.HOLD, max_runtime_seconds=60, reason="r"
    )
    pinned, _ = lb.submit(device_ids=("a:cpu2", "a:cpu0"))
    assert lb.job(pinned).state == "queued"
    lb.kill(hold, "bob")
    lb.finish(hold, JobState.KILLED)
    j = lb.job(pinned)
    assert (j.state, j.device_ids, j.device_id) == ("assigned", ("a:cpu2", "a:cpu0"), "a:cpu2")


def test_retiring_one_pinned_device_cancels_the_job(lab):
    lb = lab()
    lb.register("a", cpu_host(3))
    lb.submit("bob", device_id="a:cpu1", kind=JobKind.HOLD, max_runtime_seconds=60, reason="r")
    pinned, _ = lb.submit(device_ids=("a:cpu0", "a:cpu1"))
    lb.write(devices.retire, "a:cpu0", "admin", lb.ctl.match_cache)
    j = lb.job(pinned)
    assert (j.state, j.kill_reason) == ("killed", "device a:cpu0 was retired")


def test_listings_find_a_wide_job_by_any_of_its_devices(lab):
    lb = lab()
    lb.register("a", cpu_host(3))
    job_id, _ = lb.submit(count=3)
    lb.finish(job_id)
    found = lb.read(jobs.listing, jobs.Filter(device="a:cpu2"), 10)
    assert [j.id for j in found] == [job_id]
    recent = lb.read(views.describe, "a:cpu1").recent_jobs
    assert [j.id for j in recent] == [job_id]
    assert recent[0].device_ids == ("a:cpu0", "a:cpu1", "a:cpu2")


def test_the_per_user_cap_counts_devices(lab):
    lb = lab(cap=3)
    lb.register("a", cpu_host(4))
    wide, _ = lb.submit(count=2)
    second, _ = lb.submit(count=2)  # 2 + 2 > 3: waits, without holding others back
    other, _ = lb.submit("bob", count=2)
    assert [lb.job(j).state for j in (wide, second, other)] == ["assigned", "queued", "assigned"]
    assert "per-user cap" in lb.explain(second).reasons[0]


def quad_links(n: int = 8) -> tuple[DeviceLink, ...]:
    """gpu0-3 and gpu4-7 joined by NVLink, SYS between the two quads."""
    return tuple(
        DeviceLink(f"gpu{i}", f"gpu{j}", Link.NV if (i < 4) == (j < 4) else Link.SYS)
        for i in range(n)
        for j in range(i + 1, n)
    )


def test_the_topology_a_worker_reports_places_jobs(lab):
    """The issue's placement test on the real store: four 1-device jobs land
    in one NVLink quad, then a 4-device job gets the whole other one."""
    lb = lab()
    gpus = {f"gpu{i}": (0, {"kind": "gpu"}) for i in range(8)}
    lb.register("box", gpus, links=quad_links())
    narrow = [lb.submit(selector="kind=gpu")[0] for _ in range(4)]
    got = sorted(lb.job(j).device_id for j in narrow)
    assert got == [f"box:gpu{i}" for i in range(4)]
    wide, _ = lb.submit(selector="kind=gpu", count=4)
    assert lb.job(wide).device_ids == tuple(f"box:gpu{i}" for i in range(4, 8))


def test_the_topology_survives_a_controller_restart(lab, tmp_path):
    first = Lab(tmp_path / "data")
    first.register("box", {f"gpu{i}": (0, {}) for i in range(8)}, links=quad_links())
    first.close()
    lb = Lab(tmp_path / "data")
    try:
        ranks = lb.read(queue.links)["box"]
        assert ranks[("box:gpu0", "box:gpu1")] == Link.NV.rank
        assert ranks[("box:gpu3", "box:gpu4")] == Link.SYS.rank
        assert len(ranks) == 28
    finally:
        lb.close()


def test_device_lists_are_shown_compactly_in_their_order():
    assert device_list(("box:gpu0", "box:gpu1", "box:gpu2", "box:gpu3")) == "box:gpu0..3"
    assert device_list(("box:gpu2", "box:gpu0")) == "box:gpu2,gpu0"
    assert device_list(("b:gpu0", "b:gpu1")) == "b:gpu0,gpu1"
    assert device_list(("b:d1", "b:d2", "b:d3", "b:d7", "b:x")) == "b:d1..3,d7,x"
    assert device_list(("a:cpu1", "b:cpu0")) == "a:cpu1, b:cpu0"
    assert device_list(()) == ""
