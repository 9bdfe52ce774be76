"""`rc up` / `rc down`, the one-box deployment, as a user runs them."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import textwrap
from contextlib import contextmanager

import pytest

from rc.cli.upsettings import defaults_for
from rc.proto.client import Client
from tests.helpers.harness import PY, REPO, Cli, pid_alive, short_socket_path, stop_process
from tests.helpers.wait import wait_until

HELLO = ("run", "--", "python3", "-c", 'import os; print("hello from", os.environ["RC_DEVICE"])')


@pytest.fixture
def user(env, tmp_path):
    """The CLI as a new user: no RC_* variables, config written by rc up."""
    cli = Cli("", "", env, tmp_path)
    del cli.env["RC_CONTROLLER"], cli.env["RC_TOKEN"]
    yield cli
    cli.run("down", timeout=120)


SHARED = defaults_for(os.geteuid() == 0)


def _state(env) -> dict:
    path = os.path.join(env["XDG_DATA_HOME"], "rc", "up.json")
    with open(path) as f:
        return json.load(f)


def test_up_run_down_up_run_again(user):
    """Found by a new user: the second `rc up -d && rc run` lost its job to the
    registration of the new worker."""
    for round_ in range(2):
        up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "2", timeout=120)
        assert up.returncode == 0, up.stderr
        res = user.run(*HELLO)
        assert res.returncode == 0, (round_, res.stderr)
        assert res.stdout.startswith(b"hello from ")
        assert user.run("down", timeout=120).returncode == 0


def test_down_names_what_it_stops_and_loses_no_job_that_never_started(user):
    """Found by a new user: two jobs queued behind a `sleep 100` on one
    device, `rc down`, `rc up -d`: the one assigned as the sleep ended was
    `lost (worker re-registered)` though it never started. The stopping
    worker proves it never started it, so it goes back to its place."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    ids = [
        int(user.run("run", "--detach", "--", *cmd, check=True).stdout)
        for cmd in (("sleep", "100"), ("echo", "a"), ("echo", "b"))
    ]
    wait_until(
        lambda: json.loads(user.run("ps", "-o", "json").stdout)["jobs"][0]["state"] == "running",
        30,
        "the sleep to run",
    )
    down = user.run("down", timeout=120)
    assert down.returncode == 0, down.stderr
    err = down.stderr.decode()
    listed = err.index(f"rc:   job {ids[0]}: sleep 100 (")
    assert err.index("stopping the worker ends 1 running job:") < listed
    assert listed < err.index("stopped the worker"), "named before it is stopped"
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    for job_id in ids[1:]:
        res = user.run("logs", "-f", str(job_id), timeout=60)
        assert res.returncode == 0, (job_id, res.stderr)
    info = {j["id"]: j for j in json.loads(user.run("jobs", "-o", "json").stdout)}
    assert [info[i]["state"] for i in ids] == ["killed", "succeeded", "succeeded"]
    assert info[ids[0]]["kill_reason"] == "the worker is shutting down"
    assert info[ids[1]]["started_at"] <= info[ids[2]]["started_at"], "the queue order is kept"


def test_up_after_the_controller_was_killed_restarts_only_it(user, env):
    assert (
        user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120).returncode
        == 0
    )
    job = int(
        user.run(
            "run",
            "--detach",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6; do echo L$i; sleep 0.5; done; exit 3",
        ).stdout
    )
    before = _state(env)
    os.kill(before["serve_pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(before["serve_pid"]), 10, "the controller to die")
    up = user.run("up", "-d", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    after = _state(env)
    assert after["worker_pid"] == before["worker_pid"]  # not a second worker
    assert after["url"] == before["url"]
    res = user.run("logs", "-f", str(job))
    assert res.stdout.split() == [f"L{i}".encode() for i in range(1, 7)]
    info = json.loads(user.run("jobs", "-o", "json").stdout)
    assert [(j["id"], j["state"], j["exit_code"]) for j in info] == [(job, "failed", 3)]


def test_up_twice_says_already_up_and_succeeds(user, env):
    """Found by a new user: the quick-start line `rc up -d && rc run ...` could
    not be run twice, because the second rc up -d failed with "already up"."""
    for round_ in range(2):
        up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
        assert up.returncode == 0, (round_, up.stderr)
        if round_ == 0:
            first = _state(env)
        res = user.run(*HELLO)
        assert res.returncode == 0, (round_, res.stderr)
    assert b"already up" in up.stderr and b"rc down" in up.stderr
    assert _state(env) == first  # nothing was restarted


def test_two_ups_at_the_same_instant_start_one_box(user, env):
    """Found by a new user: of two `rc up -d` started together on one data
    dir, one failed with "in use by another rc serve"; now the second waits
    for the first and finds it up."""
    ups = [user.popen("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in ups]
    assert [p.returncode for p in ups] == [0, 0], outs
    assert sum(b"already up" in err for _out, err in outs) == 1, outs
    st = _state(env)
    assert pid_alive(st["serve_pid"]) and pid_alive(st["worker_pid"])
    res = user.run(*HELLO)
    assert res.returncode == 0, res.stderr


# -- a worker that registers is kept, whatever state its devices are in ------------


@contextmanager
def _orphan_job(user, tmp_path):
    """A detached job whose process outlives its worker; yields its pid and
    kills it at the end."""
    pidfile = tmp_path / "job.pid"
    res = user.run("run", "--detach", "--", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 300")
    assert res.returncode == 0, res.stderr
    pid = int(
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the job to start")
    )
    try:
        yield pid
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 10, "the job's process to die")


def _out_of_pool_line(stderr: bytes) -> tuple[str, str]:
    """The device named out of the pool for `registration`, and the rc clear
    command the message gives."""
    text = stderr.decode()
    m = re.search(
        r"(\S+:cpu0) is out of the pool \(registration: job \d+ was running when "
        r"the worker re-registered\): a process of the interrupted job may still be "
        r"running\. Once it has ended, `([^`]+)` returns the device",
        text,
    )
    assert m, text
    return m.group(1), m.group(2)


def _run_shell(user, command: str) -> subprocess.CompletedProcess:
    """`command` as the user types it into a shell where `rc` is this checkout's."""
    return subprocess.run(
        ["bash", "-c", f'rc() {{ "{PY}" -m rc "$@"; }}; {command}'],
        env=user.env,
        cwd=user.cwd,
        capture_output=True,
        timeout=60,
        check=False,
    )


def _own_host(tmp_path) -> str:
    """A host name for this test's one-box. The recovery proof scans the whole
    machine for processes of jobs of the worker's host name: with the machine's
    own name, a job process left by any other one-box on this machine (a
    person's `rc up` with a `sleep 301` orphan) is rightly a survivor, and the
    device stays out. A name of its own keeps the test about its own jobs."""
    return f"up-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**6}"


def _device_state(user, device: str) -> str:
    devices = json.loads(user.run("devices", "-o", "json").stdout)
    return next(d["device"]["state"] for d in devices if d["device"]["id"] == device)


def test_up_after_a_worker_crash_keeps_the_new_worker_and_says_why_a_device_is_out(
    user, env, tmp_path
):
    """Found by a new user: after `kill -9` of the worker while a job ran, the
    job's process still ran, so the new worker's device was (rightly)
    quarantined `registration`; rc up -d waited 30 s for it to become ready,
    then killed the worker it had just started, exited 1 and left up.json
    naming the dead worker."""
    host = ("--host", _own_host(tmp_path))
    assert (
        user.run(
            "up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", *host, timeout=120
        ).returncode
        == 0
    )
    with _orphan_job(user, tmp_path) as orphan:
        before = _state(env)
        os.kill(before["worker_pid"], signal.SIGKILL)
        wait_until(lambda: not pid_alive(before["worker_pid"]), 10, "the worker to die")
        up = user.run("up", "-d", "--devices", "1", *host, timeout=120)
        assert up.returncode == 0, up.stderr
        device, clear = _out_of_pool_line(up.stderr)
        after = _state(env)
        assert after["serve_pid"] == before["serve_pid"]
        assert after["worker_pid"] != before["worker_pid"] and pid_alive(after["worker_pid"])
        assert _device_state(user, device) == "unhealthy"
        again = user.run("up", "-d", timeout=120)  # already up: says so, and what is out
        assert again.returncode == 0 and b"already up" in again.stderr, again.stderr
        assert _out_of_pool_line(again.stderr) == (device, clear)
        assert _state(env) == after
        assert pid_alive(orphan)
    # the job's process has ended: the advice works as written, and the
    # worker rc up kept serves
    res = _run_shell(user, clear)
    assert res.returncode == 0, res.stderr
    assert pid_alive(after["worker_pid"]) and _device_state(user, device) == "ready"
    res = user.run(*HELLO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"hello from {device}".encode()


def test_foreground_up_after_a_worker_crash_runs_with_the_device_out(user, env, tmp_path):
    """The same rule without -d: the worker registered, so rc up runs.

    Failed three runs in three on a machine where a person's one-box had left
    an orphan job process of the machine's host name (see _own_host)."""
    host = ("--host", _own_host(tmp_path))

    def up(n: int) -> tuple[subprocess.Popen, object]:
        log = tmp_path / f"up-{n}.err"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [PY, "-m", "rc", "up", "--listen", "127.0.0.1:0", "--devices", "1", *host],
                env=user.env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

        def started():
            if proc.poll() is not None:
                raise AssertionError(f"rc up exited {proc.returncode}:\n{log.read_text()}")
            return "press Ctrl-C to stop" in log.read_text()

        try:
            wait_until(started, 90, "rc up to start")
        except BaseException:
            stop_process(proc, sig=signal.SIGINT, timeout=90)
            raise
        return proc, log

    procs = [up(1)[0]]
    try:
        with _orphan_job(user, tmp_path) as orphan:
            os.kill(_state(env)["worker_pid"], signal.SIGKILL)
            assert procs[0].wait(90) == 1  # the worker died: rc up stopped everything
            second, log = up(2)
            procs.append(second)
            device, _ = _out_of_pool_line(log.read_bytes())
            assert pid_alive(_state(env)["worker_pid"]) and pid_alive(orphan)
            assert _device_state(user, device) == "unhealthy"
            assert stop_process(second, sig=signal.SIGINT, timeout=90) == 130
        # the job's process has ended: a restart returns the device, as rc up said
        third, log = up(3)
        procs.append(third)
        assert "out of the pool" not in log.read_text()
        assert _device_state(user, device) == "ready"
        assert stop_process(third, sig=signal.SIGINT, timeout=90) == 130
    finally:
        for proc in procs:
            stop_process(proc, sig=signal.SIGINT, timeout=90)


# -- the README's recipe for running the two parts yourself ------------------------


def _recipe() -> list[str]:
    """The commands of the README's "run the two parts yourself" block, one
    string each (continuation lines joined)."""
    text = (REPO / "README.md").read_text()
    block = text.split("run the two parts yourself", 1)[1].split("\n\n")[1]
    assert all(line.startswith("    ") for line in block.splitlines()), block
    return [" ".join(c.split()) for c in textwrap.dedent(block).replace("\\\n", " ").splitlines()]


def test_readme_recipe_for_running_the_two_parts_yourself(tmp_path, env, unix_users):
    """Found by a new user: the recipe's worker read DIR/worker.token, which
    nothing had written. Every command is run as written (DIR and the port
    replaced). The worker runs as root, so the user's job runs as that user
    (a real one: its token maps to rc-test-alice)."""
    serve_line, token_line, worker_line = _recipe()
    assert serve_line.startswith("rc serve ") and worker_line.startswith("rc worker ")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"

    def shell(line: str) -> list[str]:
        line = line.replace("DIR", str(data)).replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        return ["bash", "-c", f'rc() {{ "{PY}" -m rc "$@"; }}; {line}']

    started: list[subprocess.Popen] = []

    def start(line: str, log: str) -> subprocess.Popen:
        with open(tmp_path / log, "wb") as out:
            proc = subprocess.Popen(
                shell(line),
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        started.append(proc)
        return proc

    try:
        serve = start(serve_line, "serve.log")
        url = f"http://127.0.0.1:{port}"

        def serving():
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            return Client(url, (data / "admin.token").read_text().strip(), timeout=5).get(
                "/v1/whoami"
            )

        wait_until(serving, 60, "rc serve to answer")
        res = subprocess.run(
            shell(token_line),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        token_file = data / "worker.token"
        assert token_file.read_text().startswith("rc_")
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        worker = start(worker_line, "worker.log")
        admin = Client(url, (data / "admin.token").read_text().strip())

        def ready():
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            return [
                v for v in admin.get("/v1/devices")["devices"] if v["device"]["state"] == "ready"
            ]

        wait_until(ready, 60, "the worker's devices to be ready")
        alice = unix_users[0]
        me = admin.post("/v1/tokens", {"name": "me", "role": "user", "unix_user": alice})
        with_user = dict(env, RC_CONTROLLER=url, RC_TOKEN=me["secret"])
        res = subprocess.run(
            [PY, "-m", "rc", *HELLO],
            env=with_user,
            cwd=pwd.getpwnam(alice).pw_dir,  # a directory the job's user may enter
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0 and res.stdout.startswith(b"hello from "), res.stderr
    finally:
        for proc in reversed(started):  # the worker first; each in its own group
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# -- a new user's one-boxes: a second one, other settings, a lost config, down twice ---


def _config(env) -> str:
    return os.path.join(env["XDG_CONFIG_HOME"], "rc", "config.toml")


def test_a_second_one_box_on_one_machine_takes_its_own_host_name(user, env, tmp_path):
    """Found by a new user: `rc up --data D2 --listen ...` failed on the host
    lock of the first one-box, with no word of how to run a second."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    d2 = tmp_path / "d2"
    second = (
        "up", "-d", "--data", str(d2), "--listen", "127.0.0.1:0", "--devices", "1",
        "--socket", short_socket_path(d2),  # as root, the first has the default socket
    )  # fmt: skip
    res = user.run(*second, timeout=120)
    assert res.returncode == 1
    assert b"another rc worker for host" in res.stderr and b"--host NAME" in res.stderr
    assert not (d2 / "up.json").exists()
    try:
        res = user.run(*second, "--host", "box2", timeout=120)
        assert res.returncode == 0, res.stderr
        assert b"worker on box2 with box2:cpu0" in res.stderr
        st2 = json.loads((d2 / "up.json").read_text())
        assert st2["host"] == "box2"
        # the second box runs jobs beside the first
        other = Cli(st2["url"], (d2 / "admin.token").read_text().strip(), user.env, tmp_path)
        res = other.run(*HELLO)
        assert res.returncode == 0 and res.stdout == b"hello from box2:cpu0\n", res.stderr
        res = user.run(*HELLO)  # the config still points at the first
        assert res.returncode == 0 and not res.stdout.startswith(b"hello from box2"), res
        # its data dir remembers the name: after rc down, rc up -d needs no --host
        assert user.run("down", "--data", str(d2), timeout=120).returncode == 0
        res = user.run("up", "-d", "--data", str(d2), "--listen", "127.0.0.1:0", timeout=120)
        assert res.returncode == 0 and b"worker on box2 " in res.stderr, res.stderr
    finally:
        user.run("down", "--data", str(d2), timeout=120)


def test_up_on_a_running_one_box_with_other_settings_names_them_and_fails(user, env):
    """Found by a new user: `rc up -d --devices 2` on a running one-box with 1
    device said "already up" and exited 0, the new setting quietly ignored."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    first = _state(env)
    res = user.run("up", "-d", "--devices", "2", "--listen", "127.0.0.1:9", timeout=120)
    assert res.returncode == 1
    err = res.stderr.decode()
    assert err.startswith("rc: rc is already up in "), err
    assert "--devices 2 (it runs with --devices 1)" in err
    assert f"--listen 127.0.0.1:9 (it listens at {first['url']})" in err
    assert "rc down" in err and "--host NAME" in err
    assert _state(env) == first  # nothing was restarted
    # the same settings, or none, are "already up"
    address = first["url"].rpartition("//")[2]
    for again in (("--devices", "1"), ("--listen", address), ("--listen", "127.0.0.1:0"), ()):
        res = user.run("up", "-d", *again, timeout=120)
        assert res.returncode == 0 and b"already up" in res.stderr, (again, res.stderr)
    # a crashed worker comes back with the devices it had, unless told otherwise
    os.kill(first["worker_pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(first["worker_pid"]), 10, "the worker to die")
    res = user.run("up", "-d", timeout=120)
    assert res.returncode == 0, res.stderr
    assert re.search(rb"worker on \S+ with \S+:cpu0; ", res.stderr), res.stderr
    assert _state(env)["devices"] == "1"


def test_up_rewrites_a_deleted_or_corrupt_client_config(user, env):
    """Found by a new user: with ~/.config/rc/config.toml deleted (or broken),
    `rc up -d` said "already up" and the quick start's rc run failed for want
    of a token."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    me = json.loads(user.run("whoami", "-o", "json").stdout)["name"]
    mine = int(user.run("run", "--detach", "--", "echo", "mine", check=True).stdout)

    def same_identity(res: subprocess.CompletedProcess) -> None:
        """Found by a new user: the rewritten config held a token named
        root-1 (then root-2, ...), so `rc logs` of their own job said
        not_job_owner and tokens piled up. The name, and the jobs, stay."""
        assert json.loads(user.run("whoami", "-o", "json").stdout)["name"] == me
        logs = user.run("logs", "-f", str(mine))
        assert (logs.returncode, logs.stdout) == (0, b"mine\n"), logs.stderr
        assert f"a new secret for token {me}, which keeps its jobs".encode() in res.stderr, (
            res.stderr
        )

    conf = _config(env)
    os.unlink(conf)
    res = user.run("up", "-d", timeout=120)
    assert res.returncode == 0 and b"already up" in res.stderr, res.stderr
    assert f"wrote {conf}".encode() in res.stderr
    assert stat.S_IMODE(os.stat(conf).st_mode) == 0o600
    same_identity(res)
    assert user.run(*HELLO).returncode == 0
    with open(conf, "w") as f:
        f.write("controller = [\n")
    res = user.run("up", "-d", timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"rewrote {conf}, which could not be read".encode() in res.stderr
    with open(conf + ".broken") as f:
        assert f.read() == "controller = [\n"
    same_identity(res)
    assert user.run(*HELLO).returncode == 0
    # a token this controller does not know (a new data dir, say) is replaced too
    url = _state(env)["url"]
    with open(conf, "w") as f:
        f.write(f'controller = "{url}"\ntoken = "rc_from-an-older-controller"\n')
    res = user.run("up", "-d", timeout=120)
    assert f"rewrote {conf}: its token is not one of this controller's".encode() in res.stderr
    same_identity(res)
    res = user.run(*HELLO)
    assert res.returncode == 0, res.stderr
    # one live user token, of the user's name: nothing piled up
    data = os.path.join(env["XDG_DATA_HOME"], "rc")
    with open(os.path.join(data, "admin.token")) as f:
        admin = Client(url, f.read().strip())
    users = [
        t["name"]
        for t in admin.get("/v1/tokens")["tokens"]
        if t["role"] == "user" and not t["revoked_at"]
    ]
    assert users == [me]


def test_down_twice_says_already_down_and_succeeds(user):
    """Found by a new user: the second `rc down` exited 1."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    assert user.run("down", timeout=120).returncode == 0
    again = user.run("down", timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stderr.startswith(b"rc: already down: nothing to stop"), again.stderr


def test_a_second_one_box_comes_back_on_its_own_port_named_by_rc_controller(user, tmp_path):
    """Found by a new user: after `rc down --data DIR`, `rc up -d --data DIR`
    remembered the host name but not --listen (so the second one-box came
    back on :8080, not its own port); and with RC_CONTROLLER naming the new
    controller, rc up -d said "config points at :8080, not :8095"."""
    up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr  # the first one-box: the config points at it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    d2 = tmp_path / "d2"
    second = Cli(url, "", user.env, tmp_path)
    del second.env["RC_TOKEN"]
    try:
        res = second.run(
            "up", "-d", "--data", str(d2), "--listen", f"127.0.0.1:{port}", "--devices", "1",
            "--host", "box2", "--socket", short_socket_path(d2), timeout=120,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert b"points at" not in res.stderr, res.stderr
        assert b"RC_CONTROLLER names this controller" in res.stderr, res.stderr
        assert b": set RC_TOKEN too\n" in res.stderr, res.stderr
        second.env["RC_TOKEN"] = (d2 / "admin.token").read_text().strip()
        res = second.run("down", "--data", str(d2), timeout=120)
        assert res.returncode == 0, res.stderr
        assert second.run("down", "--data", str(d2)).stderr.startswith(b"rc: already down")
        res = second.run("up", "-d", "--data", str(d2), timeout=120)
        assert res.returncode == 0, res.stderr
        assert b"note" not in res.stderr, res.stderr  # both variables name it: nothing to say
        st2 = json.loads((d2 / "up.json").read_text())
        assert (st2["url"], st2["host"], st2["devices"]) == (url, "box2", "1")
        res = second.run(*HELLO)
        assert res.returncode == 0 and res.stdout == b"hello from box2:cpu0\n", res.stderr
    finally:
        second.run("down", "--data", str(d2), timeout=120)


def test_up_passes_every_scheduling_option_to_its_controller(user, env):
    up = user.run(
        "up", "-d", "--listen", "127.0.0.1:0", "--devices", "1", "--aging", "5m",
        "--max-devices-per-user", "1", "--max-user-priority", "3", "--fair-share", "7d",
        timeout=120,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    shares = json.loads(user.run("share", "-o", "json", check=True).stdout)
    assert shares["half_life_seconds"] == 7 * 86400
    res = user.run("run", "--detach", "--priority", "4", "--", "true")
    assert res.returncode == 1 and b"limit of 3" in res.stderr, res.stderr
    res = user.run("run", "--detach", "-n", "2", "--", "true")
    assert res.returncode == 1 and b"per-user cap of 1" in res.stderr, res.stderr
    hold = int(user.run("hold", "--ttl", "1h", "--reason", "r", "--detach", check=True).stdout)
    wait_until(
        lambda: json.loads(user.run("ps", "-o", "json").stdout)["jobs"][0]["id"] == hold,
        30,
        "the hold to start",
    )
    queued = int(user.run("run", "--detach", "--", "true", check=True).stdout)
    ex = json.loads(user.run("explain", str(queued), "-o", "json", check=True).stdout)
    # "+ aging" only with aging on, "- fair share" only with fair share on
    assert ex["priority"].startswith("priority 0 + aging 0 - fair share ")
    assert _state(env)["scheduling"] == {
        "aging": "5m",
        "max_devices_per_user": "1",
        "max_user_priority": "3",
        "fair_share": "7d",
        **SHARED,  # root's box: the shared-box defaults (README "Shared-box defaults")
    }
    again = user.run("up", "-d", "--aging", "1m", timeout=120)
    assert again.returncode == 1 and b"--aging 1m (its controller runs with --aging 5m)" in (
        again.stderr
    ), again.stderr
    # one value, another spelling: "already up", not "other settings"
    again = user.run("up", "-d", "--aging", "300s", "--fair-share", "168h", timeout=120)
    assert again.returncode == 0 and b"already up" in again.stderr, again.stderr
    # found by a new user: the next rc up given one option forgot every other one
    user.run("down", check=True, timeout=120)
    again = user.run("up", "-d", "--aging", "1m", timeout=120)
    assert again.returncode == 0, again.stderr
    assert _state(env)["scheduling"] == {
        "aging": "1m",
        "max_devices_per_user": "1",
        "max_user_priority": "3",
        "fair_share": "7d",
        **SHARED,  # root's box: the shared-box defaults (README "Shared-box defaults")
    }
    res = user.run("run", "--detach", "--priority", "4", "--", "true")
    assert res.returncode == 1 and b"limit of 3" in res.stderr, res.stderr
