"""rc.controller.explain on facts built by hand: every sentence `rc explain
JOB` can say, without a store (tests/store/test_explain.py has the same answers
from the real store and plan)."""

from __future__ import annotations

import dataclasses
import math

from rc.controller.explain import Device, Facts, FairShare, Lease, Queued, explanation
from rc.controller.planning import QueuedJob, Reservation, Slot
from rc.controller.planning.fairshare import Standing
from rc.proto.model import DeviceState, Job, JobKind, JobState
from rc.proto.wire import DeviceHolder, HostFit, ReservationView

NOW = 1_800_000_000.0
READY, BUSY = DeviceState.READY, DeviceState.BUSY


def queued(
    *pool: Device, job_id: int = 7, selector: str = "*", me: dict | None = None, **facts
) -> Facts:
    """The facts of queued job `job_id` (alice's) with this pool; `me`:
    QueuedJob fields, the rest Queued's."""
    fields = {"selector": selector, "unix_user": "alice", **(me or {})}
    job = Job(
        job_id,
        JobKind.JOB,
        JobState.QUEUED,
        "alice",
        selector=fields["selector"],
        device_ids=fields.get("device_ids", ()),
    )
    facts.setdefault("position", 1)
    return Facts(
        job, NOW, Queued(QueuedJob(job_id, "alice", 0, NOW - 60, **fields), pool=pool, **facts)
    )


def dev(device_id: str, state: DeviceState = READY, **fields) -> Device:
    """A pool device; Slot fields (max_runtime, draining, free_at, run_as,
    root_ok) and Device fields both by keyword."""
    slot_keys = {"max_runtime", "draining", "free_at", "run_as", "root_ok"}
    slot = Slot(device_id, state, **{k: v for k, v in fields.items() if k in slot_keys})
    return Device(slot, **{k: v for k, v in fields.items() if k not in slot_keys})


def job_lease(job_id: int = 3, holder: str = "bob", runtime: int = 0, age: float = 600) -> Lease:
    return Lease(job_id, "job", holder, "", runtime, NOW - age)


def test_a_job_that_is_not_queued_is_not_waiting():
    def said(state, **fields):
        f = Facts(Job(5, JobKind.JOB, state, "alice", **fields), NOW)
        ex = explanation(f)
        assert (ex.job_id, ex.state, ex.queue_position, ex.blockers) == (5, state.value, 0, {})
        (why,) = ex.reasons
        return why

    assert said(JobState.ASSIGNED, device_id="box:g0", device_ids=("box:g0", "box:g1")) == (
        "It is not waiting: it was assigned on box:g0,g1 and is starting."
    )
    assert (
        said(JobState.RUNNING, device_id="box:g2") == "It is not waiting: it is running on box:g2."
    )
    assert said(JobState.KILLED, kill_reason="by alice") == (
        "It is not waiting: it ended (killed: by alice)."
    )
    assert said(JobState.SUCCEEDED) == "It is not waiting: it ended (succeeded)."


def test_a_target_that_no_longer_exists():
    ex = explanation(queued(selector="model=h100", position=2))
    assert ex.reasons == (
        (
            "No device matches 'model=h100' any more (a device was retired or its labels "
            "changed); it waits until one does, or rc kill it."
        ),
    )
    assert (ex.queue_position, ex.blockers, ex.priority) == (2, {}, "")
    one = queued(dev("box:g0"), selector="", gone=("box:g1",))
    assert explanation(one).reasons == (
        "Device box:g1 no longer exists (retired); rc kill this job.",
    )
    two = queued(selector="", gone=("box:g1", "box:g2"))
    assert explanation(two).reasons == (
        "Devices box:g1, box:g2 no longer exist (retired); rc kill this job.",
    )


def test_devices_that_never_fit():
    ex = explanation(queued(dev("a:g0", run_as="bob"), dev("b:g0", root_ok=True, run_as="carol")))
    assert ex.reasons == (
        (
            "No device it could use runs jobs as alice: a runs jobs as bob only (a worker "
            "that is not root runs only its own user's jobs; one started as root runs every "
            "user's, each as that user (on a one-box: sudo rc up -d)); b runs jobs as carol "
            "only (a worker that is not root runs only its own user's jobs; one started as "
            "root runs every user's, each as that user (on a one-box: sudo rc up -d)). It "
            "waits until one does, or rc kill it."
        ),
    )
    assert list(ex.blockers) == ["a:g0", "b:g0"]
    low = explanation(queued(dev("box:g0", max_runtime=600), me={"max_runtime": 3000}))
    assert low.reasons == (
        (
            "Every device it could use has a runtime ceiling below the 50m it asks for; it "
            "cannot start until a ceiling is raised. rc kill it and ask for less."
        ),
    )
    assert low.blockers == {
        "box:g0": "its runtime ceiling (10m) is below the 50m this job asks for"
    }
    few = queued(dev("a:g0"), dev("b:g0"), dev("b:g1"), me={"count": 3})
    assert explanation(few).reasons == (
        (
            "No host has 3 devices it could use (the most on one host is 2, on b: a device "
            "was retired, its labels changed, or runtime ceilings are below what it asks "
            "for); it waits until one has, or rc kill it."
        ),
    )


def test_held_devices_name_who_holds_them_and_for_how_long():
    hold = Lease(2, "hold", "bob", "debugging nccl", 3600, NOW - 2400)
    ex = explanation(
        queued(
            dev("box:g0", BUSY, lease=hold),
            dev("box:g1", BUSY, lease=job_lease(3, "carol")),
            dev("box:g2", BUSY, lease=job_lease(4, "dave", runtime=60)),
            dev("box:g3", BUSY),
        )
    )
    assert ex.blockers == {
        "box:g0": "bob holds it (debugging nccl), for at most 20m more",
        "box:g1": "carol runs job 3 on it, with no time limit",
        "box:g2": "dave runs job 4 on it, past its time limit (it is being stopped)",
        "box:g3": "busy",
    }
    assert ex.reasons == (
        (
            "No matching device is free: box:g0: bob holds it (debugging nccl), for at most "
            "20m more; box:g1: carol runs job 3 on it, with no time limit; box:g2: dave runs "
            "job 4 on it, past its time limit (it is being stopped); box:g3: busy."
        ),
    )
    assert ex.hosts == (
        HostFit(
            "box",
            4,
            0,
            1,
            (
                DeviceHolder("box:g0", 2, "bob", "hold", "debugging nccl", None),
                DeviceHolder("box:g1", 3, "carol", "job", "", None),
                DeviceHolder("box:g2", 4, "dave", "job", "", None),
            ),
        ),
    )
    assert ex.priority == "priority 0 = 0"


def test_devices_out_of_the_pool_and_why():
    ex = explanation(
        queued(
            dev("box:g0", BUSY, lease=job_lease()),
            dev(
                "box:g1",
                DeviceState.UNHEALTHY,
                quarantine_reason="fault",
                quarantine_detail="ECC errors",
            ),
            dev("box:g2", DeviceState.UNHEALTHY),
            dev("box:g3", DeviceState.UNKNOWN, lease=job_lease(9, "erin")),
            dev("box:g4", draining=True, drain_reason="cable swap"),
            dev("box:g5", draining=True),
        )
    )
    assert ex.reasons == (
        "No matching device is free: box:g0: bob runs job 3 on it, with no time limit.",
        (
            "The other matching devices are out of the pool: box:g1: quarantined (fault): ECC "
            "errors; box:g2: quarantined (unknown cause): no detail recorded; box:g3: its "
            "worker has stopped reporting; erin runs job 9 on it, with no time limit; box:g4: "
            "draining (cable swap); box:g5: draining."
        ),
    )
    alone = explanation(queued(dev("box:g5", draining=True)))
    assert alone.reasons == ("Every matching device is out of the pool: box:g5: draining.",)


def test_free_devices_and_whose_they_are():
    ex = explanation(
        queued(
            dev("box:g0", given_to=7),
            dev("box:g1", given_to=5),
            dev("box:g2", reserved_for=7),
            dev("box:g3"),
            given=("box:g0",),
        )
    )
    assert ex.blockers == {
        "box:g0": "free: this job starts on it at the next scheduling pass",
        "box:g1": "free, but job 5 is ahead of this one and gets it",
        "box:g2": "free, reserved for this job (it needs 1 at once)",
        "box:g3": "free",
    }
    assert ex.reasons == (
        (
            "It is starting: box:g0 is free and the next scheduling pass (within a second) "
            "hands it over."
        ),
    )
    wide = queued(
        dev("box:g0", given_to=7),
        dev("box:g1", given_to=7),
        given=("box:g0", "box:g1"),
        me={"count": 2},
    )
    assert explanation(wide).reasons == (
        (
            "It is starting: box:g0,g1 are free and the next scheduling pass (within a second) "
            "hands them over."
        ),
    )
    assert explanation(queued(dev("box:g3"))).reasons == (
        "A matching device is free; the next scheduling pass (within a second) should start it.",
    )


def test_what_the_plan_holds_it_back_for():
    unmet = tuple((j, "queued") for j in range(1, 8))
    ex = explanation(
        queued(
            dev("box:g0"),
            unmet=unmet,
            array_held=True,
            capped=True,
            account_holds=1,
            cap=1,
            me={"array_id": 40, "array_cap": 2},
        )
    )
    assert ex.reasons == (
        (
            "Waiting for job 1 (queued), job 2 (queued), job 3 (queued), job 4 (queued), "
            "job 5 (queued) and 2 more: it is not eligible until its dependencies end."
        ),
        (
            "Its array 40 already has 2 elements assigned or running, its cap (%2); it "
            "starts once one of them ends."
        ),
        (
            "alice already holds 1 device, the per-user cap (rc serve --max-devices-per-user "
            "1); it starts once one of them is released."
        ),
    )
    wide = queued(
        dev("box:g0"), dev("box:g1"), capped=True, account_holds=2, cap=3, me={"count": 2}
    )
    assert explanation(wide).reasons == (
        (
            "alice already holds 2 devices; with the 2 devices this job needs that passes the "
            "per-user cap (rc serve --max-devices-per-user 3); it starts once enough of them "
            "are released."
        ),
    )


def test_no_host_with_enough_free_at_once_and_its_reservation():
    held = Lease(3, "job", "bob", "", 3600, NOW - 600)
    f = queued(
        dev("box:g0", BUSY, lease=held, free_at=NOW + 3000),
        dev("box:g1", reserved_for=7),
        dev("box:g2", DeviceState.UNKNOWN),
        me={"count": 2},
        reservations={7: Reservation(7, ("box:g0", "box:g1"), NOW + 3000)},
    )
    ex = explanation(f)
    assert ex.reasons == (
        (
            "No host has 2 of the devices it could use free at once: box: 1 of 3 free; g0 "
            "held by job 3 (bob) for at most 50m more."
        ),
        "Out of the pool: box:g2: its worker has stopped reporting.",
        (
            "It has reserved box:g0,g1, expected free within 50m at most; until then only "
            "jobs that end before that may use them."
        ),
    )
    assert ex.reservation == ReservationView(("box:g0", "box:g1"), NOW + 3000)
    forever = Reservation(7, ("box:g0", "box:g1"), math.inf)
    ex = explanation(
        dataclasses.replace(f, queued=dataclasses.replace(f.queued, reservations={7: forever}))
    )
    assert ex.reasons[-1] == (
        "It has reserved box:g0,g1: a holder has no time limit, so no start can be "
        "promised; meanwhile only jobs with a time limit may use them."
    )
    assert ex.reservation == ReservationView(("box:g0", "box:g1"), None)


def test_free_devices_a_job_ahead_reserved():
    reserved = {
        4: Reservation(4, ("box:g0", "box:g1", "box:g2"), NOW + 90),
        5: Reservation(5, ("far:g0",), math.inf),
    }
    f = queued(
        dev("box:g0", reserved_for=4),
        dev("box:g1", reserved_for=4),
        dev("far:g0", reserved_for=5),
        reservations=reserved,
        me={"max_runtime": 600},
    )
    ex = explanation(f)
    assert ex.blockers["box:g0"] == "free, but reserved for job 4"
    assert ex.reasons == (
        (
            "Free, but box:g0,g1 are reserved for job 4 (it needs 3 at once, expected free "
            "within 1m30s at most); far:g0 is reserved for job 5 (it needs 1 at once, "
            "expected free at an unknown time (a holder has no time limit)): this job could "
            "use them meanwhile only if its max runtime (10m) ended before then."
        ),
    )
    now = queued(
        dev("box:g0", reserved_for=4),
        reservations={4: Reservation(4, ("box:g0", "box:g1"), NOW)},
    )
    assert explanation(now).reasons == (
        (
            "Free, but box:g0 is reserved for job 4 (it needs 2 at once, expected free now): a "
            "job may use a reserved device meanwhile only if its --max-runtime ends before "
            "then, and this one has none."
        ),
    )


def test_jobs_ahead_and_the_terms_of_its_priority():
    standing = Standing("alice", 1.0, 3600.0, 0.41, 0.25, 3)
    ex = explanation(
        queued(
            dev("box:g0", BUSY),
            rivals=(1, 2, 3, 4, 5, 6),
            aging=600.0,
            aged=2,
            effective=-1,
            adjusted=True,
            fair_share=FairShare(3, 7 * 86400.0, standing),
        )
    )
    assert ex.reasons[1] == (
        "6 jobs ahead of it with higher or equal priority want the same devices and get "
        "them first (jobs 1, 2, 3, 4, 5, ...). This job's priority is 0, -1 with aging and "
        "fair share, and it gains a step every 10m it waits."
    )
    assert ex.priority == (
        "priority 0 + aging 2 - fair share 3 (alice: 41% of recent device-hours "
        "(half-life 7d), entitled 25%) = -1"
    )
    one = explanation(queued(dev("box:g0", BUSY), rivals=(4,), fair_share=FairShare(0, 86400.0)))
    assert one.reasons[1] == (
        "1 job ahead of it with higher or equal priority wants the same devices and gets "
        "them first (job 4). This job's priority is 0."
    )
    assert one.priority == "priority 0 - fair share 0 = 0"
