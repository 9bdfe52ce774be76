"""The idle rule of holds (README "Holds: the idle rule") on a fake clock: the
real controller in-process (tests.helpers.inprocess.Lab), its real store, the idle
watch driven by `Controller.idle_pass`; the worker's sampler on captured
/proc text and a fake nvidia-smi reporting utilisation."""

from __future__ import annotations

import pytest

from rc.controller.config import Limits
from rc.controller.errors import Refused
from rc.controller.idle import warn_lead
from rc.controller.store import events, jobs
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, JobKind, JobState, Role
from rc.proto.wire import SubmitRequest
from rc.worker import usage
from tests.helpers.hold_idle import (
    STAT,
    _kinds,
    _running_hold,
    lab,  # noqa: F401 (fixtures)
)
from tests.helpers.inprocess import Lab, local_user


def test_the_warning_lead_is_ten_minutes_or_half_the_timeout():
    assert warn_lead(7200) == 600
    assert warn_lead(600) == 300
    assert warn_lead(3) == 1.5


def test_an_unused_hold_is_warned_then_released_idle(lab):
    lb = lab()
    hold_id = _running_hold(lb, idle=3600)
    lb.now += 3000 - 1
    assert lb.run(lb.ctl.idle_pass()) == ([], [])
    lb.now += 1  # 10 minutes before the limit
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])
    assert _kinds(lb, hold_id) == [EventKind.HOLD_IDLE_WARNING]
    warning = lb.read(events.after, 0, 100)[-1]
    assert f"hold {hold_id} is idle and will be released at" in warning.text
    assert "no input" in warning.text and "no forward" in warning.text
    assert lb.run(lb.ctl.idle_pass()) == ([], [])  # warned once
    lb.now += 600
    assert lb.run(lb.ctl.idle_pass()) == ([], [])  # no use report since the warning yet
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=None, cpu_pct=0)
    assert lb.run(lb.ctl.idle_pass()) == ([], [hold_id])
    j = lb.job(hold_id)
    assert j.state is JobState.RUNNING  # until its worker has ended it
    assert j.kill_reason == "idle: no use for 1h"
    assert _kinds(lb, hold_id) == [EventKind.HOLD_IDLE_WARNING, EventKind.HOLD_RECLAIMED]
    lb.finish(hold_id, JobState.KILLED)
    assert lb.job(hold_id).kill_reason == "idle: no use for 1h"
    assert lb.run(lb.ctl.idle_pass()) == ([], [])


def test_use_resets_the_clock_and_rearms_the_warning_extend_does_not(lab):
    lb = lab()
    hold_id = _running_hold(lb, idle=100)
    lb.now += 50
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])
    lb.ctl.idle.touch(hold_id, lb.now, "input")  # typed into a session
    lb.now += 99
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])  # warned again at 50 s, not released
    assert lb.ctl.hold_idle(lb.job(hold_id), 100).idle_seconds == 99
    lb.write(jobs.extend, hold_id, local_user("alice"), 3600, 600.0, lb.ctl.match_cache)
    assert lb.ctl.hold_idle(lb.job(hold_id), 100).idle_seconds == 99  # ttl only
    lb.ctl.idle.report(hold_id, lb.now, True, gpu_pct=87, cpu_pct=None)  # its GPU busy
    lb.now += 60
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=0, cpu_pct=None)  # idle GPU: no reset
    lb.ctl.idle.touch(hold_id, lb.now - 10, "forward")
    state = lb.ctl.hold_idle(lb.job(hold_id), 100)
    assert state.state == "idle 10s: input 2m39s ago, GPU 0 %, forward 10s ago"
    assert state.reclaim_at == lb.now - 10 + 100
    lb.now += 40
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])
    lb.now += 50
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=0, cpu_pct=None)
    assert lb.run(lb.ctl.idle_pass()) == ([], [hold_id])
    assert lb.job(hold_id).kill_reason == "idle: no use for 1m40s"


def test_a_hold_is_released_only_after_a_use_report_since_its_warning(lab):
    """Use of a hold's GPU or CPU is read only at its worker's heartbeats (10 s
    apart by default): a hold whose idle timeout is shorter is not released
    before a report that arrived after its warning says it is unused. A
    report from before the warning, or one that read nothing (a CPU hold's
    first sample), says nothing; a busy one starts the clock again."""
    lb = lab()
    hold_id = _running_hold(lb, idle=4)
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=None, cpu_pct=0)  # before the warning
    lb.now += 2
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])
    lb.now += 3  # idle past its limit, no report since the warning: wait for one
    assert lb.run(lb.ctl.idle_pass()) == ([], [])
    lb.now += 5
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=None, cpu_pct=None)  # read nothing
    assert lb.run(lb.ctl.idle_pass()) == ([], [])
    assert lb.job(hold_id).kill_reason == ""
    lb.ctl.idle.report(hold_id, lb.now, True, gpu_pct=None, cpu_pct=100)  # a core spinning
    assert lb.ctl.hold_idle(lb.job(hold_id), 4).state == "idle 0s: no input, CPU 100 %, no forward"
    lb.now += 2
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])  # a new idle spell, warned again
    lb.now += 3
    assert lb.run(lb.ctl.idle_pass()) == ([], [])  # the report at 100 % came before this warning
    lb.ctl.idle.report(hold_id, lb.now, False, gpu_pct=None, cpu_pct=0)
    assert lb.run(lb.ctl.idle_pass()) == ([], [hold_id])
    assert lb.job(hold_id).kill_reason == "idle: no use for 4s"


def test_the_default_the_maximum_and_off(lab):
    lb = lab(limits=Limits(hold_idle_timeout=7200, hold_idle_timeout_max=14400))
    default = _running_hold(lb)
    assert lb.read(jobs.hold_idle_timeout, default) == 7200
    alice = local_user("alice")
    admin = local_user("root", Role.ADMIN)
    from rc.controller.submission import validate_submit

    def ask(who, seconds):
        req = SubmitRequest(
            kind=JobKind.HOLD,
            selector="*",
            max_runtime_seconds=60,
            reason="r",
            hold_idle_timeout_seconds=seconds,
        )
        return validate_submit(req, who, lb.ctl.cfg.limits).hold_idle

    assert ask(alice, 3600) == 3600
    for seconds, words in ((0, "not turned off"), (28800, "not 8h")):
        with pytest.raises(Refused) as e:
            ask(alice, seconds)
        assert e.value.code == ErrorCode.LIMIT_EXCEEDED
        assert f"at most 4h here, {words}" in e.value.message
        assert ask(admin, seconds) == seconds
    with pytest.raises(Refused, match="cannot be negative"):
        ask(alice, -1)
    with pytest.raises(Refused, match="is for a hold"):
        validate_submit(
            SubmitRequest(command=("true",), selector="*", hold_idle_timeout_seconds=60),
            alice,
            lb.ctl.cfg.limits,
        )


def test_a_hold_with_the_rule_off_is_never_released(lab):
    lb = lab()
    hold_id = _running_hold(lb, idle=0)
    lb.now += 30 * 86400
    assert lb.run(lb.ctl.idle_pass()) == ([], [])
    assert lb.ctl.hold_idle(lb.job(hold_id), 0).idle_seconds is None


def test_the_clock_starts_no_earlier_than_the_controller(lab):
    """After a restart the clock starts again: an idle hold is released late, never early."""
    lb = lab()
    hold_id = _running_hold(lb, idle=100)
    lb.ctl.idle.floor = lb.now + 80  # as if the controller had started 80 s after the hold
    lb.now += 99
    assert lb.run(lb.ctl.idle_pass()) == ([], [])
    lb.now += 31
    assert lb.run(lb.ctl.idle_pass()) == ([hold_id], [])


def test_cpu_ticks_are_read_after_the_last_parenthesis():
    assert usage.cpu_ticks(STAT.format(u=250, s=50)) == 300
    assert usage.cpu_ticks("garbage") is None


def test_utilization_is_parsed_and_unreadable_gpus_left_out():
    text = "0, 87\n1, [N/A]\n2, 0\n"
    assert usage.parse_utilization(text) == {"0": 87, "2": 0}


def test_the_idle_watch_reads_active_jobs_only(tmp_path):
    """It runs every second: through the partial index of active jobs, never
    a scan of every job ever submitted. SQLite's plan (its INDEXED BY);
    PostgreSQL's planner picks the index by the table's statistics."""
    from rc.controller.store.sql import QUERIES

    lb = Lab(tmp_path / "data")
    try:
        plan = lb.read(
            lambda tx: tx.conn.execute(
                "EXPLAIN QUERY PLAN " + QUERIES["holds_idle_watched"]
            ).fetchall()
        )
    finally:
        lb.close()
    details = [row[3] for row in plan]
    assert any("USING INDEX jobs_active" in d for d in details), details


def test_serve_refuses_a_default_the_maximum_forbids_and_up_passes_the_flags_on():
    from rc.cli import build_parser
    from rc.cli.context import UsageError
    from rc.cli.serve import check_hold_idle
    from rc.cli.upsettings import scheduling_given, serve_flags

    check_hold_idle(7200, 0)
    check_hold_idle(0, 0)
    check_hold_idle(3600, 3600)
    with pytest.raises(UsageError, match=r"--hold-idle-timeout 2h is not allowed by .* 1h"):
        check_hold_idle(7200, 3600)
    with pytest.raises(UsageError, match=r"--hold-idle-timeout 0 \(off\) is not allowed"):
        check_hold_idle(0, 3600)
    args = build_parser("up").parse_args(
        ["up", "--hold-idle-timeout", "30m", "--hold-idle-timeout-max", "4h"]
    )
    # passed on as given, as every scheduling option (test_up checks the serve it starts)
    assert serve_flags(scheduling_given(args)) == [
        "--hold-idle-timeout", "30m", "--hold-idle-timeout-max", "4h",
    ]  # fmt: skip
    assert serve_flags(scheduling_given(build_parser("up").parse_args(["up"]))) == []
    serve = build_parser("serve").parse_args(["serve", "--hold-idle-timeout", "0"])
    assert (serve.hold_idle_timeout, serve.hold_idle_timeout_max) == (0, 0)
