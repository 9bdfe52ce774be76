"""`rc explain JOB` and `rc explain -s` from the real store, on a fake clock:
every reason a queued job can have for waiting, in words."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.controller.store import devices, views, workers
from rc.proto.model import JobKind, JobState
from tests.helpers.inprocess import Lab

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


def box(lb: Lab, ceilings=(0, 0)) -> None:
    lb.register("box", {f"g{i}": (c, {"model": "h100"}) for i, c in enumerate(ceilings)})


def reasons(lb: Lab, job_id: int) -> str:
    return "\n".join(lb.explain(job_id).reasons)


def test_held_devices_name_the_holder_and_the_time_left(lab):
    lb = lab()
    box(lb, ceilings=(3600, 0))
    hold, _ = lb.submit(
        "bob",
        kind=JobKind.HOLD,
        max_runtime_seconds=7200 // 4,
        reason="debugging nccl",
        device_id="box:g0",
    )
    run, _ = lb.submit("carol", device_id="box:g1")
    waiting, _ = lb.submit("alice", selector="model=h100")
    lb.now += 600
    ex = lb.explain(waiting)
    assert ex.state == "queued" and ex.queue_position == 1
    (why,) = ex.reasons
    assert why.startswith("No matching device is free: ")
    assert "box:g0: bob holds it (debugging nccl), for at most 20m more" in why
    assert f"box:g1: carol runs job {run} on it, with no time limit" in why
    assert ex.blockers["box:g0"] == "bob holds it (debugging nccl), for at most 20m more"
    assert lb.job(hold).state is JobState.ASSIGNED


def test_jobs_ahead_with_higher_or_equal_priority(lab):
    lb = lab(aging=600)
    box(lb)
    lb.submit("bob"), lb.submit("bob")  # both devices busy
    first, _ = lb.submit("bob", priority=5)
    second, _ = lb.submit("carol", priority=0)
    mine, _ = lb.submit("alice", priority=0)
    behind, _ = lb.submit("dave", priority=-1)
    lb.now += 700
    ex = lb.explain(mine)
    assert ex.queue_position == 3
    assert ex.reasons[0].startswith("No matching device is free")
    assert ex.reasons[1] == (
        f"2 jobs ahead of it with higher or equal priority want the same devices and get "
        f"them first (jobs {first}, {second}). This job's priority is 0, 1 with aging, and it "
        "gains a step every 10m it waits."
    )
    assert "ahead" not in reasons(lb, first)
    assert lb.explain(behind).queue_position == 4


def test_devices_out_of_the_pool_and_why(lab):
    lb = lab()
    lb.register("box", {"g0": (0, {}), "g1": (0, {})})
    lb.register("far", {"g0": (0, {})})
    lb.write(devices.fault, "box:g0", "verify failed: ECC errors", None, "box")
    lb.write(devices.drain, "box:g1", True, "cable swap", "admin")
    job_id, _ = lb.submit("alice", selector="host=box")
    why = reasons(lb, job_id)
    assert why == (
        "Every matching device is out of the pool: box:g0: quarantined (fault): "
        "verify failed: ECC errors; box:g1: draining (cable swap)."
    )
    # a silent worker: its devices go unknown after 30 s without a heartbeat
    pinned, _ = lb.submit("alice", device_id="far:g0", priority=-1)
    assert lb.job(pinned).state is JobState.ASSIGNED
    waiting, _ = lb.submit("alice", selector="host=far")
    lb.now += 31
    lb.write(workers.heartbeat, "box", (), lb.ctl.thresholds)
    lb.run(lb.ctl.sweep())
    why = reasons(lb, waiting)
    assert why.startswith(
        "Every matching device is out of the pool: far:g0: its worker has "
        "stopped reporting; alice runs job"
    )


def test_held_and_out_of_the_pool_together(lab):
    lb = lab()
    box(lb)
    lb.submit("bob", device_id="box:g0")
    lb.write(devices.fault, "box:g1", "fan failure", None, "admin")
    job_id, _ = lb.submit("alice")
    assert lb.explain(job_id).reasons == (
        "No matching device is free: box:g0: bob runs job 1 on it, with no time limit.",
        "The other matching devices are out of the pool: box:g1: quarantined (fault): fan failure.",
    )


def test_the_user_cap(lab):
    lb = lab(cap=1)
    lb.register("box", {"g0": (0, {}), "g1": (0, {}), "g2": (0, {})})
    lb.submit("alice")
    capped, _ = lb.submit("alice")
    other, _ = lb.submit("bob")
    assert lb.job(capped).state is JobState.QUEUED  # a device is free, but not for alice
    assert lb.job(other).state is JobState.ASSIGNED  # bob is not held back behind her
    ex = lb.explain(capped)
    assert ex.reasons == (
        (
            "alice already holds 1 device, the per-user cap (rc serve "
            "--max-devices-per-user 1); it starts once one of them is released."
        ),
    )
    assert ex.blockers["box:g2"] == "free"
    # a capped job ahead does not count as ahead of anyone
    late, _ = lb.submit("carol")
    assert lb.job(late).state is JobState.ASSIGNED
    # ... but it does of its own submitter's later jobs: they wait behind it
    second, _ = lb.submit("alice")
    dave, _ = lb.submit("dave")  # the fleet is full now: dave waits too
    positions = lb.read(lambda tx: views.state(tx, lb.ctl.policy).queue_positions)
    assert (positions[str(capped)], positions[str(second)], positions[str(dave)]) == (1, 2, 1)
    assert lb.read(views.job_view, second, lb.ctl.policy).queue_position == 2
    assert f"job {capped}" in reasons(lb, second)


def test_ceiling_and_vanished_targets(lab):
    lb = lab()
    lb.register("box", {"g0": (3600, {"model": "h100"})}, boot_id="1")
    lb.submit("bob", device_id="box:g0")
    long, _ = lb.submit("alice", device_id="box:g0", max_runtime_seconds=3000)
    gone, _ = lb.submit("alice", selector="model=h100")
    # the host comes back with a lower ceiling and without the label
    lb.register("box", {"g0": (600, {"model": "a100"})}, boot_id="2")
    assert reasons(lb, long).startswith(
        "Every device it could use has a runtime ceiling below the 50m it asks for"
    )
    assert "ceiling (10m) is below" in lb.explain(long).blockers["box:g0"]
    assert reasons(lb, gone).startswith("No device matches 'model=h100' any more")


def test_not_waiting(lab):
    lb = lab()
    box(lb, ceilings=(0,))
    running, _ = lb.submit("alice")
    assert lb.explain(running).reasons == (
        "It is not waiting: it was assigned on box:g0 and is starting.",
    )
    lb.finish(running, JobState.FAILED)
    assert lb.explain(running).reasons == ("It is not waiting: it ended (failed).",)
    with pytest.raises(Refused) as e:
        lb.explain(999)
    assert e.value.status == 404


def test_explain_selector(lab):
    lb = lab()
    lb.register("a", {"g0": (0, {"vram": "81920M"}), "g1": (0, {"vram": "40G"})})
    lb.register("b", {"g0": (0, {"vram": "[N/A]"})})
    lb.submit("bob", device_id="a:g0")
    lb.submit("bob", device_id="a:g0")  # queued for a:g0
    lb.submit("bob", device_id="b:g0")
    lb.submit("bob", device_id="b:g0")  # queued for b:g0: not a vram>=40G device
    ex = lb.read(views.explain_selector, " vram >= 40G ", lb.ctl.policy)
    assert (ex.selector, ex.matching, ex.free, ex.queue_depth) == (
        "vram>=40G",
        ("a:g0", "a:g1"),
        ("a:g1",),
        1,
    )
    with pytest.raises(Refused) as e:
        lb.read(views.explain_selector, "vram>>1", lb.ctl.policy)
    assert (e.value.status, e.value.code) == (400, "bad_selector")


def test_an_element_past_its_arrays_cap_waits_and_explain_says_so(lab):
    lb = lab()
    box(lb)
    first, _ = lb.submit("alice", selector="model=h100", array="0-3%1")
    assert lb.job(first).state is JobState.ASSIGNED
    # one running at a time, though a device is free: the others are not eligible
    assert [lb.job(first + k).state for k in (1, 2, 3)] == [JobState.QUEUED] * 3
    other, _ = lb.submit("bob", selector="model=h100")
    assert lb.job(other).state is JobState.ASSIGNED  # the free device is not held for the array
    ex = lb.explain(first + 1)
    assert ex.queue_position == 1
    assert ex.reasons[0] == (
        f"Its array {first} already has 1 element assigned or running, its cap (%1); "
        "it starts once one of them ends."
    )
    assert lb.explain(first + 2).queue_position == 2  # behind its array's earlier element
    lb.finish(first)
    assert lb.job(first + 1).state is JobState.ASSIGNED


def test_an_array_of_wide_elements_and_a_job_after_it(lab):
    lb = lab()
    lb.register("box", {f"g{i}": (0, {"model": "h100"}) for i in range(4)})
    first, _ = lb.submit("alice", selector="model=h100", count=2, array="0-2")
    after, _ = lb.submit("alice", selector="model=h100", after=(str(first),))
    assert [len(lb.job(first + k).device_ids) for k in (0, 1)] == [2, 2]  # two at once
    assert lb.job(first + 2).state is JobState.QUEUED
    ex = lb.explain(after)
    assert ex.reasons[0] == (
        f"Waiting for job {first} (assigned), job {first + 1} (assigned), job {first + 2} "
        "(queued): it is not eligible until its dependencies end."
    )
    assert ex.queue_position == 2  # the third element is ahead of it; it holds back nothing
    for k in (0, 1):
        lb.finish(first + k)
    assert len(lb.job(first + 2).device_ids) == 2
    assert lb.job(after).state is JobState.QUEUED  # the third element still runs
    lb.finish(first + 2)
    assert lb.job(after).state is JobState.ASSIGNED
