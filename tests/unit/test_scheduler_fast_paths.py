"""The scheduler's fast paths agree with the plain definitions: the pass that
reads the queue in SQL order and stops once every free device is settled
makes the same assignments as the full plan; SQLite orders the queue as
effective_priority does; positions() equals position() for every job."""

from __future__ import annotations

import math
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from rc.controller.planning import (
    QueuedJob,
    Slot,
    Snapshot,
    effective_priority,
    plan,
)
from rc.controller.store import queue, sqlite
from rc.controller.store import sql as store_sql
from rc.proto.model import DeviceState

DEVICES = [f"h:d{i}" for i in range(5)] + [f"g:d{i}" for i in range(3)]
SELECTORS = {
    "a": frozenset(DEVICES[:2]),
    "b": frozenset(DEVICES[1:4] + DEVICES[5:7]),
    "*": frozenset(DEVICES),
}

job_st = st.builds(
    QueuedJob,
    id=st.integers(1, 10**6),
    submitter=st.sampled_from(["ann", "bob", "cy"]),
    priority=st.integers(-10, 10),
    queued_at=st.floats(0, 10_000),
    selector=st.sampled_from(["", "a", "b", "*"]),
    device_id=st.sampled_from(DEVICES),
    max_runtime=st.sampled_from([0, 60, 7200]),
    count=st.sampled_from([1, 1, 1, 2, 3]),
).map(
    lambda j: (
        j
        if j.selector
        else QueuedJob(j.id, j.submitter, j.priority, j.queued_at, "", j.device_id, j.max_runtime)
    )
)
pinned_pair_st = st.builds(  # a job pinned to two devices of one host
    lambda i, who, prio, a: QueuedJob(
        i, who, prio, 0.0, "", "", 0, 2, (DEVICES[a], DEVICES[a + 1])
    ),
    st.integers(1, 10**6),
    st.sampled_from(["ann", "bob", "cy"]),
    st.integers(-10, 10),
    st.sampled_from([0, 1, 2, 3, 5, 6]),
)
job_st = st.one_of(job_st, job_st, job_st, pinned_pair_st)
slot_st = st.fixed_dictionaries(
    {
        d: st.builds(
            Slot,
            id=st.just(d),
            state=st.sampled_from(list(DeviceState)),
            max_runtime=st.sampled_from([0, 3600]),
            draining=st.booleans(),
            free_at=st.sampled_from([math.inf, 20_030.0, 20_100.0, 27_000.0]),
        )
        for d in DEVICES
    }
)


def _unique(jobs):
    seen, out = set(), []
    for j in jobs:
        if j.id not in seen:
            seen.add(j.id)
            out.append(j)
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(job_st, max_size=25).map(_unique),
    slot_st,
    st.sampled_from([0.0, 600.0]),
    st.integers(0, 2),
    st.dictionaries(st.sampled_from(["ann", "bob", "cy"]), st.integers(0, 3)),
)
def test_settled_pass_assigns_like_the_full_plan(jobs, slots, aging, cap, usage):
    now = 20_000.0
    full = plan(jobs, slots, SELECTORS, now, aging=aging, cap=cap, usage=usage)
    ordered = sorted(jobs, key=lambda j: (-effective_priority(j, now, aging), j.id))
    fast = plan(
        iter(ordered),
        slots,
        SELECTORS,
        now,
        aging=aging,
        cap=cap,
        usage=usage,
        ordered=True,
        until_settled=True,
    )
    assert fast.assignments == full.assignments


adjust_st = st.dictionaries(st.sampled_from(["ann", "bob", "cy"]), st.integers(1, 10))


@settings(max_examples=100, deadline=None)
@given(st.lists(job_st, max_size=30).map(_unique), st.sampled_from([0.0, 1.0, 600.0]), adjust_st)
def test_sqlite_orders_the_queue_like_effective_priority(tmp_path_factory, jobs, aging, adjust):
    """The queue SQLite orders (fair-share adjustments included) is the one
    plan() orders."""
    path = tmp_path_factory.mktemp("order") / "rc.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.row_factory = sqlite3.Row
    sqlite.add_functions(conn)
    sqlite.migrate(conn, str(path))
    for j in jobs:
        if j.device_ids:
            continue  # the order does not depend on the target
        conn.execute(
            "INSERT INTO jobs (id, kind, state, submitter, selector, device_id, command, "
            "priority, submitted_at, queued_at, unix_user, owner) VALUES (?, 'job', 'queued', "
            "?, ?, ?, '[]', ?, ?, ?, ?, 'uid:1')",
            (
                j.id,
                j.submitter,
                j.selector,
                j.device_id,
                j.priority,
                j.queued_at,
                j.queued_at,
                j.account,  # fair share's key: the Unix user
            ),
        )
    now = 20_000.0
    got = [
        r["id"]
        for r in conn.execute(
            store_sql.QUERIES["queued_jobs_ordered"],
            {"now": now, "aging": aging, "adjust": queue.adjust_param(adjust)},
        )
    ]
    want = [
        j.id
        for j in sorted(jobs, key=lambda j: (-effective_priority(j, now, aging, adjust), j.id))
        if not j.device_ids
    ]
    conn.close()
    assert got == want


@settings(max_examples=200, deadline=None)
@given(st.lists(job_st, max_size=25).map(_unique), slot_st, st.integers(0, 2))
def test_positions_in_one_sweep_equal_position_one_by_one(jobs, slots, cap):
    p = plan(jobs, slots, SELECTORS, 20_000.0, cap=cap, usage={"ann": 1})
    snap = Snapshot(list(jobs), slots, {}, p, 20_000.0)
    every = snap.positions()
    assert every == {j: snap.position(j) for j in p.order}


def test_a_rolled_back_label_change_never_stays_in_the_cache(tmp_path):
    """A transaction that changes labels, fills the writer's cache and then
    fails must not leave its labels in the cache (found in review)."""
    import asyncio

    from rc.controller.config import ControllerConfig
    from rc.controller.core import Controller
    from rc.controller.store import labels, workers
    from rc.proto.wire import DeviceDecl, RegisterRequest

    async def scenario():
        ctl = Controller(ControllerConfig(data_dir=str(tmp_path)), clock=lambda: 1.0e9)
        await ctl.start(loops=False)
        try:
            req = RegisterRequest(
                host="h", devices=(DeviceDecl("d0"),), labels={"d0": {"kind": "cpu"}}
            )
            await ctl.db.write(workers.register, req, ctl.match_cache, ctl.thresholds)

            def relabel_then_fail(tx):
                labels.set_labels(tx, "h", ("d0",), {"d0": {"kind": "gpu"}}, None, None, {})
                ctl.match_cache.invalidate()
                assert ctl.match_cache.matching(tx, "kind=gpu")  # the cache now says gpu...
                raise RuntimeError("and then the transaction fails")

            try:
                await ctl.db.write(relabel_then_fail)
            except RuntimeError:
                pass
            return await ctl.db.write(
                lambda tx: (
                    sorted(ctl.match_cache.matching(tx, "kind=gpu")),
                    sorted(ctl.match_cache.matching(tx, "kind=cpu")),
                )
            )
        finally:
            await ctl.stop()

    assert asyncio.run(scenario()) == ([], ["h:d0"])
