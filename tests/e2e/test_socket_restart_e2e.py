"""Attached clients ride out a controller restart (kill -9 or SIGTERM, then
`rc serve` again on the same data dir, port and socket), with real
processes: a worker running jobs as their real Unix users, and the CLI of
the zipapp run as the test user rc-test-alice with no token, so that its
identity comes from the controller's local socket. A socket token lives in
the controller's memory only, so the restarted controller refuses it (401)
and the client must ask the socket again, however often it takes; a
client with a config file's token is checked beside it. `rc run` (queued
and running), `rc logs -f`, `rc run --array`, a foreground `rc hold` and
`rc ps -w` keep going and end as they would have without the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.cli.config import write_config
from rc.proto.client import Client
from tests.helpers.harness import Cli, Controller, UserCli, Worker, device_state, job
from tests.helpers.wait import wait_until

ALICE = "rc-test-alice"
HOST = "sockbox"
FLAGS = ["--heartbeat-interval", "1s", "--sweep-interval", "0.5s", "--startup-grace", "20s"]
"""A worker heartbeating every second, and a startup grace long enough that a
restarted controller expires no running job's lease while its worker comes back."""
EXPECTED = b"".join(b"line-%d\n" % i for i in range(1, 21))


class Tail:
    """Everything a process writes on one pipe, read as it comes by a thread."""

    def __init__(self, pipe) -> None:
        self.data = bytearray()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        while chunk := pipe.read1(65536):
            self.data += chunk

    def has(self, text: bytes) -> bool:
        return text in self.data

    def all(self, timeout: float = 10.0) -> bytes:
        """Everything, once the pipe closed."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the pipe is still open"
        return bytes(self.data)


@dataclass
class Attached:
    """A CLI process with its stdout and stderr read as they come."""

    proc: subprocess.Popen
    out: Tail
    err: Tail

    @classmethod
    def start(cls, cli, *args: str) -> Attached:
        proc = cli.popen(*args, stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(proc, Tail(proc.stdout), Tail(proc.stderr))

    def end(self, timeout: float = 90.0) -> tuple[int, bytes, bytes]:
        try:
            code = self.proc.wait(timeout)
            return code, self.out.all(), self.err.all()
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


@dataclass
class Box:
    """A controller with a local socket, a root worker running each job as
    its own user, alice on the socket, and root with a config file whose
    token runs its jobs as alice too."""

    ctl: Controller
    worker: Worker
    socket: str
    gates: Path  # a directory every user may write: the jobs' start and go files
    alice: UserCli
    config: Cli
    laptop: str = ""  # the config file's token (its jobs run as alice)

    @property
    def admin(self) -> Client:
        return Client(self.ctl.url, self.ctl.admin_token, timeout=30)

    def cli(self, who: str):
        return self.alice if who == "socket" else self.config

    def cached_token(self) -> str:
        """The socket token alice's rc processes share (their cache file)."""
        for p in Path(f"/tmp/rc-{self.alice.uid}").glob("socket-*.json"):
            got = json.loads(p.read_text())
            if got.get("socket") == self.socket:
                return got["token"]
        return ""

    def restart(self, how: str, asked: Callable[[list[str]], bool] | None = None) -> None:
        """Stop the controller (kill -9, or SIGTERM and its clean exit), then
        hang up on every request to its address until the paths asked for
        so far satisfy `asked` (default: any request but a worker's), so
        that the clients under test surely met the outage, and start it
        again on the same data dir, address and socket."""
        if how == "kill9":
            self.ctl.kill9()
        else:
            assert self.ctl.stop() == 0, self.ctl.log()
        old = self.ctl
        address = old.url.removeprefix("http://")
        hang_up_until(address, asked or (lambda paths: any(_client_path(p) for p in paths)))
        self.ctl = Controller(old.data, old.env, FLAGS, listen=address, socket=self.socket).start()


def _client_path(path: str) -> bool:
    return not path.startswith("/v1/workers/")


def hang_up_until(address: str, asked: Callable[[list[str]], bool], timeout: float = 30) -> None:
    """Listen at `address` (HOST:PORT) in place of the controller: read
    each request's first line and close the connection without an answer,
    until the request paths so far satisfy `asked`. Fails after `timeout` s
    naming the paths it saw."""
    host, _, port = address.rpartition(":")
    paths: list[str] = []
    deadline = time.monotonic() + timeout
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(16)
        while not asked(paths):
            left = deadline - time.monotonic()
            assert left > 0, f"the clients never asked the stopped controller (saw {paths})"
            listener.settimeout(left)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                head = b""
                with contextlib.suppress(OSError):
                    while b"\r\n" not in head and len(head) < 8192:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) >= 2:
                paths.append(parts[1].decode(errors="replace").partition("?")[0])


@pytest.fixture
def box(unix_users, public_pyz, pyz, tmp_path, env) -> Iterator[Box]:
    where = Path(tempfile.mkdtemp(prefix="rc-restart-", dir="/tmp"))
    where.chmod(0o755)
    gates = where / "gates"
    gates.mkdir()
    gates.chmod(0o777)
    sock = str(where / "rc.sock")
    ctl = Controller(tmp_path / "data", env, FLAGS, socket=sock).start()
    worker = Worker(
        ctl.url,
        ctl.token("w", "worker"),
        tmp_path / "w",
        env,
        host=HOST,
        devices="cpu:2",
        pyz=pyz,
        shared_account=False,
    )
    config = Cli(ctl.url, "", env, gates)
    for name in ("RC_CONTROLLER", "RC_TOKEN"):
        config.env.pop(name)
    b = Box(ctl, worker, sock, gates, UserCli(ALICE, public_pyz, {"RC_SOCKET": sock}), config)
    try:
        worker.start()
        wait_until(
            lambda: [device_state(b.admin, f"{HOST}:cpu{i}") for i in (0, 1)] == ["ready"] * 2,
            30,
            "the worker's devices",
        )
        laptop = {"name": "laptop", "role": "user", "unix_user": ALICE}
        b.laptop = b.admin.post("/v1/tokens", laptop)["secret"]
        write_config(Path(env["XDG_CONFIG_HOME"]) / "rc" / "config.toml", ctl.url, b.laptop)
        yield b
    finally:
        worker.stop()
        b.ctl.stop()  # the one running now: a restart replaced `ctl`
        shutil.rmtree(where, ignore_errors=True)


def _script(box: Box) -> str:
    """Ten lines, then (once `half` exists) a wait for `go`, ten more, exit 3."""
    half, go, runs = box.gates / "half", box.gates / "go", box.gates / "runs"
    return (
        f"echo run >> {runs}; for i in $(seq 1 10); do echo line-$i; done; touch {half}; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        "for i in $(seq 11 20); do echo line-$i; sleep 0.05; done; exit 3"
    )


def _clean(err: bytes) -> None:
    assert b"unauthorized" not in err and b"Traceback" not in err, err.decode(errors="replace")


@pytest.mark.parametrize(
    ("who", "how"),
    [("socket", "kill9"), ("socket", "sigterm"), ("config", "kill9")],
    ids=["socket-kill9", "socket-sigterm", "config-file-token-kill9"],
)
def test_an_attached_run_and_logs_f_ride_out_a_restart_and_end_with_the_jobs_code(box, who, how):
    cli = box.cli(who)
    run = Attached.start(cli, "run", "--", "sh", "-c", _script(box))
    wait_until(lambda: run.out.has(b"line-10\n"), 60, "the job's first half at rc run")
    [job_id] = [j["id"] for j in box.admin.get("/v1/state")["jobs"]]
    logs = Attached.start(cli, "logs", "-f", str(job_id))
    wait_until(lambda: logs.out.has(b"line-10\n"), 30, "the first half at rc logs -f")
    before = box.cached_token()
    box.restart(how, lambda paths: paths.count(f"/v1/jobs/{job_id}/logs") >= 2)
    (box.gates / "go").touch()
    for attached in (run, logs):
        code, out, err = attached.end()
        _clean(err)
        assert (code, out) == (3, EXPECTED), err.decode(errors="replace")
    assert job(box.admin, job_id)["state"] == "failed"
    assert (box.gates / "runs").read_text() == "run\n"  # ran once
    if who == "socket":  # the first controller's token was refused, and replaced
        assert box.cached_token() not in ("", before)


def test_a_queued_socket_run_still_attaches_when_it_starts_after_a_restart(box):
    admin = box.admin
    blocker = Client(box.ctl.url, box.laptop).post(
        "/v1/jobs",
        {"kind": "hold", "device_id": f"{HOST}:cpu0", "reason": "b", "max_runtime_seconds": 600},
    )["job"]["id"]
    wait_until(lambda: job(admin, blocker)["state"] == "running", 30, "the blocking hold")
    run = Attached.start(
        box.alice, "run", "-d", f"{HOST}:cpu0", "--", "sh", "-c", "echo hi; exit 5"
    )
    wait_until(lambda: run.err.has(b"queued at position 1 "), 30, "rc run to wait in the queue")
    [job_id] = [j["id"] for j in box.admin.get("/v1/state")["queued"]]
    box.restart("kill9", lambda paths: f"/v1/jobs/{job_id}" in paths)
    admin = box.admin
    admin.post(f"/v1/jobs/{blocker}/kill", {"reason": "make room"})
    code, out, err = run.end()
    _clean(err)
    assert (code, out) == (5, b"hi\n"), err.decode(errors="replace")
    assert b"on sockbox:cpu0" in err


@pytest.mark.parametrize("who", ["socket", "config"], ids=["socket", "config-file-token"])
def test_an_attached_array_rides_out_a_restart(box, who):
    go = box.gates / "go"
    script = f'while [ ! -e {go} ]; do sleep 0.05; done; [ "$RC_ARRAY_INDEX" != 2 ]'
    arr = Attached.start(box.cli(who), "run", "--array", "0-3", "--", "sh", "-c", script)
    wait_until(lambda: arr.err.has(b": 0/4 done, 2 running, 2 queued"), 60, "two elements running")
    box.restart("kill9", lambda paths: any(p.startswith("/v1/arrays/") for p in paths))
    go.touch()
    code, out, err = arr.end()
    _clean(err)
    array_id = int(out)
    assert code == 1, err.decode(errors="replace")
    assert err.endswith(
        f"rc: array {array_id}: 4/4 done, 0 running, 0 queued, 1 failed\n"
        f"rc: array {array_id}: 1 did not succeed (indices 2); rc rerun --failed {array_id} "
        "runs them again\n".encode()
    ), err.decode(errors="replace")


def test_a_foreground_hold_stays_held_across_a_restart_and_is_released_normally(box):
    hold = Attached.start(
        box.alice, "hold", "-d", f"{HOST}:cpu1", "--ttl", "10m", "--reason", "debugging"
    )
    wait_until(lambda: hold.out.has(b" granted on sockbox:cpu1 "), 30, "the hold to be granted")
    hold_id = int(bytes(hold.out.data).split()[1])
    before = box.cached_token()
    box.restart("sigterm", lambda paths: f"/v1/jobs/{hold_id}" in paths)
    wait_until(lambda: box.cached_token() not in ("", before), 30, "rc hold to renew its token")
    assert hold.proc.poll() is None, hold.err.all()
    assert job(box.admin, hold_id)["state"] == "running"
    res = box.alice.run("release", str(hold_id))
    assert (res.returncode, res.stdout) == (0, f"released {hold_id}\n".encode()), res.stderr
    code, _out, err = hold.end()
    _clean(err)
    assert code == 0, err.decode(errors="replace")
    assert f"rc: hold {hold_id} ended: released".encode() in err, err


def test_ps_w_rides_out_a_restart(box):
    watch = Attached.start(box.alice, "ps", "-w")
    wait_until(lambda: watch.out.has(b"JOB"), 30, "the first listing")
    box.restart("kill9", lambda paths: "/v1/state" in paths)
    res = box.alice.run("run", "--detach", "-d", f"{HOST}:cpu1", "--", "sleep", "300")
    assert res.returncode == 0, res.stderr
    job_id = int(res.stdout)
    wait_until(lambda: watch.out.has(f"\n{job_id}  ".encode()), 30, "the new job in the listing")
    assert watch.proc.poll() is None
    os.killpg(watch.proc.pid, signal.SIGINT)
    _code, _out, err = watch.end(30)
    _clean(err)
    assert b"rc: cannot reach the controller (" in err, err
    assert err.endswith(b"; still trying\nrc: the controller answers again\n"), err
    box.admin.post(f"/v1/jobs/{job_id}/kill")
