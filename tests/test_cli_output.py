"""What a newcomer hit in rc's listings, pinned without processes: table
cells that let a carriage return through, JSON times, the words for a job's
state and what it runs."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.cli.output import end_reason, iso_utc, job_state, job_what, machine, table, visible


def _table_text(capsys, rows) -> str:
    table(("A", "B"), rows)
    return capsys.readouterr().out


def test_a_cell_escapes_a_carriage_return_and_every_control_character(capsys):
    """Report 13: `\\r` in a hold reason or a command reached the terminal raw."""
    out = _table_text(
        capsys, [("a\rFORGED", "x\x1b[2Jy"), ("tab\there", "del\x7f c1\x9b bidi\u202e ls\u2028")]
    )
    assert "\r" not in out and "\x1b" not in out and "\x7f" not in out and "\x9b" not in out
    assert "\u202e" not in out and "\u2028" not in out
    assert r"a\rFORGED" in out and r"x\x1b[2Jy" in out and r"tab\there" in out
    assert r"del\x7f c1\x9b bidi\u202e ls\u2028" in out
    assert out.count("\n") == 3  # the header and two rows, nothing forged


@given(st.lists(st.tuples(st.text(), st.text()), max_size=5))
@settings(max_examples=200, deadline=None)
def test_a_table_is_one_printable_line_per_row(rows):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        table(("A", "B"), rows)
    lines = buf.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == len(rows) + 2
    assert all(line.isprintable() for line in lines)


def test_visible_keeps_plain_text():
    assert visible("python3 train.py --lr=3e-4 ü 日本") == "python3 train.py --lr=3e-4 ü 日本"


def test_json_times_are_rfc3339_utc_and_other_numbers_stay():
    got = machine(
        {
            "job": {"started_at": 1772467445.1234, "finished_at": None, "max_runtime_seconds": 60},
            "events": [{"at": 0, "id": 3}],
            "heartbeat_age_seconds": 2.5,
            "flag_at": True,
        }
    )
    assert got["job"] == {
        "started_at": "2026-03-02T16:04:05.123Z",
        "finished_at": None,
        "max_runtime_seconds": 60,
    }
    assert got["events"] == [{"at": "1970-01-01T00:00:00.000Z", "id": 3}]
    assert got["heartbeat_age_seconds"] == 2.5 and got["flag_at"] is True
    back = datetime.datetime.fromisoformat(iso_utc(1772467445.5))
    assert back.utcoffset() == datetime.timedelta(0) and back.timestamp() == 1772467445.5


@pytest.mark.parametrize(
    ("state", "reason", "started", "words"),
    [
        # report 15: `killed (killed by root: ...)` said killed twice
        ("killed", "killed by root", None, "killed: cancelled while queued (by root)"),
        ("killed", "killed by root", 1.0, "killed by root"),
        (
            "killed",
            "killed by ann: cancelled while queued (Ctrl-C)",
            None,
            "killed: cancelled while queued (Ctrl-C, by ann)",
        ),
        ("killed", "killed by ann: released", 1.0, "killed: released (by ann)"),
        ("killed", "killed by bob (admin): disk full", 1.0, "killed: disk full (by bob, an admin)"),
        ("killed", "idle: no output for 5m", 1.0, "killed: no output for 5m (idle timeout)"),
        ("killed", "max_runtime exceeded (2h)", 1.0, "killed: ran past its max runtime of 2h"),
        ("killed", "signal: SIGSEGV", 1.0, "killed: signal SIGSEGV"),
        ("killed", "stragglers reaped after exit", 1.0, "killed: stragglers reaped after exit"),
        ("killed", "no-wait: no device was free", None, "killed: no device was free (--no-wait)"),
        ("killed", "device box:cpu0 was retired", None, "killed: device box:cpu0 was retired"),
        ("killed", "", 1.0, "killed"),
        ("failed", "exited with code 3", 1.0, "failed: exited with code 3"),
        ("lost", "lease expired", 1.0, "lost: lease expired"),
        ("succeeded", "hold ended: its ttl of 2h was reached", 1.0, "succeeded"),
        ("running", "", 1.0, "running"),
    ],
)
def test_a_state_and_its_reason_read_as_one_phrase(state, reason, started, words):
    job = {"state": state, "kill_reason": reason, "started_at": started}
    assert job_state(job, limit=None) == words


def test_a_long_reason_is_cut_in_a_table():
    job = {"state": "killed", "kill_reason": "killed by ann: " + "x" * 100, "started_at": 1.0}
    assert job_state(job) == "killed: " + "x" * 39 + "…"
    assert end_reason(job) == "x" * 100 + " (by ann)"


def test_a_job_is_listed_by_its_reason_when_it_has_one():
    """Report 15: rc cp's job was listed as `sh -c 'set -e...`."""
    cp = {"kind": "job", "reason": "rc cp ./data box:cpu0:/tmp/", "command": ["sh", "-c", "x"]}
    assert job_what(cp) == "rc cp ./data box:cpu0:/tmp/"
    assert job_what({"kind": "job", "reason": "", "command": ["echo", "a b"]}) == "echo 'a b'"
    assert job_what({"kind": "hold", "reason": "NCCL", "command": ["hold"]}) == "hold: NCCL"
