"""The usage ledger (rc.controller.store.usage.report) against a history
computed by hand, on the in-process controller's fake clock."""

from __future__ import annotations

import datetime as dt

import pytest

from rc.controller.errors import Refused
from rc.controller.store import usage
from rc.proto.model import JobKind, JobState
from tests.helpers.inprocess import T0
from tests.helpers.usage_history import _known_days

FOUR = {f"cpu{i}": (0, {}) for i in range(4)}


@pytest.fixture
def lab(engine, lab):
    """conftest's Lab factory, each test on SQLite, then PostgreSQL (the
    engine fixture)."""
    return lab


def _history(lb):
    """alice: job A on 4 devices T0..T0+1h; hold H on 1 device T0+1h..T0+2h,
    no session. bob: job C queued at T0+10m, runs T0+1h..T0+1.5h (waited
    50m); job B from T0+1h, still running."""
    lb.register("h", FOUR)
    a, _ = lb.submit("alice", count=4)
    assert lb.job(a).state is JobState.ASSIGNED
    lb.now = T0 + 600
    c, _ = lb.submit("bob")
    assert lb.job(c).state is JobState.QUEUED
    lb.now = T0 + 3600
    lb.finish(a)
    assert lb.job(c).state is JobState.ASSIGNED
    b, _ = lb.submit("bob")
    h, _ = lb.submit("alice", kind=JobKind.HOLD, max_runtime_seconds=7200, reason="r")
    assert lb.job(b).state is JobState.ASSIGNED and lb.job(h).state is JobState.ASSIGNED
    lb.now = T0 + 5400
    lb.finish(c)
    lb.now = T0 + 7200
    lb.finish(h)
    lb.now = T0 + 9000
    return a, b, c, h


def test_the_ledger_by_user_matches_the_history_by_hand(lab):
    lb = lab()
    _history(lb)
    # the window starts inside job A: only its last 30 minutes count, on 4 devices
    got = lb.read(usage.report, T0 + 1800, "user")
    rows = {r.key: r for r in got.rows}
    assert [r.key for r in got.rows] == ["alice", "bob"]  # most device-time first
    alice, bob = rows["alice"], rows["bob"]
    assert alice.device_seconds == 4 * 1800 + 3600
    assert alice.idle_hold_seconds == 3600  # no session was opened in the hold
    assert alice.jobs == {"succeeded": 1} and alice.holds == {"succeeded": 1}
    assert (alice.waits, alice.wait_p50_seconds, alice.wait_p95_seconds) == (1, 0, 0)  # the hold
    assert bob.device_seconds == 1800 + 5400  # B is still running: counted up to now
    assert bob.jobs == {"assigned": 1, "succeeded": 1}
    assert (bob.waits, bob.wait_p50_seconds, bob.wait_p95_seconds) == (2, 0, 3000)
    assert got.total.device_seconds == 4 * 1800 + 3600 + 1800 + 5400
    assert got.total.waits == 3  # A was granted before the window
    assert (got.since, got.until) == (T0 + 1800, T0 + 9000)


def test_the_ledger_by_host_device_and_one_user(lab):
    lb = lab()
    *_, h = _history(lb)
    by_host = lb.read(usage.report, T0 - 60, "host")
    assert [(r.key, r.device_seconds) for r in by_host.rows] == [
        ("h", 4 * 3600 + 3600 + 1800 + 5400)
    ]
    by_device = lb.read(usage.report, T0 - 60, "device")
    assert sum(r.device_seconds for r in by_device.rows) == by_host.total.device_seconds
    assert {r.key for r in by_device.rows} == {f"h:cpu{i}" for i in range(4)}
    mine = lb.read(usage.report, T0 - 60, "user", "bob")
    assert [r.key for r in mine.rows] == ["bob"] and mine.total.device_seconds == 1800 + 5400
    # a session opened in the hold: its hours are no longer idle
    lb.write(usage.session_opened, h)
    assert lb.read(usage.report, T0 - 60, "user", "alice").total.idle_hold_seconds == 0


def test_a_lease_across_midnight_is_cut_into_its_days(lab):
    lb = lab()
    lb.register("h", FOUR)
    midnight = dt.datetime.fromtimestamp(T0, dt.UTC).replace(hour=0, minute=0, second=0)
    start = midnight.timestamp() + 86400 - 1800  # 23:30 the day of T0
    lb.now = start
    j, _ = lb.submit("alice")
    lb.now = start + 3600  # 00:30 the next day
    lb.finish(j)
    got = lb.read(usage.report, start - 3600, "day")
    day1 = midnight.strftime("%Y-%m-%d")
    day2 = (midnight + dt.timedelta(days=1)).strftime("%Y-%m-%d")
    assert [(r.key, r.device_seconds) for r in got.rows] == [(day1, 1800), (day2, 1800)]
    week = lb.read(usage.report, start - 3600, "week")
    assert sum(r.device_seconds for r in week.rows) == 3600


def test_a_bad_by_is_refused_by_name(lab):
    lb = lab()
    with pytest.raises(Refused) as e:
        lb.read(usage.report, T0, "month")
    assert e.value.status == 400 and "month" in e.value.message


def test_percentile_is_nearest_rank():
    assert usage.percentile([], 0.5) == 0.0
    assert usage.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert usage.percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_the_usage_picture_draws_the_ledger_of_each_day(lab):
    from xml.etree import ElementTree

    from rc.controller import charts

    lb = lab()
    today = (T0 // 86400 + 10) * 86400
    _known_days(lb, today)
    names, seconds, waits = lb.read(usage.daily, 14)
    d2, d1, d0 = (usage._day(today - k * 86400) for k in (2, 1, 0))
    assert names[-3:] == [d2, d1, d0] and len(names) == 14
    assert seconds == {(d2, "alice"): 7200, (d1, "bob"): 10800, (d1, "carol"): 600}
    assert waits == {d2: (0, 0), d1: (0, 600)}  # bob waited behind carol's hold
    svg = ElementTree.fromstring(charts.usage_svg(names, seconds, waits))
    ns = "{http://www.w3.org/2000/svg}"
    bars = {
        (r.get("data-day"), r.get("data-user")): r
        for r in svg.iter(f"{ns}rect")
        if r.get("data-day")
    }
    assert {k: float(r.get("data-seconds")) for k, r in bars.items()} == seconds
    height = {k: float(r.get("height")) for k, r in bars.items()}
    assert height[(d1, "bob")] / height[(d2, "alice")] == pytest.approx(1.5)
    # stacked: carol's bar sits on bob's
    assert float(bars[(d1, "carol")].get("y")) + height[(d1, "carol")] == pytest.approx(
        float(bars[(d1, "bob")].get("y"))
    )
    points = {c.get("data-day"): c.get("data-p95") for c in svg.iter(f"{ns}circle")}
    assert points == {d2: "0", d1: "600"}


def test_the_usage_picture_escapes_names():
    from xml.etree import ElementTree

    from rc.controller import charts

    name = '<b x="1">&'
    svg = charts.usage_svg(["2026-01-01"], {("2026-01-01", name): 60.0}, {})
    assert "<b " not in svg and "&lt;b x=" in svg
    tree = ElementTree.fromstring(svg)  # well-formed: the name stayed text
    assert [e.get("data-user") for e in tree.iter() if e.get("data-user")] == [name]
    assert all(e.tag.startswith("{http://www.w3.org/2000/svg}") for e in tree.iter())
