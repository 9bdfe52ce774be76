"""Jobs on several devices of one host, in the pure planner (README
"Several devices for one job"): the best set by topology, packing narrow
jobs so intact groups stay whole, reservation with conservative backfill,
and the starvation bound (a hypothesis simulation of a stream of narrow
jobs)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rc.controller.planning import (
    BACKFILL_DEPTH,
    RESERVATIONS_MAX,
    QueuedJob,
    Slot,
    placement,
    plan,
)
from rc.controller.planning.placement import HostTopology, device_key, pair
from rc.proto.model import DeviceState, Link

READY, BUSY = DeviceState.READY, DeviceState.BUSY
NV, PIX, SYS = Link.NV.rank, Link.PIX.rank, Link.SYS.rank


def quads(host: str = "box") -> dict[tuple[str, str], int]:
    """8 GPUs: NVLink within gpu0-3 and within gpu4-7, SYS across."""
    out = {}
    for i in range(8):
        for j in range(i + 1, 8):
            out[pair(f"{host}:gpu{i}", f"{host}:gpu{j}")] = NV if (i < 4) == (j < 4) else SYS
    return out


def gpus(host: str, n: int, **states) -> dict[str, Slot]:
    """n ready GPUs of `host`; states: gpu3=(BUSY, free_at) ..."""
    out = {}
    for i in range(n):
        d = f"{host}:gpu{i}"
        state, free_at = states.get(f"gpu{i}", (READY, math.inf))
        out[d] = Slot(d, state, free_at=free_at)
    return out


def job(i, count=1, sel="*", runtime=0, who="u", pins=()):
    return QueuedJob(i, who, 0, 0.0, "" if pins else sel, "", runtime, count, tuple(pins))


def everything(slots) -> dict[str, frozenset[str]]:
    return {"*": frozenset(slots)}


def test_natural_order_and_pairs():
    ids = ["h:gpu10", "h:gpu2", "h:gpu1"]
    assert sorted(ids, key=device_key) == ["h:gpu1", "h:gpu2", "h:gpu10"]
    assert pair("h:b", "h:a") == ("h:a", "h:b")


def test_a_wide_job_takes_the_set_with_the_best_worst_link():
    slots = gpus("box", 8, gpu1=(BUSY, math.inf))
    p = plan([job(1, count=4)], slots, everything(slots), 0.0, links={"box": quads()})
    # gpu0-3 lost gpu1: only gpu4-7 are all NVLink
    assert p.assignments == [(1, ("box:gpu4", "box:gpu5", "box:gpu6", "box:gpu7"))]
    # when no quad is whole, the worst link is SYS whatever it takes: then
    # the lowest sum of ranks (three of one quad and one of the other)
    slots = gpus("box", 8, gpu1=(BUSY, math.inf), gpu5=(BUSY, math.inf))
    p = plan([job(1, count=4)], slots, everything(slots), 0.0, links={"box": quads()})
    assert p.assignments == [(1, ("box:gpu0", "box:gpu2", "box:gpu3", "box:gpu4"))]


def test_pcie_pairs_before_socket_crossings():
    links = {}
    for i in range(4):
        for j in range(i + 1, 4):
            links[pair(f"b:gpu{i}", f"b:gpu{j}")] = PIX if (i // 2) == (j // 2) else SYS
    slots = gpus("b", 4, gpu0=(BUSY, math.inf))
    p = plan([job(1, count=2)], slots, everything(slots), 0.0, links={"b": links})
    assert p.assignments == [(1, ("b:gpu2", "b:gpu3"))]


def test_four_narrow_jobs_pack_into_one_quad_and_a_wide_job_gets_the_other():
    """The issue's test: a fake 8-GPU host with two NVLink quads."""
    slots = gpus("box", 8)
    links = {"box": quads()}
    taken: list[str] = []
    for i in range(1, 5):
        free = {d: (s if d not in taken else Slot(d, BUSY)) for d, s in slots.items()}
        p = plan([job(i)], free, everything(slots), 0.0, links=links)
        [(_, (d,))] = p.assignments
        taken.append(d)
    assert sorted(taken, key=device_key) == [f"box:gpu{i}" for i in range(4)]
    busy = {d: (s if d not in taken else Slot(d, BUSY)) for d, s in slots.items()}
    p = plan([job(5, count=4)], busy, everything(slots), 0.0, links=links)
    assert p.assignments == [(5, tuple(f"box:gpu{i}" for i in range(4, 8)))]


def test_within_one_pass_narrow_jobs_pack_too():
    slots = gpus("box", 8, gpu6=(BUSY, math.inf))
    q = [job(1), job(2), job(3)]
    p = plan(q, slots, everything(slots), 0.0, links={"box": quads()})
    # the quad gpu4-7 is broken already: the narrow jobs go there
    assert [ds for _, ds in p.assignments] == [("box:gpu4",), ("box:gpu5",), ("box:gpu7",)]


def test_a_narrow_job_prefers_the_host_with_the_fewest_free_candidates():
    slots = {**gpus("a", 4), **gpus("b", 4, gpu0=(BUSY, math.inf), gpu1=(BUSY, math.inf))}
    p = plan([job(1)], slots, everything(slots), 0.0)  # no topology: CPU-like hosts
    assert p.assignments == [(1, ("b:gpu2",))]
    # a wide job that does not fit there goes where it fits
    p = plan([job(1, count=3)], slots, everything(slots), 0.0)
    assert p.assignments == [(1, ("a:gpu0", "a:gpu1", "a:gpu2"))]


def test_a_pinned_list_is_granted_whole_in_its_order_or_not_at_all():
    slots = gpus("a", 4, gpu2=(BUSY, 500.0))
    pins = ("a:gpu3", "a:gpu1")
    p = plan([job(1, pins=pins)], slots, everything(slots), 0.0)
    assert p.assignments == [(1, pins)]  # RC_DEVICES in the order given
    p = plan([job(1, pins=("a:gpu1", "a:gpu2"))], slots, everything(slots), 0.0)
    assert p.assignments == []
    assert p.reservations[1].devices == ("a:gpu1", "a:gpu2")
    assert p.reservations[1].start_at == 500.0
    # a pinned device that does not exist: never placed, nothing reserved
    p = plan([job(1, pins=("a:gpu1", "a:gpu9"))], slots, everything(slots), 0.0)
    assert p.assignments == [] and p.reserved == {}


def test_a_blocked_wide_job_reserves_the_host_free_soonest():
    slots = {
        **gpus("a", 4, gpu0=(BUSY, 900.0), gpu1=(BUSY, 300.0)),
        **gpus("b", 4, gpu0=(BUSY, math.inf), gpu1=(BUSY, 200.0), gpu2=(BUSY, 250.0)),
    }
    p = plan([job(1, count=4)], slots, everything(slots), 100.0)
    assert p.assignments == []
    # a: all four free by 900; b: never (gpu0 has no bound)
    assert p.reservations[1].devices == ("a:gpu0", "a:gpu1", "a:gpu2", "a:gpu3")
    assert p.reservations[1].start_at == 900.0
    # the next wide job reserves what is left where it can: b, never
    p = plan([job(1, count=4), job(2, count=3)], slots, everything(slots), 100.0)
    assert p.reservations[2].devices == ("b:gpu1", "b:gpu2", "b:gpu3")
    assert p.reservations[2].start_at == 250.0


def test_backfill_only_for_jobs_that_end_before_the_reservation_starts():
    slots = gpus("a", 4, gpu0=(BUSY, 1000.0))
    m = everything(slots)
    wide = job(1, count=4)
    # ends at 100 + 900 = 1000: it may use a reserved device
    p = plan([wide, job(2, runtime=900)], slots, m, 100.0)
    assert p.assignments == [(2, ("a:gpu1",))] and p.backfilled == {2}
    # one second longer: it waits
    p = plan([wide, job(2, runtime=901)], slots, m, 100.0)
    assert p.assignments == []
    # no bound of its own: never onto a reserved device...
    p = plan([wide, job(2)], slots, m, 100.0)
    assert p.assignments == []
    # ...unless the device's ceiling bounds it
    capped = {d: Slot(d, s.state, 600, free_at=s.free_at) for d, s in slots.items()}
    p = plan([wide, job(2)], capped, m, 100.0)
    assert p.assignments == [(2, ("a:gpu1",))]


def test_a_job_on_one_device_reserves_nothing():
    slots = gpus("a", 2, gpu0=(BUSY, 100.0), gpu1=(BUSY, 200.0))
    p = plan([job(1), job(2, pins=("a:gpu1",))], slots, everything(slots), 0.0)
    assert p.reserved == {} and p.reservations == {}


def test_at_most_reservations_max_jobs_reserve_in_one_pass():
    slots = {}
    for h in range(RESERVATIONS_MAX + 4):
        slots.update(gpus(f"h{h}", 2, gpu0=(BUSY, 100.0 + h)))
    q = [job(i, count=2) for i in range(1, RESERVATIONS_MAX + 4)]
    p = plan(q, slots, everything(slots), 0.0)
    assert sorted(p.reservations) == list(range(1, RESERVATIONS_MAX + 1))
    assert p.reservations[1].devices == ("h0:gpu0", "h0:gpu1")  # the soonest host first


def test_backfill_only_within_the_backfill_depth():
    slots = gpus("a", 2, gpu0=(BUSY, 1000.0))
    wide = job(1, count=2)
    fillers = [job(i, sel="none") for i in range(2, BACKFILL_DEPTH + 1)]  # want nothing here
    near = [wide, *fillers[:-1], job(BACKFILL_DEPTH + 1, runtime=60)]  # index BACKFILL_DEPTH - 1
    far = [wide, *fillers, job(BACKFILL_DEPTH + 2, runtime=60)]  # index BACKFILL_DEPTH
    m = {**everything(slots), "none": frozenset()}
    assert [j for j, _ in plan(near, slots, m, 0.0).assignments] == [BACKFILL_DEPTH + 1]
    assert plan(far, slots, m, 0.0).assignments == []
    # the pass stops where no later job could get a device, and agrees
    fast = plan(iter(far), slots, m, 0.0, ordered=True, until_settled=True)
    assert fast.assignments == [] and len(fast.order) == BACKFILL_DEPTH


def test_devices_nobody_reserved_are_free_for_anyone():
    slots = {**gpus("a", 4, gpu0=(BUSY, 1000.0)), **gpus("b", 1)}
    p = plan([job(1, count=4), job(2)], slots, everything(slots), 0.0)
    assert p.assignments == [(2, ("b:gpu0",))]  # no bound, but b:gpu0 is not reserved


def test_the_cap_counts_devices():
    slots = gpus("a", 4)
    p = plan([job(1, count=3, who="ann"), job(2, who="ann")], slots, everything(slots), 0, cap=3)
    assert [j for j, _ in p.assignments] == [1] and p.capped == {2}
    p = plan([job(1, count=2, who="ann")], slots, everything(slots), 0, cap=3, usage={"ann": 2})
    assert p.assignments == [] and p.capped == {1} and p.reserved == {}


def test_a_large_host_is_searched_greedily_and_still_finds_the_intact_group():
    links = {}
    for i in range(16):
        for j in range(i + 1, 16):
            links[pair(f"h:gpu{i}", f"h:gpu{j}")] = NV if (i < 8) == (j < 8) else SYS
    slots = gpus("h", 16, gpu0=(BUSY, math.inf))
    assert math.comb(15, 8) > placement.EXHAUSTIVE_MAX
    p = plan([job(1, count=8)], slots, everything(slots), 0.0, links={"h": links})
    assert p.assignments == [(1, tuple(f"h:gpu{i}" for i in range(8, 16)))]


def test_an_unreported_pair_on_a_host_with_topology_is_unknown():
    topo = HostTopology(["h:gpu0", "h:gpu1", "h:gpu2"], {pair("h:gpu0", "h:gpu1"): NV}, bool)
    assert topo.rank("h:gpu1", "h:gpu0") == NV
    assert topo.rank("h:gpu0", "h:gpu2") == Link.UNKNOWN.rank
    assert HostTopology(["h:cpu0", "h:cpu1"], {}, bool).rank("h:cpu0", "h:cpu1") == 0


# ---------------------------------------------------------------- the starvation bound

STREAM = st.lists(
    st.tuples(
        st.floats(0, 400),  # arrives this long after the wide job
        st.sampled_from([0, 30, 60, 120, 600]),  # its max runtime (0: none)
        st.floats(0.05, 1.0),  # it runs this fraction of its bound (or of 900 s)
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    running=st.lists(  # what the fleet runs when the wide job arrives: runtime, time left
        st.tuples(st.sampled_from([0, 100, 300, 900]), st.floats(0.1, 1.0)),
        min_size=8,
        max_size=8,
    ),
    stream=STREAM,
    wide_runtime=st.sampled_from([0, 600]),
)
def test_a_stream_of_narrow_jobs_cannot_delay_a_wide_job_past_its_promise(
    running, stream, wide_runtime
):
    """Two hosts of 4 devices, all busy; a 4-device job arrives, then a
    stream of 1-device jobs (bounded or not), each ending no later than its
    bound. Passes run at every arrival, end and promised time. However the
    stream goes, the wide job starts no later than every start time its
    reservation promised."""
    devices = [f"{h}:d{i}" for h in ("a", "b") for i in range(4)]
    now = 0.0
    ends: dict[str, tuple[float, float]] = {}  # device → (real end, bound end)
    for d, (runtime, left) in zip(devices, running, strict=True):
        bound = runtime * left if runtime else math.inf
        ends[d] = (runtime * left * 0.9 if runtime else 500.0 * left, bound)
    wide = QueuedJob(1, "w", 0, 0.0, "*", "", wide_runtime, 4)
    queue = [wide]
    arrivals = sorted(
        (
            (at, QueuedJob(2 + i, "s", 0, at, "*", "", runtime, 1), frac)
            for i, (at, runtime, frac) in enumerate(stream)
        ),
        key=lambda a: (a[0], a[1].id),
    )
    durations = {j.id: (j.max_runtime or 900) * frac for _, j, frac in arrivals}
    promises: list[float] = []
    started = None
    for _ in range(500):  # bounded: every turn moves time forward or starts the wide job
        for d in [d for d, (end, _) in ends.items() if end <= now]:
            del ends[d]
        while arrivals and arrivals[0][0] <= now:
            queue.append(arrivals.pop(0)[1])
        slots = {
            d: Slot(d, BUSY, free_at=ends[d][1]) if d in ends else Slot(d, READY) for d in devices
        }
        p = plan(queue, slots, {"*": frozenset(devices)}, now)
        for job_id, got in p.assignments:
            j = next(x for x in queue if x.id == job_id)
            queue.remove(j)
            assert all(d not in ends for d in got)  # never two jobs on a device
            for d in got:
                bound = now + j.max_runtime if j.max_runtime else math.inf
                ends[d] = (now + (durations.get(job_id) or 0.0), bound)
            if job_id == 1:
                started = now
        if started is not None:
            break
        assert 1 in p.reservations, "the wide job, first in line, always reserves"
        promises.append(p.reservations[1].start_at)
        nxt = [e for e, _ in ends.values() if e > now] + [a for a, _, _ in arrivals]
        nxt += [t for t in promises if t > now]
        assert nxt, "nothing left to happen, and the wide job has not started"
        now = min(nxt)
    assert started is not None
    assert started <= min(promises, default=0.0), (started, promises)
    assert promises == sorted(promises, reverse=True), "a promise was put off"
    assert BACKFILL_DEPTH > len(stream)  # every stream job was within the backfill depth
