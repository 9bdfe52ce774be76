"""Coalesced heartbeats (Controller.heartbeat, store.workers.beat_check and
touch_beats) on the in-process controller and its fake clock: a heartbeat
that changes no state is kept in memory and written with the others; one
that changes state is written before its reply; the sweeper never judges
silence on stamps not yet written; a crash loses at most the kept ones,
and the startup grace covers them."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.controller.store.pg import PgDatabase
from tests.helpers.inprocess import T0, Lab

DEV = "box:gpu0"


@pytest.fixture
def lab(engine, lab):
    """conftest's Lab factory, each test on SQLite, then PostgreSQL (the
    engine fixture)."""
    return lab


def _beat_at(lb: Lab, table: str, key: str) -> float:
    query = {"workers": "worker_get", "devices": "device_get"}[table]
    return lb.read(lambda tx: tx.one(query, (key,))["last_heartbeat_at"])


def _state(lb: Lab) -> str:
    return lb.read(lambda tx: tx.one("device_get", (DEV,))["state"])


def _lease_until(lb: Lab, job_id: int) -> float:
    (until,) = [
        r["expires_at"] for r in lb.read(lambda tx: tx.all("leases_live")) if r["job_id"] == job_id
    ]
    return until


def _box(lab, **kw) -> Lab:
    lb = lab(**kw)
    lb.register("box", {"gpu0": (0, {})})
    assert _state(lb) == "ready"
    return lb


def test_a_quiet_heartbeat_is_written_with_the_others(lab):
    lb = _box(lab)
    lb.now = T0 + 10
    assert lb.heartbeat("box") == ([], {})
    assert _beat_at(lb, "workers", "box") == T0  # kept in memory
    assert lb.ctl.beats == {"box": (T0 + 10, ())}
    assert lb.run(lb.ctl.flush_beats()) == 1
    assert _beat_at(lb, "workers", "box") == T0 + 10
    assert _beat_at(lb, "devices", DEV) == T0 + 10
    assert lb.ctl.beats == {}


def test_a_coalesced_heartbeat_renews_the_named_job_lease(lab):
    lb = _box(lab)
    job_id, _ = lb.submit()
    lb.kick()
    assert lb.running_on(DEV) == job_id
    before = _lease_until(lb, job_id)
    lb.now = T0 + 100
    stop, _ = lb.heartbeat("box", (job_id,))
    assert stop == []
    assert _lease_until(lb, job_id) == before
    lb.run(lb.ctl.flush_beats())
    assert _lease_until(lb, job_id) >= T0 + 100 + lb.ctl.thresholds.lease_renewal


def test_a_heartbeat_that_changes_state_is_written_before_its_reply(lab):
    lb = _box(lab, startup_grace=0.0)
    lb.now = T0 + 31  # silence past unknown_after (30 s)
    lb.run(lb.ctl.sweep())
    assert _state(lb) == "unknown"
    lb.heartbeat("box")
    assert _state(lb) == "ready"  # no flush needed
    assert _beat_at(lb, "workers", "box") == T0 + 31
    assert lb.ctl.beats == {}


def test_the_sweeper_writes_the_kept_heartbeats_before_judging_silence(lab):
    lb = _box(lab, startup_grace=0.0)
    lb.now = T0 + 25
    lb.heartbeat("box")
    lb.now = T0 + 40  # 40 s after the stored stamp, 15 s after the kept one
    lb.run(lb.ctl.sweep())
    assert _state(lb) == "ready"
    assert _beat_at(lb, "workers", "box") == T0 + 25


def test_a_heartbeat_naming_an_ended_job_is_told_to_stop_it(lab):
    lb = _box(lab)
    job_id, _ = lb.submit()
    lb.kick()
    lb.finish(job_id)
    assert lb.heartbeat("box", (job_id,))[0] == [job_id]


def test_an_unregistered_worker_is_refused_on_the_quiet_path_too(lab):
    lb = _box(lab)
    with pytest.raises(Refused, match="not registered"):
        lb.heartbeat("nobody")


def test_flush_zero_writes_every_heartbeat_at_once(lab):
    lb = _box(lab, heartbeat_flush=0.0)
    lb.now = T0 + 10
    lb.heartbeat("box")
    assert _beat_at(lb, "workers", "box") == T0 + 10
    assert lb.ctl.beats == {}


@pytest.mark.usefixtures("engine")
def test_a_crash_loses_at_most_the_kept_heartbeats_and_the_grace_covers_them(tmp_path):
    """The controller dies with a heartbeat kept in memory (never flushed):
    its successor sees the older stamp, and within its startup grace
    nothing is written off; the worker's next heartbeat puts it right."""
    data = tmp_path / "data"
    first = Lab(data, lost_after=60.0)
    first.register("box", {"gpu0": (0, {})})
    first.now = T0 + 50
    first.heartbeat("box")
    first.ctl.beats.clear()  # what a crash loses
    first.close()
    second = Lab(data, lost_after=60.0, startup_grace=30.0, now=T0 + 55)
    try:
        second.now = T0 + 70  # 70 s after the stored stamp, 15 s into the grace
        second.run(second.ctl.sweep())
        assert _state(second) != "unhealthy"
        second.heartbeat("box")  # devices came back unknown at the start: written now
        assert _state(second) == "ready"
        assert _beat_at(second, "workers", "box") == T0 + 70
        second.now = T0 + 120  # past the grace, 50 s after the heartbeat written
        second.run(second.ctl.sweep())
        assert _state(second) != "unhealthy"
    finally:
        second.close()


def _counting_reads(lb: Lab) -> list[str]:
    """Record every heartbeat check (store.workers.beat_check) the controller reads."""
    seen: list[str] = []
    read = lb.ctl.db.read

    async def counted(fn, *args):
        if fn.__name__ == "beat_check":
            seen.append(fn.__name__)
        return await read(fn, *args)

    lb.ctl.db.read = counted
    return seen


def test_a_quiet_heartbeat_is_answered_from_memory_until_a_write(lab):
    lb = _box(lab)
    reads = _counting_reads(lb)
    lb.heartbeat("box")
    assert reads == ["beat_check"]
    lb.now = T0 + 10
    assert lb.heartbeat("box") == ([], {})
    assert reads == ["beat_check"]  # no read: nothing was written since the check
    assert lb.ctl.beats == {"box": (T0 + 10, ())}  # still kept, written by the flush
    lb.run(lb.ctl.flush_beats())  # soft state only: the answer stays valid
    lb.heartbeat("box")
    assert reads == ["beat_check"]
    assert _beat_at(lb, "workers", "box") == T0 + 10
    lb.submit()  # a write that changes rows: the next heartbeat checks again
    lb.heartbeat("box")
    assert reads == ["beat_check", "beat_check"]


def test_a_write_that_changes_nothing_keeps_the_quiet_answer_on_sqlite(lab):
    lb = _box(lab)
    reads = _counting_reads(lb)
    lb.heartbeat("box")
    lb.kick()  # the scheduling tick: nothing queued, no row changes
    lb.heartbeat("box")
    # on SQLite a batch knows whether it changed rows (Tx.wrote); on PostgreSQL every batch counts
    expected = 2 if isinstance(lb.ctl.db, PgDatabase) else 1
    assert reads == ["beat_check"] * expected


def test_a_sweep_to_unknown_ends_the_quiet_answer_and_the_change_is_written_before_the_reply(lab):
    lb = _box(lab, startup_grace=0.0)
    lb.heartbeat("box")
    lb.heartbeat("box")  # answered from memory now
    lb.run(lb.ctl.flush_beats())
    lb.now = T0 + 31  # silence past unknown_after (30 s)
    lb.run(lb.ctl.sweep())
    assert _state(lb) == "unknown"
    lb.heartbeat("box")
    assert _state(lb) == "ready"  # written before the reply, no flush needed
    assert _beat_at(lb, "workers", "box") == T0 + 31
    assert lb.ctl.beats == {}


def test_a_heartbeat_naming_jobs_is_never_answered_from_memory(lab):
    lb = _box(lab)
    job_id, _ = lb.submit()
    lb.kick()
    reads = _counting_reads(lb)
    lb.heartbeat("box", (job_id,))
    lb.heartbeat("box", (job_id,))
    assert reads == ["beat_check", "beat_check"]
    assert "box" not in lb.ctl.quiet


def test_the_write_generation_moves_only_for_a_batch_that_changed_rows(lab):
    lb = _box(lab)
    db = lb.ctl.db
    on_sqlite = not isinstance(db, PgDatabase)

    def after(fn) -> int:
        before = db.generation
        lb.write(fn)
        return db.generation - before

    assert after(lambda tx: tx.all("workers_all")) == (0 if on_sqlite else 1)
    assert after(lambda tx: tx.exec("worker_touch", (T0, "nobody"))) == (0 if on_sqlite else 1)
    assert after(lambda tx: tx.exec("worker_touch", (T0 + 1, "box"))) == 1
    # an INSERT ... RETURNING read with one(): sqlite3 has not counted its row yet
    assert (
        after(lambda tx: tx.scalar("event_insert", (T0, "device_drained", DEV, None, "t", "x")))
        == 1
    )
    before = db.generation
    lb.run(db.write_soft(lambda tx: tx.exec("worker_touch", (T0 + 2, "box"))))
    assert db.generation == before  # soft state only

    def fails(tx):
        tx.exec("worker_touch", (T0 + 3, "box"))
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        lb.write(fails)
    assert db.generation == before + 1  # conservative: a function that raised counts
