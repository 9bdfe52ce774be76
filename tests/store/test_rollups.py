"""The ledger's daily rollups and history that ends (rc.controller.store.rollups,
rc.controller.store.ledger): the same ledger before a
history is rolled up, after, and after its old jobs are deleted, on both
engines."""

from __future__ import annotations

import math
import random

import pytest

from rc.controller.store import rollups, usage
from rc.proto.model import JobKind, JobState
from tests.helpers.inprocess import T0

DAY = 86400.0


@pytest.fixture
def lab(engine, lab):
    """conftest's Lab factory, each test on SQLite, then PostgreSQL."""
    return lab


def _history(lb, seed: int = 7, steps: int = 60) -> None:
    """Three users, two hosts, jobs of 1 to 3 devices and holds (some with a
    session), some across midnights, one cancelled while queued; at the end
    everything has finished."""
    rnd = random.Random(seed)
    lb.register("h1", {f"cpu{i}": (0, {}) for i in range(4)})
    lb.register("h2", {f"cpu{i}": (0, {}) for i in range(2)})
    live: list[int] = []
    for step in range(steps):
        lb.now += rnd.choice((120.0, 900.0, 3600.0, 5 * 3600.0, 20 * 3600.0))
        for j in list(live):
            if rnd.random() < 0.4 and lb.job(j).state in (JobState.ASSIGNED, JobState.RUNNING):
                lb.finish(j, rnd.choice((JobState.SUCCEEDED, JobState.FAILED)))
                live.remove(j)
        who = rnd.choice(("alice", "bob", "carol"))
        if step % 7 == 3:
            h, _ = lb.submit(who, kind=JobKind.HOLD, max_runtime_seconds=86400, reason="r")
            if step % 2:
                lb.write(usage.session_opened, h)
            live.append(h)
        else:
            j, _ = lb.submit(who, count=rnd.choice((1, 1, 2, 3)))
            live.append(j)
        if step == 11:
            q, _ = lb.submit("bob", count=4)
            if lb.job(q).state is JobState.QUEUED:
                lb.kill(q, "bob")
    for _ in range(200):
        lb.now += 3600.0
        for j in list(live):
            if lb.job(j).state in (JobState.ASSIGNED, JobState.RUNNING):
                lb.finish(j)
                live.remove(j)
            elif lb.job(j).finished_at is not None:
                live.remove(j)
        if not live:
            break
    assert not live
    lb.now += 600.0


def _same(a, b, exact_waits: bool) -> None:
    assert [r.key for r in a.rows] == [r.key for r in b.rows]
    for x, y in zip((*a.rows, a.total), (*b.rows, b.total), strict=True):
        assert x.device_seconds == pytest.approx(y.device_seconds, abs=0.01), x.key
        assert x.idle_hold_seconds == pytest.approx(y.idle_hold_seconds, abs=0.01), x.key
        assert (x.jobs, x.holds, x.waits) == (y.jobs, y.holds, y.waits), x.key
        for p, q in (
            (x.wait_p50_seconds, y.wait_p50_seconds),
            (x.wait_p95_seconds, y.wait_p95_seconds),
        ):
            if exact_waits:
                assert p == pytest.approx(q, abs=0.001), x.key
            else:  # a rolled-up wait is its histogram bucket's upper edge: within 9 %
                assert q - 0.002 <= p <= q * 2 ** (1 / 8) + 0.002, x.key


def _windows(lb) -> list[float]:
    end = lb.now
    first_midnight = math.floor(T0 / DAY) * DAY + DAY
    return [T0 - 3600, first_midnight, T0 + 1.37 * DAY, end - 2.6 * DAY, end - 7000]


def _ledgers(lb, horizon: float = 0.0) -> dict:
    return {
        (since, by): lb.read(lambda tx, s=since, b=by: usage.report(tx, s, b, "", horizon))
        for since in _windows(lb)
        for by in ("user", "host", "day", "week")
    }


def _roll_all(lb) -> int:
    n = 0
    while got := lb.write(rollups.roll_up, 7):  # small batches: many upserts of one row
        n += got
    return n


def test_rolled_up_the_ledger_is_the_same(lab):
    lb = lab()
    _history(lb)
    before = _ledgers(lb)
    assert sum(r.total.device_seconds for r in before.values()) > 0
    assert _roll_all(lb) > 10
    assert lb.read(lambda tx: tx.scalar("rollup_candidates", (10,))) is None
    after = _ledgers(lb)
    for k in before:
        _same(after[k], before[k], exact_waits=False)
    by_user = lb.read(usage.device_seconds_by_user)
    assert sum(by_user.values()) == pytest.approx(
        before[(T0 - 3600, "user")].total.device_seconds, abs=0.01
    )


def test_a_job_still_running_counts_beside_the_rollups(lab):
    lb = lab()
    _history(lb, seed=3, steps=30)
    _roll_all(lb)
    j, _ = lb.submit("alice", count=2)
    lb.now += 1800
    got = lb.read(usage.report, T0 - 3600, "user", "alice")
    assert got.total.jobs.get("assigned") == 1
    lb.finish(j)
    done = lb.read(usage.report, T0 - 3600, "user", "alice")
    _roll_all(lb)
    _same(lb.read(usage.report, T0 - 3600, "user", "alice"), done, exact_waits=False)
    assert done.total.device_seconds == pytest.approx(got.total.device_seconds, abs=0.01)


def test_expired_jobs_are_deleted_and_the_ledger_stays(lab):
    lb = lab()
    _history(lb, seed=11)
    _roll_all(lb)
    before = _ledgers(lb)
    cutoff = lb.now - 1.0  # rc serve --retain 1s
    ids: list[int] = []
    while got := lb.write(rollups.expire, cutoff, 5):
        ids += got
    assert ids and lb.read(lambda tx: tx.scalar("retain_expired_jobs", (cutoff, 10))) is None
    left = lb.read(
        lambda tx: [r[0] for r in tx.all("log_owners", (f"[{','.join(map(str, ids))}]",))]
    )
    assert left == []
    assert lb.read(lambda tx: tx.all("ledger_job_leases", (f"[{','.join(map(str, ids))}]",))) == []
    after = _ledgers(lb, horizon=cutoff)
    for (since, by), b in before.items():
        if since < cutoff and since != math.floor(since / DAY) * DAY:
            # the first day of a window older than the retention is counted
            # whole: its total covers the earlier one's
            assert after[(since, by)].total.device_seconds >= b.total.device_seconds - 0.01
            continue
        _same(after[(since, by)], b, exact_waits=False)


def test_a_job_that_a_waiting_job_depends_on_is_kept(lab):
    lb = lab()
    lb.register("h1", {"cpu0": (0, {})})
    a, _ = lb.submit("alice")
    lb.now += 60
    hold, _ = lb.submit("bob", kind=JobKind.HOLD, max_runtime_seconds=3600, reason="r")
    lb.finish(a)
    assert lb.job(hold).state is JobState.ASSIGNED
    b, _ = lb.submit("alice", after=(f"{a}:ok",))  # waits for the hold's device
    lb.now += 600
    _roll_all(lb)
    assert lb.write(rollups.expire, lb.now - 1) == []
    lb.finish(hold)
    assert lb.job(b).state is JobState.ASSIGNED
    lb.now += 60
    lb.finish(b)
    lb.now += 60
    _roll_all(lb)
    got = []
    while ids := lb.write(rollups.expire, lb.now - 1):
        got += ids
    assert sorted(got) == sorted((a, b, hold))


@pytest.mark.parametrize("wait", [0.0, 0.0004, 0.001, 0.5, 1.0, 59.9, 3600.0, 86400.0 * 30])
def test_a_wait_is_within_its_bucket(wait):
    b = rollups.bucket(wait)
    v = rollups.bucket_value(b)
    assert v >= wait - 1e-12
    if wait >= 0.001:
        assert v <= wait * 2 ** (1 / rollups.BUCKETS_PER_DOUBLING) * (1 + 1e-9)
    assert (b == -1) == (wait == 0)
