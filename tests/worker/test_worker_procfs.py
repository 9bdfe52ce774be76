"""/proc parsing as pure functions on captured text, with
hypothesis on arbitrary input, and the supervision rules on real processes:
a child that ignores SIGTERM, a zombie that is not a straggler, a setsid
escapee found by its RC_JOB_ID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from hypothesis import given
from hypothesis import strategies as st

from rc.worker import procfs, supervise
from rc.worker.launch import label
from rc.worker.supervise import Outcome
from tests.helpers.harness import REPO, pid_alive
from tests.helpers.wait import wait_until

# Captured from a real /proc/PID/stat, then edited to stress the comm field.
PLAIN = (
    "4242 (python3) S 4200 4242 4242 34816 4242 4194560 1234 0 0 0 12 3 0 0 20 0 1 0 "
    "98765 24567808 2345 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0"
)


def test_parse_stat_plain():
    st_ = procfs.parse_stat(PLAIN)
    assert st_ == procfs.ProcStat(4242, "python3", "S", 4200, 4242, 4242)
    assert st_.live


def test_parse_stat_comm_with_spaces_and_parentheses():
    text = PLAIN.replace("(python3)", "(a) b (c) Z 1 2 3)")
    st_ = procfs.parse_stat(text)
    assert st_ is not None
    assert st_.comm == "a) b (c) Z 1 2 3"
    assert (st_.pid, st_.state, st_.ppid, st_.pgrp, st_.session) == (4242, "S", 4200, 4242, 4242)


def test_zombies_and_dead_are_not_live():
    for state in ("Z", "X", "x"):
        st_ = procfs.parse_stat(PLAIN.replace(") S ", f") {state} "))
        assert st_ is not None and not st_.live
    for state in ("R", "S", "D", "T", "t", "I"):
        assert procfs.parse_stat(PLAIN.replace(") S ", f") {state} ")).live


def test_garbage_does_not_parse():
    for text in (
        "",
        "4242",
        "4242 (x",
        "4242 (x) S",
        "x (y) S 1 2 3",
        "4242 (x) S a b c",
        ")( 1 2 3 4",
    ):
        assert procfs.parse_stat(text) is None, text


@given(st.binary(max_size=400))
def test_parse_stat_never_raises_on_arbitrary_bytes(data):
    st_ = procfs.parse_stat(data.decode("utf-8", "replace"))
    assert st_ is None or isinstance(st_, procfs.ProcStat)


@given(
    st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=64),
    st.sampled_from("RSDZTtXI"),
    st.integers(0, 2**22),
    st.integers(0, 2**22),
    st.integers(0, 2**22),
)
def test_parse_stat_recovers_fields_whatever_the_comm(comm, state, ppid, pgrp, session):
    text = f"77 ({comm}) {state} {ppid} {pgrp} {session} 0 -1 4194560 0 0 0 0\n"
    assert procfs.parse_stat(text) == procfs.ProcStat(77, comm, state, ppid, pgrp, session)


ENV_NAME = st.text(
    alphabet=st.characters(blacklist_characters="\x00=", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
ENV_VALUE = st.binary(max_size=40).map(lambda b: b.replace(b"\0", b""))


@given(st.dictionaries(ENV_NAME, ENV_VALUE, max_size=8), ENV_VALUE)
def test_environ_lookup_finds_exactly_the_variable(env, job_id):
    env = {k.encode(): v for k, v in env.items() if k != "RC_JOB_ID"}
    items = list(env.items()) + [(b"RC_JOB_ID", job_id)]
    block = b"\0".join(k + b"=" + v for k, v in items) + b"\0"
    assert procfs.parse_environ_value(block, b"RC_JOB_ID") == job_id
    assert procfs.parse_environ_value(block, b"RC_JOB_IDX") is None
    for k, v in env.items():
        # a name that is a prefix of another never matches it
        assert procfs.parse_environ_value(block, k) == v


@given(st.binary(max_size=300))
def test_environ_lookup_never_raises(data):
    value = procfs.parse_environ_value(data, b"RC_JOB_ID")
    assert value is None or isinstance(value, bytes)


def test_result_labels():
    assert label(Outcome(0), None, False, False).state == "succeeded"
    r = label(Outcome(137, signal.SIGKILL), None, False, False)
    assert (r.state, r.exit_code, r.reason) == ("killed", 137, "signal: SIGKILL")
    # trapped SIGTERM and exited 0 after our kill: killed, never succeeded
    r = label(Outcome(0), "killed by alice", False, False)
    assert (r.state, r.exit_code, r.reason) == ("killed", 0, "killed by alice")
    # a status that is a multiple of 256 is not success
    assert label(Outcome(256), None, False, False).state == "failed"
    assert label(Outcome(3), None, False, False).reason == "exited with code 3"
    # stragglers reaped after the leader's exit are a note, never the outcome
    r = label(Outcome(0), None, 1, False)
    assert (r.state, r.exit_code, r.reason) == ("succeeded", 0, "1 straggler reaped after exit")
    r = label(Outcome(3), None, 2, False)
    assert (r.state, r.exit_code, r.reason) == (
        "failed",
        3,
        "exited with code 3; 2 stragglers reaped after exit",
    )
    assert (
        label(Outcome(143, 15), "hold ended: its ttl of 1s was reached", False, True).state
        == "succeeded"
    )


# -- real processes ------------------------------------------------------------

IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open('{ready}', 'w').write('x'); time.sleep(60)"
)


def test_kill_reaches_a_child_that_ignores_sigterm(tmp_path):
    ready = tmp_path / "ready"
    child = [sys.executable, "-c", IGNORE_TERM.format(ready=ready)]
    group = supervise.spawn(
        ["sh", "-c", 'exec 3>&-; "$@" & echo $! > pid; wait', "sh", *child],
        cwd=str(tmp_path),
        env=dict(os.environ),
    )
    wait_until(
        lambda: ready.exists() and (tmp_path / "pid").read_text().strip(), 10, "the child to start"
    )
    pid = int((tmp_path / "pid").read_text())
    t0 = time.monotonic()
    outcome, survivors = supervise.kill_group(group, 0.5)
    took = time.monotonic() - t0
    assert outcome is not None and outcome.signal == signal.SIGTERM
    assert outcome.exit_code == 128 + signal.SIGTERM
    assert survivors == []
    assert not pid_alive(pid)
    assert 0.5 <= took < 5


ZOMBIE_SCRIPT = textwrap.dedent("""
    import ctypes, json, os, sys, time
    from rc.worker import procfs, supervise
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    # the leader starts a child that exits at once and is never waited for, then exits:
    # the child is reparented to us (a subreaper that does not reap) and stays a zombie
    leader = "import os, time\\nif os.fork() == 0: os._exit(0)\\ntime.sleep(0.3)"
    group = supervise.spawn([sys.executable, "-c", leader], cwd=None, env=dict(os.environ))
    outcome = group.wait(10)
    deadline = time.monotonic() + 5
    while not procfs.group_members(group.pgid) and time.monotonic() < deadline:
        time.sleep(0.02)
    members = procfs.group_members(group.pgid)
    stragglers, left = supervise.reap_stragglers(group)
    print(json.dumps({"code": outcome.exit_code, "states": [m.state for m in members],
                      "stragglers": stragglers, "left": len(left)}))
""")


def test_a_zombie_is_not_a_straggler(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", ZOMBIE_SCRIPT],
        capture_output=True,
        env=env,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["code"] == 0
    assert got["states"] == ["Z"]  # the group holds exactly the zombie
    assert got["stragglers"] == 0 and got["left"] == 0


def test_sweep_ends_setsid_escapees_by_their_job_id_only(tmp_path):
    job = f"test-{uuid.uuid4().hex}"
    marker = {b"RC_WORKER_INSTANCE": b"sweep-test"}
    env = {**os.environ, "RC_JOB_ID": job, "RC_WORKER_INSTANCE": "sweep-test"}
    ready = tmp_path / "ready"
    polite = supervise.spawn(["sleep", "60"], cwd=None, env=env)  # its own session
    stubborn = supervise.spawn(
        [sys.executable, "-c", IGNORE_TERM.format(ready=ready)], cwd=None, env=env
    )
    other_env = {**env, "RC_JOB_ID": job + "0"}
    bystander = supervise.spawn(["sleep", "60"], cwd=None, env=other_env)
    foreign = supervise.spawn(
        ["sleep", "60"], cwd=None, env={**env, "RC_WORKER_INSTANCE": "another-worker"}
    )
    try:
        wait_until(ready.exists, 10, "the stubborn escapee to start")
        alive, complete = supervise.sweep_job(job, marker)
        assert alive == [] and complete
        assert polite.wait(5) is not None and stubborn.wait(5) is not None
        assert stubborn.wait(0).signal == signal.SIGKILL
        assert pid_alive(bystander.pid) and pid_alive(foreign.pid)
        assert supervise.sweep_job("", marker) == ([], True)  # an empty id never sweeps
    finally:
        for g in (polite, stubborn, bystander, foreign):
            g.signal(signal.SIGKILL)
            g.wait(5)


def test_sweep_spares_the_worker_and_its_ancestors(tmp_path):
    job = f"test-{uuid.uuid4().hex}"
    code = f"import sys; from rc.worker import supervise; print(supervise.sweep_job({job!r}))"
    env = {**os.environ, "RC_JOB_ID": job, "PYTHONPATH": str(REPO)}
    # the sweeping process itself, and its parent sh, carry the job id
    res = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$0"', code],
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == b"([], True)"


def test_last_pid_parses_loadavg_text():
    from rc.worker.procfs import last_pid, parse_last_pid

    assert parse_last_pid("0.52 0.58 0.59 2/291 12345\n") == 12345
    assert parse_last_pid("garbage") is None
    assert parse_last_pid("") is None
    assert last_pid() is not None and last_pid() > 1


def test_the_sweep_floor_skips_older_processes_but_finds_newer_ones(tmp_path):
    """With a pid floor, the escapee scan reads only newer processes, and it
    still finds a process carrying the job id that was started after it."""
    import os
    import subprocess
    import sys

    from rc.worker.procfs import find_job_processes, last_pid

    env = dict(os.environ, RC_JOB_ID="floor-test-1", RC_WORKER_INSTANCE="floor-test")
    floor = last_pid()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        scope = {b"RC_WORKER_INSTANCE": b"floor-test"}
        assert proc.pid in find_job_processes("floor-test-1", None, scope, floor).pids
        assert proc.pid not in find_job_processes("floor-test-1", None, scope, proc.pid + 1).pids
    finally:
        proc.kill()
        proc.wait()
