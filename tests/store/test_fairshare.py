"""Fair share (rc.controller.planning.fairshare, README "Sharing fairly"): its
arithmetic, its properties on the real planner, and the controller on a fake
clock.

The convergence properties simulate a lab with the real pieces: each tick,
the standings (fairshare.standings over decayed lease history) and plan()
decide who gets the devices that freed. Stated tolerance: over the second
half of a run of 40 half-lives, each user's device-time is within
TOLERANCE (5 percentage points) of their entitlement.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.controller.planning import QueuedJob, Slot, fairshare, plan
from rc.controller.planning.fairshare import FAIR_SHARE_MAX, adjustment, decayed, standings
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN, DeviceState, JobState
from tests.helpers.inprocess import T0

TOLERANCE = 0.05
READY = DeviceState.READY


@pytest.fixture
def lab(engine, lab):
    """conftest's Lab factory, each test on SQLite, then PostgreSQL (the
    engine fixture)."""
    return lab


# -- the arithmetic ----------------------------------------------------------


def test_the_adjustment_of_the_readme_example_and_its_bounds():
    assert adjustment(0.41, 0.25) == 3  # 0.64 over: ceil(2.56)
    assert adjustment(0.25, 0.25) == 0 and adjustment(0.1, 0.25) == 0
    assert adjustment(0.26, 0.25) == 1  # any excess is at least a step
    assert adjustment(1.0, 0.01) == FAIR_SHARE_MAX
    assert adjustment(0.5, 0.0) == 0


@given(st.floats(0, 1), st.floats(0.001, 1))
def test_the_adjustment_is_bounded_and_grows_with_the_share(share, entitled):
    a = adjustment(share, entitled)
    assert 0 <= a <= FAIR_SHARE_MAX
    assert (a == 0) == (share <= entitled)
    assert adjustment(min(1.0, share + 0.1), entitled) >= a


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1, 1e6), st.floats(60, 1e7))
def test_decayed_is_the_integral_of_the_decay(start, length, age, half_life):
    now = start + length + age
    got = decayed(start, start + length, now, half_life)
    assert 0 <= got <= length + 1e-6
    # split in two, the parts add up (the integral is additive)
    mid = start + length / 2
    parts = decayed(start, mid, now, half_life) + decayed(mid, start + length, now, half_life)
    assert math.isclose(got, parts, rel_tol=1e-9, abs_tol=1e-6)
    # one half-life later it counts half
    later = decayed(start, start + length, now + half_life, half_life)
    assert math.isclose(later, got / 2, rel_tol=1e-9, abs_tol=1e-6)


def test_a_lease_still_held_counts_up_to_now_and_a_future_one_nothing():
    assert decayed(0.0, None, 100.0, 1e9) == pytest.approx(100.0)
    assert decayed(200.0, None, 100.0, 3600) == 0.0


@given(
    st.dictionaries(st.sampled_from("abcde"), st.floats(0, 1e6)),
    st.dictionaries(st.sampled_from("abcde"), st.floats(0.01, 1000)),
    st.lists(st.sampled_from("abcde")),
)
def test_standings_entitlements_and_shares_add_up(usage, weights, queued):
    got = standings(usage, weights, queued)
    if not got:
        return
    assert math.isclose(sum(s.entitled for s in got.values()), 1.0)
    total = sum(s.usage for s in got.values())
    if total > 0:
        assert math.isclose(sum(s.share for s in got.values()), 1.0)
    assert standings(usage, weights, list(reversed(queued))) == got  # pure


# -- the planner's order with fair share ---------------------------------------

job_st = st.builds(
    QueuedJob,
    id=st.integers(1, 10_000),
    submitter=st.sampled_from(["ann", "bob", "cy"]),
    priority=st.integers(PRIORITY_MIN, PRIORITY_MAX),
    queued_at=st.floats(0, 100_000),
    selector=st.just("*"),
)
adjust_st = st.dictionaries(st.sampled_from(["ann", "bob", "cy"]), st.integers(0, FAIR_SHARE_MAX))


def _unique(jobs):
    return list({j.id: j for j in jobs}.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(job_st, max_size=40).map(_unique), adjust_st, st.sampled_from([60.0, 600.0]))
def test_fair_share_never_starves_anyone(jobs, adjust, aging):
    """Aging still bounds every wait: a job is ahead of every job queued
    (2 * PRIORITY_MAX + FAIR_SHARE_MAX + 1) aging steps after it, whatever
    the priorities and adjustments."""
    now = 200_000.0
    order = plan(jobs, {}, {}, now, aging=aging, adjust=adjust).order
    rank = {j: i for i, j in enumerate(order)}
    steps = 2 * PRIORITY_MAX + FAIR_SHARE_MAX + 1
    for a in jobs:
        for b in jobs:
            if b.queued_at >= a.queued_at + steps * aging:
                assert rank[a.id] < rank[b.id], (a, b)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(job_st, max_size=30).map(_unique),
    adjust_st,
    st.integers(0, 4),
    st.randoms(use_true_random=False),
)
def test_the_order_is_a_pure_function_of_the_snapshot(jobs, adjust, free, rnd):
    slots = {f"h:d{i}": Slot(f"h:d{i}", READY) for i in range(free)}
    matches = {"*": frozenset(slots)}
    first = plan(jobs, slots, matches, 50_000.0, aging=600, adjust=adjust)
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    again = plan(shuffled, slots, matches, 50_000.0, aging=600, adjust=dict(adjust))
    assert (again.order, again.assignments) == (first.order, first.assignments)


# -- convergence: a simulated lab on the real planner and standings --------------

TICK_S = 600.0


def _simulate(devices: int, length: int, half_life_ticks: int, weights: dict, seed: int):
    """Two users, ann and bob, each keeping `devices` jobs of `length` ticks
    queued at all times (equal streams, submitted in turns). Returns each
    user's device-ticks over the second half of the run."""
    half_life = half_life_ticks * TICK_S
    ticks = 40 * half_life_ticks
    leases: list[list] = []  # [user, from, to (None: held)]
    running: dict[str, tuple[str, int, int]] = {}  # device → (user, lease index, ends at tick)
    queue: list[QueuedJob] = []
    next_id = 1
    rnd = random.Random(seed)
    counted = {"ann": 0, "bob": 0}
    slots_all = {f"h:d{i}": Slot(f"h:d{i}", READY) for i in range(devices)}
    for tick in range(ticks):
        now = tick * TICK_S
        for d, (_user, lease, ends) in list(running.items()):
            if ends <= tick:
                del running[d]
                leases[lease][2] = now
        for user in rnd.sample(["ann", "bob"], 2):  # equal streams, in a random turn
            while sum(j.submitter == user for j in queue) < devices:
                queue.append(QueuedJob(next_id, user, 0, now, "*"))
                next_id += 1
        used: dict[str, float] = {}
        for user, a, r in leases:
            used[user] = used.get(user, 0.0) + decayed(a, r, now, half_life)
        got = standings(used, weights, [j.submitter for j in queue])
        adjust = {u: s.adjust for u, s in got.items() if s.adjust}
        free = {d: s for d, s in slots_all.items() if d not in running}
        p = plan(queue, free, {"*": frozenset(free)}, now, adjust=adjust)
        owner = {q.id: q.submitter for q in queue}
        for j, ds in p.assignments:
            running[ds[0]] = (owner[j], len(leases), tick + length)
            leases.append([owner[j], now, None])
        taken = {j for j, _ in p.assignments}
        queue = [q for q in queue if q.id not in taken]
        if tick >= ticks // 2:
            for user, _lease, _ends in running.values():
                counted[user] += 1
    return counted


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([6, 12]), st.integers(0, 2**16))
def test_equal_streams_converge_to_equal_shares(devices, length, half_life_ticks, seed):
    got = _simulate(devices, length, half_life_ticks, {}, seed)
    total = got["ann"] + got["bob"]
    assert abs(got["ann"] / total - 0.5) <= TOLERANCE, got


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([6, 12]), st.integers(0, 2**16))
def test_weight_two_converges_to_two_to_one(devices, length, half_life_ticks, seed):
    got = _simulate(devices, length, half_life_ticks, {"ann": 2.0}, seed)
    total = got["ann"] + got["bob"]
    assert abs(got["ann"] / total - 2 / 3) <= TOLERANCE, got


# -- the controller on a fake clock ----------------------------------------------


def _two_users_one_device(lb):
    """alice ran an hour on the one device; her second job was queued before
    bob's."""
    lb.register("h", {"cpu0": (0, {})})
    a1, _ = lb.submit("alice")
    lb.now = T0 + 100
    a2, _ = lb.submit("alice")
    lb.now = T0 + 200
    b1, _ = lb.submit("bob")
    lb.now = T0 + 3600
    lb.finish(a1)
    return a2, b1


def test_the_pass_puts_the_user_over_their_share_behind(lab):
    lb = lab(fair_share=7 * 86400.0)
    a2, b1 = _two_users_one_device(lb)
    assert lb.job(b1).state is JobState.ASSIGNED and lb.job(a2).state is JobState.QUEUED
    ex = lb.explain(a2)
    # alice: all the decayed usage, entitled to half: (1 / 0.5 - 1) / 0.25 = 4 steps
    assert ex.priority == (
        "priority 0 - fair share 4 (alice: 100% of recent device-hours (half-life 7d), "
        "entitled 50%) = -4"
    )


def test_without_fair_share_the_earlier_job_goes_first(lab):
    lb = lab()
    a2, b1 = _two_users_one_device(lb)
    assert lb.job(a2).state is JobState.ASSIGNED and lb.job(b1).state is JobState.QUEUED
    assert lb.explain(b1).priority == "priority 0 = 0"


def test_a_weight_changes_the_entitlement(lab):
    from rc.controller.store import usage

    lb = lab(fair_share=7 * 86400.0)
    lb.write(usage.set_weight, "alice", 3.0)
    lb.ctl.policy.shares.invalidate()
    a2, b1 = _two_users_one_device(lb)
    # entitled 75%, using 100%: ceil((1 / 0.75 - 1) / 0.25) = 2 steps, still behind bob
    assert lb.job(b1).state is JobState.ASSIGNED
    assert "fair share 2 (alice: 100%" in lb.explain(a2).priority
    assert "entitled 75%" in lb.explain(a2).priority
    assert fairshare.FAIR_SHARE_STEP == 0.25
