"""Jobs run as the people who submit them, with real Unix users
(docs/design.md#identity-and-ownership).

A one-box started as root (`rc up -d`, as `sudo rc up -d` would), and the
CLI run as the test users rc-test-alice and rc-test-bob (tests/conftest.py
unix_users) from the zipapp, with no token: each gets one for their own
Unix user from the controller's local socket, which knows them from the
kernel. Their jobs, holds, `rc exec`, `rc cp` and terminals run as them;
the attacks of the issue fail as the kernel says they must.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from rc.worker.terminal import CTTY_SHIM
from tests.helpers.harness import (
    PY,
    RUNUSER,
    SYSTEM_PY,
    Controller,
    UserCli,
    base_env,
    device_state,
    job,
)
from tests.helpers.wait import wait_until

ALICE, BOB = "rc-test-alice", "rc-test-bob"
HOST = "idbox"


@dataclass
class OneBox:
    """A one-box started by root in `root` (a directory every user may enter,
    so only the data dir's own mode keeps them out of it)."""

    root: Path
    data: Path
    socket: str
    env: dict[str, str]
    admin: Client
    alice: UserCli
    bob: UserCli

    def root_cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """rc as root, with the client config rc up wrote."""
        return subprocess.run(
            [PY, "-m", "rc", *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def onebox(unix_users, public_pyz, tmp_path_factory) -> Iterator[OneBox]:
    root = Path(tempfile.mkdtemp(prefix="rc-onebox-", dir="/tmp"))
    root.chmod(0o755)
    env = base_env(tmp_path_factory.mktemp("root-home"))
    env["RC_SOCKET"] = str(root / "rc.sock")
    data = root / "data"
    up = [PY, "-m", "rc", "up", "-d", "--data", str(data), "--listen", "127.0.0.1:0"]
    res = subprocess.run(
        [*up, "--devices", "2", "--host", HOST],
        env=env,
        cwd=root,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    url = json.loads((data / "up.json").read_text())["url"]
    admin = Client(url, (data / "admin.token").read_text().strip())
    users = {"RC_SOCKET": env["RC_SOCKET"]}
    box = OneBox(
        root,
        data,
        env["RC_SOCKET"],
        env,
        admin,
        UserCli(ALICE, public_pyz, users),
        UserCli(BOB, public_pyz, users),
    )
    try:
        yield box
    finally:
        box.root_cli("down", "--data", str(data), timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def _out(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    return res.stdout.decode()


def _job_pid(job_id: int) -> int:
    """The pid of the process carrying RC_JOB_ID=job_id (read as root)."""
    want = f"RC_JOB_ID={job_id}".encode()

    def find() -> int:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if want in f.read().split(b"\0"):
                            return int(name)
                except OSError:
                    continue
        return 0

    return wait_until(find, 20, f"a process of job {job_id}")


def _uids(pid: int) -> list[int]:
    """A process's real, effective, saved and filesystem uids (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("Uid:"))
    return [int(x) for x in line.split()[1:]]


# -- identity and the account a job gets --------------------------------------------


def test_each_local_user_runs_jobs_as_themselves_with_no_token(onebox):
    alice, bob = onebox.alice, onebox.bob
    assert _out(alice.run("whoami")) == f"{ALICE} (user, runs jobs as {ALICE})\n"
    made = Path(alice.home) / f"made-by-job-{uuid.uuid4().hex[:8]}"
    res = alice.run(  # the clean start: --export ALL (the default) sends the user's PATH
        "run", "--export", "NONE", "--", "sh", "-c",
        f'id -un; echo "$HOME $USER $LOGNAME $SHELL"; umask; echo "$PATH"; touch {made}',
    )  # fmt: skip
    lines = _out(res).splitlines()
    assert lines[0] == ALICE
    assert lines[1] == f"{alice.home} {ALICE} {ALICE} /bin/sh"
    assert lines[2] == "0022"
    assert lines[3] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    st = made.stat()
    assert (st.st_uid, st.st_gid) == (alice.uid, pwd.getpwnam(ALICE).pw_gid)
    assert stat.S_IMODE(st.st_mode) == 0o644
    made.unlink()
    assert _out(bob.run("run", "--", "id", "-un")) == f"{BOB}\n"
    # the job records who submitted it and whom it ran as
    mine = onebox.admin.get("/v1/jobs", params={"submitter": ALICE, "limit": 1})["jobs"][0]
    assert (mine["submitter"], mine["unix_user"]) == (ALICE, ALICE)


def test_the_socket_token_is_cached_privately_and_reused(onebox):
    alice = onebox.alice
    _out(alice.run("whoami"))
    cache = Path(f"/tmp/rc-{alice.uid}")
    st = cache.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o700)
    [held] = [
        p
        for p in cache.glob("socket-*.json")
        if json.loads(p.read_text()).get("socket") == onebox.socket
    ]
    assert (held.stat().st_uid, stat.S_IMODE(held.stat().st_mode)) == (alice.uid, 0o600)
    before = held.read_text()
    assert json.loads(before)["name"] == ALICE
    _out(alice.run("whoami"))
    assert held.read_text() == before  # reused, not asked for again
    # RC_CONTROLLER names the socket just as well
    named = UserCli(ALICE, alice.pyz, {"RC_CONTROLLER": f"unix://{onebox.socket}"})
    assert _out(named.run("whoami")).startswith(f"{ALICE} (user")
    # ...even when her config file holds another controller's token: the file's
    # token belongs to the file's controller (it won, and was refused: 401)
    other = onebox.root / f"alice-config-{uuid.uuid4().hex[:8]}.toml"
    other.write_text('controller = "http://127.0.0.1:9"\ntoken = "rc_of_another_box"\n')
    other.chmod(0o644)
    both = UserCli(
        ALICE, alice.pyz, {"RC_CONTROLLER": f"unix://{onebox.socket}", "RC_CONFIG": str(other)}
    )
    assert _out(both.run("whoami")).startswith(f"{ALICE} (user")
    other.unlink()


def test_root_on_its_own_one_box_runs_its_jobs_as_root(onebox):
    """rc up run by root sets allow_root_jobs for its own worker."""
    assert _out(onebox.root_cli("run", "--", "id", "-un")) == "root\n"


# -- the attacks ---------------------------------------------------------------


def test_the_first_repro_is_permission_denied(onebox):
    """Found by a new user: `rc run -- cat .../admin.token` as bob printed the
    admin token."""
    st = onebox.data.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    public = onebox.root / f"public-{uuid.uuid4().hex[:8]}.txt"
    public.write_text("anyone may read this\n")
    public.chmod(0o644)
    # the job could read a file beside the data dir: only the data dir keeps it out
    assert _out(onebox.bob.run("run", "--", "cat", str(public))) == "anyone may read this\n"
    res = onebox.bob.run("run", "--", "cat", str(onebox.data / "admin.token"))
    assert res.returncode == 1
    assert b"Permission denied" in res.stdout + res.stderr
    assert b"rc_" not in res.stdout
    res = onebox.bob.run("run", "--", "ls", str(onebox.data))
    assert res.returncode != 0 and b"Permission denied" in res.stdout + res.stderr


def test_a_user_cannot_read_or_signal_another_users_job(onebox):
    alice, bob = onebox.alice, onebox.bob
    jid = int(_out(alice.run("run", "--detach", "-d", f"{HOST}:cpu0", "--", "sleep", "300")))
    try:
        pid = _job_pid(jid)
        # its credentials, not /proc/PID's owner: that reads root for an instant
        # while a process that changed user execs (CI caught it mid-exec)
        assert _uids(pid) == [alice.uid] * 4
        probe = (
            "import os, signal\n"
            f"pid = {pid}\n"
            "try:\n"
            "    open(f'/proc/{pid}/environ', 'rb').read(); print('environ: read')\n"
            "except OSError as e:\n"
            "    print('environ:', type(e).__name__)\n"
            "try:\n"
            "    os.kill(pid, signal.SIGTERM); print('kill: sent')\n"
            "except OSError as e:\n"
            "    print('kill:', type(e).__name__)\n"
        )
        res = bob.run("run", "-d", f"{HOST}:cpu1", "--", SYSTEM_PY, "-c", probe)
        assert _out(res) == "environ: PermissionError\nkill: PermissionError\n"
        assert job(onebox.admin, jid)["state"] == "running"  # alice's job lives on
    finally:
        onebox.admin.post(f"/v1/jobs/{jid}/kill")
        wait_until(lambda: job(onebox.admin, jid)["state"] == "killed", 30, "alice's job killed")


def test_a_cwd_the_user_may_not_enter_fails_the_job_and_nothing_runs(onebox):
    private = onebox.root / f"private-{uuid.uuid4().hex[:8]}"
    private.mkdir(mode=0o700)
    marker = Path(f"/tmp/rc-test-ran-{uuid.uuid4().hex}")
    res = onebox.bob.run(
        "run", "--cwd", str(private), "-d", f"{HOST}:cpu0", "--", "touch", str(marker)
    )
    assert res.returncode == 1
    assert (
        f"cannot start: {BOB} may not enter {private} on {HOST} (permission denied)".encode()
        in res.stderr
    ), res.stderr
    assert not marker.exists()  # nothing ran, as bob or as root
    assert device_state(onebox.admin, f"{HOST}:cpu0") == "ready"


def test_rc_cp_writes_as_the_user_and_fails_where_the_user_could_not(onebox):
    bob = onebox.bob
    entry = pwd.getpwnam(BOB)
    tag = uuid.uuid4().hex[:8]
    src = Path(bob.home) / f"src-{tag}.txt"
    src.write_text("bob's data\n")
    os.chown(src, entry.pw_uid, entry.pw_gid)
    into = Path(bob.home) / f"into-{tag}"
    into.mkdir()
    os.chown(into, entry.pw_uid, entry.pw_gid)
    private = onebox.root / f"private-{tag}"
    private.mkdir(mode=0o755)  # root's: bob may enter it, not write in it
    # as a short job on a free device
    _out(bob.run("cp", str(src), f"{HOST}:cpu1:{into}/"))
    copied = into / src.name
    assert copied.read_text() == "bob's data\n" and copied.stat().st_uid == entry.pw_uid
    res = bob.run("cp", str(src), f"{HOST}:cpu1:{private}/")
    assert res.returncode == 1 and b"Permission denied" in res.stderr, res.stderr
    assert list(private.iterdir()) == []
    # a download from behind a directory bob may not enter is refused as such,
    # not as a missing file (both leave nothing behind)
    secret = onebox.data / "admin.token"  # the data dir is 0700 root
    res = bob.run("cp", f"{HOST}:cpu1:{secret}", str(into) + "/")
    assert res.returncode == 1 and f"{secret}: permission denied".encode() in res.stderr, res
    res = bob.run("cp", f"{HOST}:cpu1:{into}/missing-{tag}", str(into) + "/")
    assert res.returncode == 1 and b"no such file or directory" in res.stderr, res
    assert list(into.iterdir()) == [copied]
    # inside a hold: the hold, its copies and its sessions are bob's
    hold = _out(bob.run("hold", "--detach", "-d", f"{HOST}:cpu1", "--ttl", "5m", "--reason", "t"))
    try:
        assert _out(bob.run("exec", hold.strip(), "--", "id", "-un")) == f"{BOB}\n"
        (into / src.name).unlink()
        _out(bob.run("cp", str(src), f"{HOST}:cpu1:{into}/"))
        assert (into / src.name).stat().st_uid == entry.pw_uid
        res = bob.run("cp", str(src), f"{HOST}:cpu1:{private}/")
        assert res.returncode == 1 and b"Permission denied" in res.stderr, res.stderr
    finally:
        bob.run("release", hold.strip())


def test_rc_cp_of_what_the_user_cannot_read_copies_nothing_and_says_why(onebox):
    """The trial: `rc cp` up of a tree holding a file its user could not read
    left the rest of the tree under the final name (tarfile stopped between
    entries and GNU tar took the cut stream for a whole archive), and a
    download of one unreadable file said "the archive is empty" instead of
    the far side's permission denied. Now nothing is left under the final
    name nor as a temporary, and the message names the file."""
    bob = onebox.bob
    entry = pwd.getpwnam(BOB)
    tag = uuid.uuid4().hex[:8]
    home = Path(bob.home)

    def bobs(path: Path, text: str | None = None) -> Path:
        """Make `path` (a directory, or a file holding `text`), bob's."""
        if text is None:
            path.mkdir()
        else:
            path.write_text(text)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    tree = bobs(home / f"tree-{tag}")
    bobs(tree / "a-readable", "fine\n")
    secret = tree / "m-secret"
    secret.write_text("root's\n")  # root's, 0600: bob may not read it
    secret.chmod(0o600)
    bobs(tree / "z-readable", "fine\n")
    into = bobs(home / f"into-{tag}")
    # up: refused before anything is sent, naming the file
    res = bob.run("cp", str(tree), f"{HOST}:cpu1:{into}/")
    assert res.returncode == 1, res
    assert res.stderr.decode() == (
        f"rc: cannot read {secret}: Permission denied; nothing was sent\n"
    ), res.stderr
    assert list(into.iterdir()) == []
    # down: one file bob may not read, then a tree with one
    res = bob.run("cp", f"{HOST}:cpu1:{secret}", str(into) + "/")
    assert res.returncode == 1, res
    assert b"the archive is empty" not in res.stderr, res.stderr
    assert f"{secret}: permission denied".encode() in res.stderr, res.stderr
    res = bob.run("cp", f"{HOST}:cpu1:{tree}", str(into) + "/")
    assert res.returncode == 1, res
    assert b"m-secret: Cannot open: Permission denied" in res.stderr, res.stderr
    assert list(into.iterdir()) == []


def _pty_run(user: UserCli, *args: str, timeout: float = 60) -> tuple[int, bytes]:
    """`rc ARGS` as `user` on a pseudo-terminal; (exit code, what it printed)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [PY, "-c", CTTY_SHIM, *user.command(*args)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**user.env, "TERM": "xterm"},
        cwd=user.home,
        start_new_session=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: everyone closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(10), out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)


def test_a_terminal_is_the_users_own(onebox):
    code, out = _pty_run(onebox.alice, "run", "--tty", "--", "sh", "-c", "id -un; ls -n $(tty)")
    assert code == 0, out
    assert f"{ALICE}\r\n".encode() in out
    assert re.search(rf"crw--w---- 1 {onebox.alice.uid} ".encode(), out), out


def test_a_forged_identity_is_ignored_over_tcp_and_over_the_socket(onebox):
    admin = onebox.admin
    secret = admin.post(
        "/v1/tokens", {"name": f"forger-{uuid.uuid4().hex[:6]}", "role": "user", "unix_user": BOB}
    )
    forger = Client(admin.url, secret["secret"])
    name = secret["token"]["name"]
    headers = {
        "X-Remote-User": "root",
        "Remote-User": "root",
        "X-Forwarded-User": ALICE,
        "X-Rc-User": "root",
        "X-Rc-Unix-User": "root",
    }
    body = {"command": ["id", "-un"], "device_id": f"{HOST}:cpu0", "cwd": "/"}
    made = forger.request("POST", "/v1/jobs", body, headers=headers).json()["job"]
    assert (made["submitter"], made["unix_user"]) == (f"{BOB} (token {name})", BOB)
    assert made["owner"] == f"token:{secret['token']['id']}"  # its principal, not a name
    wait_until(lambda: job(admin, made["id"])["state"] == "succeeded", 30, "the forger's job")
    assert forger.request("GET", f"/v1/jobs/{made['id']}/logs", params={"follow": 0}).body == (
        f"{BOB}\n".encode()
    )
    assert forger.get("/v1/whoami", headers=headers)["name"] == name
    for field in ("unix_user", "submitter", "token_name", "owner"):  # not fields a client gives
        with pytest.raises(ApiError) as e:
            forger.post("/v1/jobs", {**body, field: "root"})
        assert e.value.status == 400 and field in e.value.message
    # over the socket: whatever the client sends first, the answer is its own user's
    ask = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({onebox.socket!r})\n"
        "try:\n"  # the controller reads nothing: it may have answered and closed already
        '    s.sendall(b\'{"name": "root", "uid": 0, "role": "admin"}\\n\')\n'
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    pass\n"
        "got = json.loads(s.makefile('rb').readline())\n"
        "print(got['name'], got['role'], got['unix_user'])\n"
    )
    res = subprocess.run(
        [RUNUSER, "-u", BOB, "--", SYSTEM_PY, "-I", "-c", ask],
        capture_output=True,
        timeout=30,
        check=False,
        cwd="/",
    )
    assert res.stdout == f"{BOB} user {BOB}\n".encode(), res.stderr


def test_a_user_this_host_does_not_know_fails_at_start_and_the_device_stays_ready(onebox):
    admin = onebox.admin
    ghost = admin.post(
        "/v1/tokens", {"name": "ghost", "role": "user", "unix_user": "rc-test-nosuchuser"}
    )
    c = Client(admin.url, ghost["secret"])
    made = c.post("/v1/jobs", {"command": ["true"], "device_id": f"{HOST}:cpu0"})["job"]
    done = wait_until(
        lambda: (j := job(admin, made["id"]))["state"] in ("failed", "succeeded") and j,
        30,
        "the ghost's job to end",
    )
    assert (done["state"], done["kill_reason"]) == (
        "failed",
        f"no user rc-test-nosuchuser on {HOST}",
    )
    assert device_state(admin, f"{HOST}:cpu0") == "ready"
    feed = admin.get("/v1/events")["events"]
    assert not [e for e in feed if e["kind"] == "device_unhealthy" and e["job_id"] == made["id"]]


# -- the socket itself ------------------------------------------------------------------


@pytest.fixture
def sock_path() -> Iterator[str]:
    where = Path(tempfile.mkdtemp(prefix="rc-sock-", dir="/tmp"))
    where.chmod(0o755)
    yield str(where / "rc.sock")
    shutil.rmtree(where, ignore_errors=True)


def test_local_users_group_lets_only_its_members_in(
    unix_users, public_pyz, sock_path, tmp_path, env
):
    ctl = Controller(
        tmp_path / "data", env, ["--local-users", f"group:{BOB}"], socket=sock_path
    ).start()
    try:
        users = {"RC_SOCKET": sock_path}
        res = UserCli(ALICE, public_pyz, users).run("whoami")
        assert res.returncode == 1
        assert (
            res.stderr
            == (
                f"rc: forbidden: {ALICE} is not in group {BOB}, the local users of this controller "
                "(rc serve --local-users); ask an admin for a token\n"
            ).encode()
        )
        assert _out(UserCli(BOB, public_pyz, users).run("whoami")).startswith(f"{BOB} (user")
    finally:
        ctl.stop()


def test_a_restarted_controller_hands_out_a_fresh_token(
    unix_users, public_pyz, sock_path, tmp_path, env
):
    """Socket tokens live in the controller's memory only: after a restart
    the cached one is refused (401) and the CLI asks the socket again."""
    ctl = Controller(tmp_path / "data", env, socket=sock_path).start()
    alice = UserCli(ALICE, public_pyz, {"RC_SOCKET": sock_path})
    try:
        _out(alice.run("whoami"))
        [held] = [
            p
            for p in Path(f"/tmp/rc-{alice.uid}").glob("socket-*.json")
            if json.loads(p.read_text()).get("socket") == sock_path
        ]
        before = json.loads(held.read_text())["token"]
        ctl.stop()
        assert not os.path.exists(sock_path)  # it removes its socket
        again = Controller(tmp_path / "data", env, socket=sock_path, listen=ctl.url[7:]).start()
        try:
            assert _out(alice.run("whoami")).startswith(f"{ALICE} (user")
            assert json.loads(held.read_text())["token"] != before
        finally:
            again.stop()
    finally:
        ctl.stop()


def test_the_socket_refuses_a_second_controller_and_takes_over_a_stale_one(
    sock_path, tmp_path, env
):
    ctl = Controller(tmp_path / "one", env, socket=sock_path).start()
    try:
        res = subprocess.run(
            [PY, "-m", "rc", "serve", "--data", str(tmp_path / "two"), "--listen",
             "127.0.0.1:0", "--socket", sock_path],
            env=env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode == 1
        assert (
            f"rc serve: --socket {sock_path}: another rc serve listens there (give this one "
            "--socket PATH)"
        ).encode() in res.stderr
    finally:
        ctl.kill9()  # leaves its socket behind
    assert os.path.exists(sock_path)
    again = Controller(tmp_path / "one", env, socket=sock_path).start()
    try:
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o666
    finally:
        again.stop()
    too_long = "/tmp/" + "s" * 120 + ".sock"
    res = subprocess.run(
        [PY, "-m", "rc", "serve", "--data", str(tmp_path / "three"), "--listen",
         "127.0.0.1:0", "--socket", too_long],
        env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert res.returncode == 1
    assert b"a Unix socket path is at most 107 bytes" in res.stderr, res.stderr


def test_signals_pass_between_a_users_own_jobs(onebox):
    """The isolation above is the kernel's, not a wall between jobs: a
    user's job may signal that same user's other job."""
    alice = onebox.alice
    jid = int(_out(alice.run("run", "--detach", "-d", f"{HOST}:cpu0", "--", "sleep", "300")))
    try:
        pid = _job_pid(jid)
        res = alice.run("run", "-d", f"{HOST}:cpu1", "--", "kill", "-TERM", str(pid))
        _out(res)
        wait_until(lambda: job(onebox.admin, jid)["state"] == "killed", 30, "the job to end")
        assert job(onebox.admin, jid)["exit_code"] == 128 + signal.SIGTERM
    finally:
        if job(onebox.admin, jid)["state"] == "running":
            onebox.admin.post(f"/v1/jobs/{jid}/kill")
