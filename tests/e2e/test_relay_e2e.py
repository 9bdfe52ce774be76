"""Terminals and pipes end to end: a real controller, a worker from the
zipapp, and the CLI running under a pseudo-terminal this test drives.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import termios
from collections.abc import Callable, Iterator

import pytest

from rc.cli.relay import wait_session
from rc.proto.client import Client
from rc.proto.errors import ApiError
from rc.proto.relay import Download, Upload
from tests.helpers.fleet import (
    BASH,
    Fleet,
    PtyCli,
    hold,
    pty_cli,  # noqa: F401  (fixtures)
    running_fleet,
)
from tests.helpers.harness import PY, REPO, job, pid_alive
from tests.helpers.wait import wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("relay"), pyz) as f:
        yield f


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


def running(cmdline: str) -> int:
    """Wait until a process with this command line (NUL-separated) runs; its pid."""
    want = cmdline.encode() + b"\0"

    def find() -> int:
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read() == want:
                        return int(name)
        return 0

    return wait_until(find, 10, f"a process {cmdline!r}")


def test_terminal_job_end_to_end(fleet, pty_cli):
    t = pty_cli(
        fleet.alice,
        "run",
        "--tty",
        "-d",
        "box:cpu0",
        "-e",
        "PS1=rc$ ",
        "--",
        *BASH,
        rows=33,
        cols=101,
    )
    job_id = int(t.expect(rb"job (\d+) on box:cpu0").group(1))
    t.send(b"echo typed-$((6*7)) cuda=[$CUDA_VISIBLE_DEVICES] $RC_DEVICE\r")
    t.expect(rb"typed-42 cuda=\[\] box:cpu0")
    t.send(b"stty size\r")
    t.expect(rb"[\r\n]33 101\r\n")
    t.resize(40, 120)

    def resized() -> bool:
        t.send(b"stty size\r")
        return bool(t.expect(rb"[\r\n](33 101|40 120)\r\n").group(1) == b"40 120")

    wait_until(resized, 20, "the new window size on the far side")
    t.send(b"echo start-$((1+1)); sleep 30.5; echo not-$((5+5))\r")
    t.expect(b"start-2")
    running("sleep\0" + "30.5")
    t.send(b"\x03")
    t.send(b"echo alive-$((2+2))\r")
    t.expect(b"alive-4", timeout=10)
    assert b"not-10" not in t.seen, "Ctrl-C must end the whole foreground command line"
    t.send(b"sleep 31.5\r")
    pid = running("sleep\0" + "31.5")
    t.send(b"\x1a")
    t.expect(b"Stopped")
    assert proc_state(pid) == "T"
    t.send(b"fg\r")
    wait_until(lambda: proc_state(pid) == "S", 10, "the stopped job to continue")
    t.send(b"\x03")
    wait_until(lambda: not pid_alive(pid), 10, "Ctrl-C to end the continued job")
    t.send(b"exit 7\r")
    assert t.wait() == 7
    assert t.restored()
    assert job(fleet.ctl.client(), job_id)["state"] == "failed"


def test_a_terminal_job_starts_at_the_callers_window_size(fleet, pty_cli):
    """The trial: `stty size` at the start of `rc run --tty` printed `24 80`
    in a 111-column terminal and the real size came a second later. rc
    attached only once the job ran, so its worker started the command
    before the client's first resize frame (waiting TTY_SIZE_WAIT_S for it,
    in vain). rc now attaches as soon as the job is assigned and sends its
    size first, so the window size is in place before the command runs."""
    t = pty_cli(
        fleet.alice, "run", "--tty", "-d", "box:cpu0", "--", "stty", "size", rows=37, cols=111
    )
    t.expect(rb"job \d+ on box:cpu0")
    first = t.expect(rb"(\d+ \d+)\r\n").group(1)
    assert first == b"37 111", t.seen
    assert t.wait() == 0


def test_keys_typed_while_queued_are_not_lost(fleet, pty_cli):
    held = hold(fleet.alice, "box:cpu1")
    t = pty_cli(fleet.alice, "run", "--tty", "-d", "box:cpu1", "--", "sh", "-i")
    t.expect(b"queued at position 1")
    t.send(b"echo queued-$((2+3))\r")
    fleet.alice.run("release", str(held), check=True)
    t.expect(b"queued-5")
    t.send(b"exit\r")
    assert t.wait() == 0
    assert t.restored()


def test_shell_in_a_hold_has_no_second_lease_and_ends_with_the_hold(fleet, pty_cli):
    held = hold(fleet.alice, "box:cpu0")
    t = pty_cli(fleet.alice, "shell", str(held), "--", "sh", "-i")
    t.send(b"echo in=$RC_JOB_ID:$RC_DEVICE; sleep 300 & echo bg=$!\r")
    t.expect(f"in={held}:box:cpu0".encode())
    bg = int(t.expect(rb"bg=(\d+)").group(1))
    assert pid_alive(bg)
    c = fleet.ctl.client()
    views = {v["device"]["id"]: v for v in c.get("/v1/devices")["devices"]}
    assert views["box:cpu0"]["job_id"] == held and views["box:cpu0"]["kind"] == "hold"
    assert len(c.get("/v1/state")["jobs"]) == 1, "the shell took no job or lease of its own"
    fleet.alice.run("release", str(held), check=True)
    assert t.wait() != 0
    assert t.restored()
    # the trial: it said "hold N ended (running)" (the release only requested)
    said = rf"session \d+ of hold {held}: hold {held} ended: released by alice \(token alice\)"
    assert re.search(said.encode(), t.seen), t.seen
    wait_until(lambda: not pid_alive(bg), 10, "the shell's background job to end with the hold")


def test_another_users_token_cannot_attach(fleet):
    alice = fleet.ctl.client(fleet.alice.env["RC_TOKEN"])
    bob = fleet.ctl.client(fleet.bob.env["RC_TOKEN"])
    held = hold(fleet.alice, "box:cpu1")
    try:
        jid = alice.post(
            "/v1/jobs", {"device_id": "box:cpu0", "command": ["sleep", "30"], "stdio": "pipe"}
        )["job"]["id"]
        for half in (
            lambda: Download(bob, f"/v1/jobs/{jid}/tty/out"),
            lambda: Upload(bob, f"/v1/jobs/{jid}/tty/in"),
        ):
            with pytest.raises(ApiError) as e:
                half()
            assert (e.value.status, e.value.code) == (403, "not_job_owner")
        with pytest.raises(ApiError) as e:
            bob.post(f"/v1/jobs/{held}/sessions", {"stdio": "pipe", "command": ["true"]})
        assert e.value.status == 403
        assert e.value.message.startswith(f"hold {held} belongs to alice")
        with pytest.raises(ApiError) as e:  # a job that is not a hold is not called one
            bob.post(f"/v1/jobs/{jid}/sessions", {"stdio": "pipe", "command": ["true"]})
        assert e.value.message.startswith(f"job {jid} belongs to alice")
        with pytest.raises(ApiError) as e:  # a user token is not a worker
            Upload(alice, f"/v1/jobs/{jid}/tty/out")
        assert e.value.status == 403
        alice.post(f"/v1/jobs/{jid}/kill", {})
    finally:
        fleet.alice.run("release", str(held))


def test_exec_moves_100_mb_byte_exact_and_keeps_stderr(fleet):
    held = hold(fleet.alice, "box:cpu1")
    try:
        src, dst = fleet.tmp / "in.bin", fleet.tmp / "out.bin"
        src.write_bytes(os.urandom(100 << 20))
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            res = subprocess.run(
                [PY, "-m", "rc", "exec", str(held), "--", "cat"],
                stdin=fin,
                stdout=fout,
                stderr=subprocess.PIPE,
                env=fleet.alice.env,
                cwd=REPO,
                timeout=120,
                check=False,
            )
        assert res.returncode == 0, res.stderr
        assert (
            hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
        )
        res = fleet.alice.run(
            "exec", str(held), "--", "sh", "-c", "cat; echo to-err >&2; exit 5", input=b"\x00in\xff"
        )
        assert res.returncode == 5
        assert res.stdout == b"\x00in\xff"
        assert b"to-err" in res.stderr
    finally:
        fleet.alice.run("release", str(held))


def test_terminal_restored_when_the_controller_goes_away(tmp_path, pyz, pty_cli):
    with running_fleet(tmp_path, pyz) as f:
        t = pty_cli(f.alice, "run", "--tty", "--", "sh", "-i")
        t.expect(rb"job \d+ on")
        t.send(b"echo up-$((3*3))\r")
        t.expect(b"up-9")
        f.ctl.kill9()
        assert t.wait() == 1
        assert t.restored()
        assert b"the controller went away (connection lost)" in t.seen
        f.worker.kill9()  # its reports could only wait for the dead controller


def test_a_command_that_cannot_start_and_a_terminal_fed_from_a_pipe(fleet):
    held = hold(fleet.alice, "box:cpu1")
    try:
        res = fleet.alice.run("exec", str(held), "--", "/no/such/program")
        assert res.returncode == 127 and b"cannot start" in res.stderr, res.stderr
    finally:
        fleet.alice.run("release", str(held))
    # no terminal here: keys come from a pipe (its end adds nothing: the shell exits itself)
    res = fleet.alice.run("run", "--tty", "--", "sh", "-i", input=b"echo piped-$((1+2))\nexit\n")
    assert res.returncode == 0, res.stderr
    assert b"piped-3" in res.stdout


def test_a_terminal_job_that_ended_before_its_client_attached_gives_its_output(fleet):
    """Failed under load: `rc run --tty` said "session_ended: job 16 has ended
    (succeeded)" and showed nothing. It attaches once the job runs; a short
    command had ended by then, and the relay refused a job that had ended
    although its output still waited there for the client."""
    c = Client(fleet.ctl.url, fleet.alice.env["RC_TOKEN"])
    j = c.post(
        "/v1/jobs",
        {"command": ["sh", "-c", "echo late-reader"], "device_id": "box:cpu0", "stdio": "tty"},
    )["job"]
    admin = fleet.ctl.client()
    wait_until(lambda: job(admin, j["id"])["state"] == "succeeded", 30, "the job to end")
    up = Upload(c, f"/v1/jobs/{j['id']}/tty/in")
    down = Download(c, f"/v1/jobs/{j['id']}/tty/out")
    assert b"late-reader" in b"".join(down)
    up.close()
    down.close()
    with pytest.raises(ApiError, match="session_ended"):  # read once: then it has ended
        Download(c, f"/v1/jobs/{j['id']}/tty/out")


def test_a_command_that_ends_at_once_waits_for_the_output_half(fleet):
    """Failed under load: `rc exec HOLD -- /no/such/program` said session_ended
    (the output ended). The client connected its output half first; the command
    ended at once; the relay ended the session as soon as the client had its
    output, before the input half connected, which was refused. The input half
    now connects first (rc.cli.relay.open_halves), and the relay keeps a
    session whose output nobody has read: this is the order it relies on."""
    held = hold(fleet.alice, "box:cpu1")
    try:
        c = Client(fleet.ctl.url, fleet.alice.env["RC_TOKEN"])
        view = c.post(
            f"/v1/jobs/{held}/sessions",
            {"stdio": "pipe", "command": ["/no/such/program"], "cwd": "", "env": {}},
        )
        base = f"/v1/jobs/{held}/sessions/{view['session_id']}"
        up = Upload(c, base + "/tty/in")
        ended = wait_session(c, held, view["session_id"])  # the worker said how it ended
        assert ended["exit_code"] == 127, ended
        down = Download(c, base + "/tty/out")  # still served: nobody read its output
        assert b"".join(down) == b""
        up.close()
        down.close()
    finally:
        fleet.alice.run("release", str(held))


def test_resizes_follow_when_only_stdout_is_a_terminal(fleet):
    """Report 18: `rc run --tty < /dev/null` in a terminal window never sent
    a resize (stdin was not a terminal, and its end stopped the input)."""
    t = PtyCli(
        fleet.alice,
        "run",
        "--tty",
        "-d",
        "box:cpu1",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 300 ]; do stty size; sleep 0.1; i=$((i+1)); done",
        rows=33,
        cols=101,
        out_only=True,
    )
    try:
        job_id = int(t.expect(rb"job (\d+) on box:cpu1").group(1))
        t.expect(rb"33 101\r+\n")  # the local terminal is not raw: it adds a CR
        t.resize(40, 120)  # the kernel sends rc (its foreground group) SIGWINCH
        t.expect(rb"40 120\r+\n")
        fleet.alice.run("kill", str(job_id), check=True)
        assert t.wait() != 0
    finally:
        t.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminal_job_is_hung_up_when_rc_goes_away(fleet, pty_cli, sig):
    """README "Stopping rc run": a terminal job does not outlive its rc run
    (with or without --kill-on-detach)."""
    t = pty_cli(
        fleet.alice, "run", "--tty", "-d", "box:cpu1", "--", "sh", "-c", "echo up; sleep 60"
    )
    job_id = int(t.expect(rb"job (\d+) on box:cpu1").group(1))
    t.expect(b"up")
    t.proc.send_signal(sig)
    assert t.wait() == 128 + sig
    assert t.restored()
    wait_until(lambda: job(fleet.ctl.client(), job_id)["state"] == "killed", 20, "the job to end")


def test_ctrl_c_on_exec_ends_the_remote_command(fleet):
    held = hold(fleet.alice, "box:cpu1")
    try:
        proc = fleet.alice.popen(
            "exec", str(held), "--", "sleep", "300.25", stdin=subprocess.DEVNULL
        )
        pid = running("sleep\0" + "300.25")
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
        assert proc.returncode == 130
        wait_until(lambda: not pid_alive(pid), 15, "the remote command to end")
    finally:
        fleet.alice.run("release", str(held))


# -- terminal sessions: signals, end of input, startup -------------------------------------


def _status_fields(out: bytes) -> dict[bytes, int]:
    """SigIgn and SigBlk as printed from /proc/PID/status."""
    return {k: int(v, 16) for k, v in re.findall(rb"(SigIgn|SigBlk):\s*([0-9a-f]+)", out)}


# the shell reads its own status with builtins: a child reading it could catch the
# shell with every signal blocked for a moment (dash does so around vfork)
SIGNALS_CMD = (
    "sh",
    "-c",
    (
        "yes | head -1 >/dev/null; while IFS= read -r l; do case $l in "
        'SigIgn*|SigBlk*) echo "$l";; esac; done < /proc/$$/status; '
        "echo signals-done"
    ),
)


def test_terminal_commands_start_with_default_signal_dispositions(fleet, pty_cli):
    """A terminal's command gets what a login gets: no signal ignored (the
    Python worker and its shim ignore SIGPIPE and SIGXFSZ) and none blocked,
    so `yes | head -1` ends quietly."""
    held = hold(fleet.alice, "box:cpu0")
    try:
        for args in (("shell", str(held)), ("run", "--tty", "-d", "box:cpu1")):
            t = pty_cli(fleet.alice, *args, "--", *SIGNALS_CMD)
            t.expect(b"signals-done")
            assert t.wait() == 0
            fields = _status_fields(t.seen)
            assert fields == {b"SigIgn": 0, b"SigBlk": 0}, (args[0], t.seen)
            assert b"Broken pipe" not in t.seen, t.seen
    finally:
        fleet.alice.run("release", str(held))


def test_end_of_input_sends_nothing_to_a_terminal(fleet):
    """`rc shell` fed from a pipe: what the pipe held reaches the far
    terminal, its end adds nothing (no ^D, which a terminal switched to raw
    mode reads as a NUL byte), and the session still runs to its end."""
    held = hold(fleet.alice, "box:cpu0")
    go = fleet.tmp / f"go-{held}"
    os.mkfifo(go)
    seen = len(fleet.worker.log())
    try:
        # raw at once; read what is pending only once the test says the input ended
        r, w = os.pipe()
        proc = fleet.alice.popen(
            "shell",
            str(held),
            "--",
            "sh",
            "-c",
            f"stty raw -echo min 0 time 0; read _ < {go}; "
            "echo got:$(dd bs=64 count=1 2>/dev/null | od -An -tx1); exit 3",
            stdin=r,
        )
        os.close(r)
        os.write(w, b"ab")
        os.close(w)
        # the worker saw the input end: everything rc sent is in the terminal by now
        wait_until(
            lambda: re.search(
                rf"input ended: /v1/jobs/{held}/sessions/\d+/tty/in", fleet.worker.log()[seen:]
            ),
            20,
            "the worker to see the end of the input",
        )

        def tell() -> bool:
            try:
                fd = os.open(go, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: the command is not reading the fifo yet
                return False
            os.write(fd, b"\n")
            os.close(fd)
            return True

        wait_until(tell, 20, "the command to wait on the fifo")
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 3, err
        got = re.search(rb"got:([ 0-9a-f]*)", out)
        assert got is not None, out
        assert got.group(1).split() == [b"61", b"62"], out
    finally:
        fleet.alice.run("release", str(held))


def _raw(t: PtyCli) -> Callable[[], bool]:
    """Whether rc has made its terminal raw (no signals, no line editing)."""
    return lambda: not termios.tcgetattr(t.slave)[3] & (termios.ISIG | termios.ICANON)


def test_ctrl_c_typed_at_the_start_reaches_the_remote_command(fleet, pty_cli):
    """A Ctrl-C typed as soon as rc has made the terminal raw, before the far
    side is up, interrupts the remote command (it is not lost in the startup
    window to a terminal nobody controls yet, which only echoed it)."""
    held = hold(fleet.alice, "box:cpu0")
    try:
        for args, sleep in (
            (("shell", str(held)), "61.25"),
            (("run", "--tty", "-d", "box:cpu1"), "61.75"),
        ):
            t = pty_cli(fleet.alice, *args, "--", "sleep", sleep)
            wait_until(_raw(t), 20, "rc to make its terminal raw")
            t.send(b"\x03")
            assert t.wait(30) == 130, t.seen
            assert t.restored()
    finally:
        fleet.alice.run("release", str(held))


def test_a_session_that_could_not_start_can_still_be_attached_to(fleet):
    """A command that cannot start ends its session cleanly with empty output:
    a client attaching only after the worker gave up still reads that end
    (and then the exit code), instead of being refused because the worker's
    output connection "broke"."""
    alice = fleet.ctl.client(fleet.alice.env["RC_TOKEN"])
    held = hold(fleet.alice, "box:cpu1")
    try:
        sid = alice.post(
            f"/v1/jobs/{held}/sessions", {"stdio": "pipe", "command": ["/no/such/program"]}
        )["session_id"]
        final = wait_session(alice, held, sid)
        assert final["exit_code"] == 127 and "cannot start" in final["reason"], final
        base = f"/v1/jobs/{held}/sessions/{sid}"
        down = Download(alice, base + "/tty/out")
        try:
            assert down.read() == b""
        finally:
            down.close()
    finally:
        fleet.alice.run("release", str(held))


def test_exec_takes_a_relative_cwd_from_where_rc_runs_and_refuses_an_ended_hold(fleet):
    held = hold(fleet.alice, "box:cpu1")
    try:
        (fleet.alice.cwd / "sub dir").mkdir(exist_ok=True)
        res = fleet.alice.run("exec", str(held), "--cwd", "sub dir", "--", "pwd")
        assert (res.returncode, res.stdout) == (0, f"{fleet.alice.cwd / 'sub dir'}\n".encode()), (
            res.stderr
        )
    finally:
        fleet.alice.run("release", str(held))
    alice = fleet.ctl.client(fleet.alice.env["RC_TOKEN"])
    wait_until(lambda: job(alice, held)["state"] == "killed", 20, "the hold to end")
    with pytest.raises(ApiError) as e:
        alice.post(f"/v1/jobs/{held}/sessions", {"stdio": "pipe", "command": ["true"]})
    assert (e.value.code, e.value.message) == ("session_ended", f"hold {held} has ended (killed)")


def test_sessions_of_a_hold_that_reaches_its_ttl_say_it_expired(fleet, pty_cli):
    """Found by a new user: a hold reaching its ttl told its open terminal
    "signal: SIGKILL" (an interactive shell ignores SIGTERM) instead of why."""
    res = fleet.alice.run(
        "hold", "-d", "box:cpu1", "--ttl", "6s", "--reason", "ttl", "--detach", check=True
    )
    held = int(res.stdout)
    t = pty_cli(fleet.alice, "shell", str(held), "--", *BASH)
    t.send(b"echo in-$((3*3))\r")
    t.expect(b"in-9")
    ex = fleet.alice.popen("exec", str(held), "--", "sh", "-c", "echo up; exec sleep 60")
    assert ex.stdout.readline() == b"up\n"
    assert t.wait() != 0
    assert t.restored()
    expired = f"hold {held} expired (ttl 6s)".encode()
    assert expired in t.seen and b"SIGKILL" not in t.seen, t.seen[-400:]
    _, err = ex.communicate(timeout=30)
    assert ex.returncode != 0
    assert re.search(rb"session \d+ of hold %d: " % held + re.escape(expired), err), err


def test_a_hold_takes_new_sessions_after_a_controller_restart(tmp_path, pyz):
    """Found by a new user: a restarted controller numbers sessions from 1
    again, and the hold's worker dropped them as started already (rc exec
    waited 60 s for it, and so did every rc forward connection)."""
    from tests.helpers.worker_kit import free_port

    with running_fleet(tmp_path, pyz, listen=f"127.0.0.1:{free_port()}") as f:
        held = hold(f.alice, "box:cpu0")
        for round_ in range(2):
            res = f.alice.run("exec", str(held), "--", "echo", f"round {round_}", timeout=90)
            assert res.returncode == 0, (round_, res.stderr)
            assert res.stdout == f"round {round_}\n".encode()
            if round_ == 0:
                f.ctl.stop()
                f.ctl.start()
                assert job(f.ctl.client(), held)["state"] == "running"  # the hold lives on
        f.alice.run("release", str(held), check=True)
