"""What a newcomer hit in rc's listings and help, pinned without processes:
table cells that let a carriage return through, JSON times, the words for a
job's state and what it runs, help text on every verb and argument, usage
errors pointing at the verb's own help, and completions that fail silently."""

from __future__ import annotations

import argparse
import datetime
import io
import socket
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.cli import build_parser, main
from rc.cli.complete import (
    COMPLETE_TIMEOUT_S,
    devices,
    holds,
    label_keys,
    live_jobs,
    recent_jobs,
)
from rc.cli.output import (
    end_reason,
    hold_end,
    iso_utc,
    job_state,
    job_what,
    machine,
    table,
    visible,
)


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
    # the trial: rc explain -o json gave hosts[].held[].until in epoch seconds
    fit = machine({"hosts": [{"held": [{"until": 0, "job_id": 4}, {"until": None}]}]})
    assert fit["hosts"][0]["held"] == [
        {"until": "1970-01-01T00:00:00.000Z", "job_id": 4},
        {"until": None},
    ]
    usage = machine({"since": 0.0, "until": 60.0, "total": {"device_seconds": 60.0}})
    assert usage == {
        "since": "1970-01-01T00:00:00.000Z",
        "until": "1970-01-01T00:01:00.000Z",
        "total": {"device_seconds": 60.0},
    }
    back = datetime.datetime.fromisoformat(iso_utc(1772467445.5))
    assert back.utcoffset() == datetime.timedelta(0) and back.timestamp() == 1772467445.5


@pytest.mark.parametrize(
    ("state", "reason", "started", "words"),
    [
        # report 15: `killed (killed by root: ...)` said killed twice
        ("killed", "killed by root", None, "killed by root: cancelled while queued"),
        ("killed", "killed by root", 1.0, "killed by root"),
        (
            "killed",
            "killed by ann: cancelled while queued (Ctrl-C)",
            None,
            "killed by ann: cancelled while queued (Ctrl-C)",
        ),
        ("killed", "killed by ann: released", 1.0, "killed by ann: released"),
        ("killed", "killed by bob (admin): disk full", 1.0, "killed by bob, an admin: disk full"),
        # a token's label: its Unix user and its name
        (
            "killed",
            "killed by svc (token ci) (admin): disk full",
            1.0,
            "killed by svc (token ci), an admin: disk full",
        ),
        (
            "killed",
            "killed by ann (token lap): released",
            1.0,
            "killed by ann (token lap): released",
        ),
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
    """The trial: `rc kill --reason TEXT` read "TEXT (by bob)", so a table's
    cut hid who killed it. The actor comes first and is never cut."""
    job = {"state": "killed", "kill_reason": "killed by ann: " + "x" * 100, "started_at": 1.0}
    assert job_state(job) == "killed by ann: " + "x" * 39 + "…"
    assert end_reason(job) == "by ann: " + "x" * 100
    long_actor = {
        "state": "killed",
        "kill_reason": "killed by svc (token nightly-evaluation-runner) (admin): " + "y" * 80,
        "started_at": 1.0,
    }
    assert job_state(long_actor).startswith(
        "killed by svc (token nightly-evaluation-runner), an admin: yyy"
    )


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("killed by alice: released", "released by alice"),
        (
            "killed by alice (token lap): released (Ctrl-C)",
            "released by alice (token lap) (Ctrl-C)",
        ),
        ("killed by bob (admin): disk full", "killed by bob, an admin: disk full"),
        ("killed by bob", "killed by bob"),
        ("hold ended: its ttl of 2h was reached", "its ttl of 2h was reached"),
    ],
)
def test_a_hold_ends_in_words_with_who_first(reason, words):
    assert hold_end({"state": "killed", "kill_reason": reason, "started_at": 1.0}) == words


def test_a_copy_is_listed_by_its_label_and_a_job_by_its_command_and_reason():
    """Report 15: rc cp's job was listed as `sh -c 'set -e...`. The trial:
    any job's reason was listed instead of its command; only a copy's label
    (the controller's, rc.proto.copyjob) is."""
    cp = {
        "kind": "job",
        "stdio": "pipe",
        "reason": "rc cp ./data box:cpu0:/tmp/",
        "command": ["sh", "-c", "x"],
    }
    assert job_what(cp) == "rc cp ./data box:cpu0:/tmp/"
    on_device = {"kind": "job", "reason": "rc cp ./data box:cpu0:/tmp/", "command": ["x"]}
    assert job_what(on_device) == "rc cp ./data box:cpu0:/tmp/"  # a DeviceView: no stdio
    plain = {"kind": "job", "stdio": "", "reason": "rc cp a b:c:/", "command": ["sh", "-c", "evil"]}
    assert job_what(plain) == "sh -c evil (rc cp a b:c:/)"  # from before the controller dropped it
    noted = {"kind": "job", "reason": "ablation\n3", "command": ["python", "train.py"]}
    assert job_what(noted) == "python train.py (ablation\\n3)"
    assert job_what(noted, 18) == "python train.py (…"
    assert job_what({"kind": "job", "reason": "", "command": ["echo", "a b"]}) == "echo 'a b'"
    assert job_what({"kind": "hold", "reason": "NCCL", "command": ["hold"]}) == "hold: NCCL"


HIDDEN = {
    ("hold", "--as"),
    ("serve", "--ready-fd"),
    ("worker", "rest"),
}
"""Arguments deliberately left out of --help (help=SUPPRESS), by verb. Not
--token: found by a new user, it worked on every verb and no --help listed
it (its help says to prefer RC_TOKEN or the config file)."""


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, helps.get(name)
                yield from _parsers(sub, (*path, name))


def test_every_verb_and_every_argument_has_help():
    """Report 14: jobs, ps, kill, ... had no description and no argument help."""
    found = list(_parsers(build_parser()))
    assert len(found) >= 25
    for path, parser, summary in found:
        name = " ".join(path)
        assert summary, f"rc {name} has no one-line help in rc --help"
        assert parser.description, f"rc {name} has no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            label = action.option_strings[0] if action.option_strings else action.dest
            if action.help == argparse.SUPPRESS:
                assert (path[0], label) in HIDDEN, (name, label)
                continue
            assert action.help and action.help.strip(), f"rc {name} {label} has no help"


def test_every_parser_names_a_handler_that_exists():
    """A mis-wired handler= ("run:cmd_relase") was found only by an e2e test."""
    import importlib

    leaves = [(p, parser) for p, parser, _ in _parsers(build_parser()) if not parser._subparsers]
    assert len(leaves) >= 25
    for path, parser in leaves:
        handler = parser.get_default("handler")
        assert handler, f"rc {' '.join(path)} names no handler"
        module, _, func = handler.partition(":")
        assert callable(getattr(importlib.import_module(f"rc.cli.{module}"), func, None)), handler


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["jobs", "--json"], "rc jobs"),
        (["whoami", "--bogus"], "rc whoami"),
        (["token", "create", "x", "--bogus"], "rc token create"),
        (["logs"], "rc logs"),
    ],
)
def test_a_usage_error_points_at_the_verbs_own_help(argv, verb, capsys):
    """Report 14: `rc jobs --json` said `(see rc --help)`."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{verb}: ") and err.endswith(f"(see {verb} --help)\n"), err
    assert err.count("\n") == 1


def test_token_help_says_to_prefer_the_environment_or_the_config():
    """Found by a new user: --token worked everywhere but no --help listed it."""
    for verb in ("run", "jobs", "devices", "whoami", "drain"):
        text = build_parser(verb)._subparsers._group_actions[0].choices[verb].format_help()
        assert "--token TOKEN" in text and "prefer" in text and "RC_TOKEN" in text, verb


def test_jobs_and_kill_parse_with_no_user_given():
    """argparse types a flag's default too: --user's check refused every
    `rc jobs` and `rc kill` that gave no --user (the default "")."""
    for verb in ("jobs", "kill"):
        args = build_parser(verb).parse_args([verb] + (["1"] if verb == "kill" else []))
        assert args.submitter == ""


BAD_INVOCATIONS = [
    # found by a new user: handler-made usage errors did not name the verb's help
    (["jobs", "-n", "0"], "rc jobs", "0 is out of range (1..1000)"),
    (["hold", "--ttl", "0", "--reason", "r"], "rc hold", "--ttl must be positive"),
    (["hold", "--ttl", "5m", "--reason", " "], "rc hold", "--reason cannot be blank"),
    (["devices", "-s", ""], "rc devices", "-s needs a selector"),
    (["explain", "-s", ""], "rc explain", "-s needs a selector"),
    (["run"], "rc run", "give a command after --"),
    (["run", "--detach", "--kill-on-detach", "--", "true"], "rc run", "do not go together"),
    (["run", "-e", "1X=2", "--", "true"], "rc run", "is not a variable name"),
    (["exec", "3"], "rc exec", "give a command after --"),
    (["retire", "h:cpu0"], "rc retire", "--yes"),
    (["cp", "a", "b"], "rc cp", "one side must be on a device"),
    (["up", "--devices", "0"], "rc up", "use auto or a number"),
    (["up", "--listen", "nowhere"], "rc up", "use HOST:PORT"),
    # found by a new user: full-width digits were read as 10
    (["run", "--max-runtime", "１０", "--", "true"], "rc run", "bad duration"),
    (["run", "--priority", "１", "--", "true"], "rc run", "is not a whole number"),
    (["logs", "４２"], "rc logs", "is not a whole number"),
    (["kill", "0"], "rc kill", "0 is out of range"),
    (["events", "-n", "5000"], "rc events", "out of range (1..1000)"),
    (["up", "--devices", "２"], "rc up", "use auto or a number"),
    # found by a new user: a 400 from the controller, where every other bad spec is this
    (["run", "--array", "%5", "--", "true"], "rc run", "names no indices"),
    # found by a new user: refused only once the worker had started
    (["up", "--devices", "1025"], "rc up", "1 to 1024"),
    (["up", "--listen", "127.0.0.1:８０"], "rc up", "use HOST:PORT"),
    # found by a new user: --expires 0 made a token that never expires, unsaid
    (["token", "create", "bob", "--expires", "0"], "rc token create", "never expires"),
    # found by a new user: `rc jobs --user token:ci` and a typo listed nothing
    (["jobs", "--user", "token:ci"], "rc jobs", "not a Unix user name (the user the jobs run"),
    (["kill", "--user", "no such user"], "rc kill", "'no such user' is not a Unix user name"),
    # found by a new user: `rc jobs --device bad` listed nothing
    (["jobs", "--device", "bad"], "rc jobs", "is not a device id"),
    # found by a new user: a long name was called "not a job name", its length unsaid
    (
        ["run", "--name", "x" * 300, "--", "true"],
        "rc run",
        "at most 128 characters; this one has 300",
    ),
    # found by a new user: -5m was taken for an unknown option ("D is required")
    (["extend", "3", "-5m"], "rc extend", "must be positive"),
    (["extend", "3", "0s"], "rc extend", "D must be positive"),
    # found by a new user: an empty user crashed on the controller's redirect
    (["share", "set", "", "3"], "rc share set", "is not a user name"),
    # found by a new user: Arabic-Indic and full-width digits were read as numbers
    (["share", "set", "alice", "\u0663"], "rc share set", "is not a number"),
    (["share", "set", "alice", "1e-300"], "rc share set", "is not a number"),
    (["share", "set", "alice", "0.001"], "rc share set", "out of range: 0.01 to 1000"),
    # found by a new user: a bad window was the controller's 400 (exit 1)
    (["usage", "--since", "yesterday"], "rc usage", "bad duration"),
    (["usage", "--since", "4000d"], "rc usage", "out of range: 1s to 3660d"),
]


@pytest.mark.parametrize(("argv", "verb", "words"), BAD_INVOCATIONS)
def test_every_usage_error_is_one_line_naming_the_verbs_help(
    argv, verb, words, capsys, monkeypatch, tmp_path
):
    """Each is refused before anything is asked of a controller (there is no
    token here: asking one would be exit 1, "no token"), exits 2, and is one
    line ending in "(see rc VERB --help)", as the README promises."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("RC_TOKEN", raising=False)
    monkeypatch.delenv("RC_CONTROLLER", raising=False)
    if argv[0] == "up":  # a data dir that cannot be made: an rc up that got past
        (tmp_path / "file").write_text("")  # its checks fails at once, starting nothing
        argv = [*argv, "--data", str(tmp_path / "file" / "rc")]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.startswith(f"{verb}: ") and err.endswith(f" (see {verb} --help)\n"), err
    assert words in err and err.count("\n") == 1, err


def test_whoami_takes_o_json():
    args = build_parser("whoami").parse_args(["whoami", "-o", "json"])
    assert args.output == "json"


@pytest.mark.parametrize("completer", [live_jobs, holds, recent_jobs, devices, label_keys])
def test_a_completion_with_no_controller_is_silently_empty(completer, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("RC_CONTROLLER", raising=False)
    monkeypatch.delenv("RC_TOKEN", raising=False)
    # no token at all
    assert completer(prefix="", parsed_args=argparse.Namespace()) == {}
    # a port nobody listens on (connection refused)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    ns = argparse.Namespace(controller=f"http://127.0.0.1:{dead}", token="rc_x", cacert=None)
    assert completer(prefix="", parsed_args=ns) == {}
    # a controller that accepts and never answers: bounded by the short timeout
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        ns.controller = f"http://127.0.0.1:{mute.getsockname()[1]}"
        t0 = time.monotonic()
        assert completer(prefix="", parsed_args=ns) == {}
        assert time.monotonic() - t0 < COMPLETE_TIMEOUT_S * 3


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_cp_progress_line_erases_with_a_real_escape(monkeypatch):
    """Found by a review: rc cp's progress line printed a literal `\\x1b[K`,
    because rc's own erase-to-end-of-line went through the escaping stderr."""
    from rc.cli.copy import _Progress
    from rc.cli.output import EscapingStream

    term = _Tty()
    monkeypatch.setattr(sys, "stderr", EscapingStream(term))
    progress = _Progress("sent", 2_000_000)
    progress.add(1_000_000)
    progress.done()
    assert "\x1b[K" in term.getvalue() and "\\x1b" not in term.getvalue()
    assert term.getvalue().endswith("\n")
