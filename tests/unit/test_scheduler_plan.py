"""planner.plan(), the pure decision of a pass: priority, FIFO, aging,
ceilings, the per-user cap. (Jobs on several devices, topology, packing,
reservation and backfill: tests/unit/test_placement.py.)"""

from __future__ import annotations

import math

from rc.controller.planning import QueuedJob, Slot, effective_priority, fits_ceiling, plan
from rc.proto.model import DeviceState

READY, BUSY = DeviceState.READY, DeviceState.BUSY


def fleet(**states):
    """d0=READY, d1=(BUSY, 600), d2=(BUSY, 0, 900.0) ... → {id: Slot}: state,
    ceiling, and when a busy device is expected free (default: never)."""
    out = {}
    for d, spec in states.items():
        state, ceiling, free_at = (
            (*spec, math.inf)[:3] if isinstance(spec, tuple) else (spec, 0, math.inf)
        )
        out[d] = Slot(d, state, ceiling, free_at=free_at)
    return out


def job(i, prio=0, at=0.0, sel="all", dev="", who="u", runtime=0):
    return QueuedJob(i, who, prio, at, "" if dev else sel, dev, runtime)


def test_higher_priority_first_then_fifo():
    q = [job(1, 0), job(2, 5), job(3, 5), job(4, -1)]
    p = plan(q, fleet(d0=READY, d1=READY), {"all": frozenset({"d0", "d1"})}, now=0)
    assert p.order == [2, 3, 1, 4]
    assert p.assignments == [(2, ("d0",)), (3, ("d1",))]


def test_aging_gains_one_step_per_interval():
    old = job(1, prio=0, at=0.0)
    assert effective_priority(old, now=599.0, aging=600) == 0
    assert effective_priority(old, now=600.0, aging=600) == 1
    assert effective_priority(old, now=6000.0, aging=600) == 10
    assert effective_priority(old, now=6000.0, aging=0) == 0  # 0 disables
    assert effective_priority(job(2, at=100.0), now=50.0, aging=600) == 0  # clock went back
    q = [old, job(2, prio=1, at=590.0)]
    slots = fleet(d0=READY)
    m = {"all": frozenset({"d0"})}
    assert plan(q, slots, m, now=599, aging=600).assignments == [(2, ("d0",))]
    # after one interval the old job ties and wins on age
    assert plan(q, slots, m, now=600, aging=600).assignments == [(1, ("d0",))]
    assert plan(q, slots, m, now=600, aging=0).assignments == [(2, ("d0",))]


def test_ceilings_filter_candidates():
    assert fits_ceiling(0, 0) and fits_ceiling(100, 0) and fits_ceiling(0, 60)
    assert fits_ceiling(60, 60) and not fits_ceiling(61, 60)
    slots = fleet(d0=(READY, 600), d1=(READY, 3600))
    q = [job(1, runtime=1800)]
    p = plan(q, slots, {"all": frozenset({"d0", "d1"})}, now=0)
    assert p.assignments == [(1, ("d1",))]
    assert p.candidates[1] == ("d1",)


def test_head_of_line_keeps_a_broad_job_first():
    # job 1 wants any device; both are busy. A job on one device reserves
    # nothing (before jobs had several devices, a blocked job reserved every
    # candidate): when d1 frees, the pass places the broad job before the
    # narrow, lower-priority one behind it anyway.
    slots = fleet(d0=BUSY, d1=(BUSY, 0, 900.0))
    m = {"all": frozenset({"d0", "d1"}), "one": frozenset({"d1"})}
    q = [job(1, prio=5), job(2, sel="one")]
    p = plan(q, slots, m, now=0)
    assert p.reserved == {} and p.assignments == []
    p = plan(q, fleet(d0=BUSY, d1=READY), m, now=0)
    assert p.assignments == [(1, ("d1",))]


def test_pinned_jobs_and_unknown_devices():
    slots = fleet(d0=READY, d1=READY)
    q = [job(1, dev="d1"), job(2, dev="gone"), job(3)]
    p = plan(q, slots, {"all": frozenset({"d0", "d1"})}, now=0)
    assert p.assignments == [(1, ("d1",)), (3, ("d0",))]
    assert p.candidates[2] == ()


def test_per_user_cap_holds_back_without_reserving():
    slots = fleet(d0=READY, d1=READY, d2=BUSY)
    m = {"all": frozenset({"d0", "d1", "d2"})}
    q = [job(1, who="ann"), job(2, who="ann"), job(3, who="bob")]
    p = plan(q, slots, m, now=0, cap=1, usage={"ann": 0, "bob": 1})
    assert p.assignments == [(1, ("d0",))]
    assert p.capped == {2, 3}
    assert p.reserved == {}
    p = plan(q, slots, m, now=0, cap=0, usage={"bob": 5})
    assert p.assignments == [(1, ("d0",)), (2, ("d1",))]


def test_draining_and_unhealthy_devices_are_not_handed_out():
    slots = {
        "d0": Slot("d0", READY, 0, draining=True),
        "d1": Slot("d1", DeviceState.UNHEALTHY),
        "d2": Slot("d2", DeviceState.UNKNOWN),
    }
    p = plan([job(1)], slots, {"all": frozenset(slots)}, now=0)
    assert p.assignments == []
    # nothing can be promised of a device out of the pool: none is reserved
    assert p.reserved == {} and p.reservations == {}


def test_a_job_requeued_after_a_hardware_failure_never_gets_its_excluded_devices():
    from dataclasses import replace

    slots = fleet(d0=READY, d1=READY)
    m = {"all": frozenset({"d0", "d1"})}
    again = replace(job(1), excluded=("d0",))  # d0 failed it (cleared since)
    p = plan([again, job(2)], slots, m, now=0)
    assert p.assignments == [(1, ("d1",)), (2, ("d0",))]
    assert p.candidates[1] == ("d1",)
    alone = plan([replace(job(1), excluded=("d0", "d1"))], slots, m, now=0)
    assert alone.assignments == [] and alone.candidates[1] == ()  # it waits
