"""A queued job's position as its own view counts it (views.queue_position,
the `queue_ahead_by_ask` query with the aging rule written inline in SQL)
equals its place in the plan (views.state, which orders the queue with
rc.controller.planning.aged_priority): on both engines, at aging boundaries
and with fair-share adjustments."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rc.controller.store import views
from tests.helpers.inprocess import T0, Lab

AGING = 60.0

# (priority, seconds after T0 it was submitted, submitter)
queued = st.lists(
    st.tuples(
        st.integers(-3, 3),
        st.sampled_from([0.0, 0.5, 59.5, 60.0, 61.0, 119.999, 120.0, 300.0]),
        st.sampled_from(["alice", "bob"]),
    ),
    min_size=1,
    max_size=8,
)
# seconds after T0 the positions are read: on a step, just before one, between
looked_at = st.sampled_from([300.0, 359.999, 360.0, 360.001, 420.0, 480.0, 1000.0])
adjust = st.sampled_from([{}, {"alice": 1}, {"bob": 3}, {"alice": 2, "bob": 1}])


def positions(lab: Lab, adjusted: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(planned, counted): job id → position, as rc ps plans the queue and as
    each job's view counts it, with fair share's `adjusted` steps."""
    policy = dataclasses.replace(lab.ctl.policy, shares=_Fixed(adjusted) if adjusted else None)

    def read(tx):
        planned = views.state(tx, policy).queue_positions
        counted = {
            str(j): views.job_view(tx, j, policy).queue_position
            for j in (r["id"] for r in tx.all("queued_jobs", {"now": tx.now}))
        }
        return planned, counted

    return lab.read(read)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"], indirect=True)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(jobs=queued, at=looked_at, adjusted=adjust)
def test_a_counted_position_is_the_planned_one(engine, jobs, at, adjusted):
    lab = Lab(aging=AGING)
    try:
        # one device, busy: everything submitted stays queued
        lab.register("h", {"cpu0": (0, {})})
        lab.submit(who="carol", command=("sleep", "1000"))
        lab.kick()
        for prio, after, who in sorted(jobs, key=lambda j: j[1]):
            lab.now = T0 + after
            lab.submit(who=who, priority=prio)
        lab.now = T0 + at
        planned, counted = positions(lab, adjusted)
        assert len(counted) == len(jobs)
        assert counted == planned
    finally:
        lab.close()


class _Fixed:
    """Fair share standing still: fixed adjustments (user → steps)."""

    def __init__(self, adjust: dict[str, int]) -> None:
        self.adjust = adjust

    def adjustments(self, tx) -> dict[str, int]:
        return dict(self.adjust)


def _plan(lab: Lab, name: str, params) -> list[str]:
    from rc.controller.store.sql import QUERIES

    rows = lab.read(
        lambda tx: tx.conn.execute("EXPLAIN QUERY PLAN " + QUERIES[name], params).fetchall()
    )
    return [r[3] for r in rows]


def test_the_counts_every_submit_makes_read_only_the_queue(tmp_path):
    """Every submit's reply counts the jobs ahead of it, and the per-user
    queued limit and budget count the Unix user's queued jobs: both through partial
    indexes of queued jobs (schema 9; by Unix user since schema 10), never
    the whole jobs table. The count of the limit went through
    jobs_by_submitter, every job the user ever had. SQLite's plans; PostgreSQL's planner picks by the table's statistics."""
    lab = Lab(tmp_path / "data", database="")
    try:
        for query, adjust in (
            ("queue_ahead_by_ask", "{}"),
            ("queue_ahead_by_ask_adjusted", '{"bob": 1}'),
        ):
            params = {"id": 1, "eff": 0, "now": T0, "aging": AGING, "adjust": adjust}
            ahead = _plan(lab, query, params)
            assert any("USING COVERING INDEX jobs_queue_ask" in d for d in ahead), (query, ahead)
            assert not any("TEMP B-TREE" in d for d in ahead), (query, ahead)
        mine = _plan(lab, "queued_of_user", ("alice",))
        # schema 11: with the budget's spec bytes, still the index alone
        assert any("COVERING INDEX jobs_queued_by_user" in d for d in mine), mine
    finally:
        lab.close()


@pytest.mark.parametrize(
    "held",
    [
        {"array": "0-3%1"},  # elements of a capped array: one runs at a time
        {"after": ("1:ok",)},  # a job waiting on the first's end
    ],
)
def test_a_held_job_makes_the_views_plan_the_queue(tmp_path, held):
    """Where a capped array's element or a job with a dependency is queued,
    only a plan knows which jobs are held back (any_held_queued), and every
    job's view counts as the plan does: behind nothing that cannot start."""
    lab = Lab(tmp_path / "data", database="", aging=AGING)
    try:
        lab.register("h", {"cpu0": (0, {}), "cpu1": (0, {})})
        first, _ = lab.submit(command=("sleep", "1000"))
        lab.submit(command=("sleep", "1000"))
        lab.kick()
        assert first == 1
        lab.submit(who="bob", **held)
        lab.submit(who="carol")
        planned, counted = positions(lab, {})
        assert counted == planned
        assert len(counted) == (5 if "array" in held else 2)
    finally:
        lab.close()
