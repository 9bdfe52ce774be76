"""Test helpers: real processes on loopback (conditions are waited for with
tests/helpers/wait.py).

`Controller` runs `python -m rc serve` on port 0 with a fresh data dir; `Worker` runs the worker from the built zipapp under `python3 -I`;
`Cli.run(...)` runs `python -m rc ...` as a subprocess. Everything started is
stopped: terminate → wait(timeout) → kill.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rc.proto.client import Client
from rc.worker.cgroups import DEFAULT_ROOTS

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
BARE_PY = getattr(sys, "_base_executable", None) or sys.executable
"""The interpreter without this venv's site-packages, like a bare GPU host's python3."""


def stop_process(proc: subprocess.Popen, timeout: float = 15.0, sig: int = signal.SIGTERM) -> int:
    """Signal, wait up to `timeout`, then SIGKILL; close the pipes it was
    given (a test that failed mid-read must not leave them to the garbage
    collector, whose ResourceWarning would fail a later test). Returns the
    exit status."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return proc.returncode


def base_env(home: Path) -> dict[str, str]:
    """An environment isolated from the developer's: own HOME and config dirs,
    and its own default local socket (RC_SOCKET: a short path, as a Unix
    socket's must be, where an `rc up` run as root listens instead of
    /run/rc/rc.sock)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    tmp = home / "tmp"  # worker host locks and spools live here, not in a shared /tmp
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        {
            "TMPDIR": str(tmp),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
            "RC_SOCKET": short_socket_path(home),
        }
    )
    return env


def short_socket_path(where: Path) -> str:
    """A Unix socket path of its own for `where` (a test's directory), short
    enough for the kernel's 107-byte limit, in /tmp."""
    digest = hashlib.sha256(str(where).encode()).hexdigest()[:16]
    return f"/tmp/rc-test-{digest}.sock"


class Controller:
    """`rc serve` on 127.0.0.1:0 over `data`; `extra` are more serve flags.
    `socket`: the local socket's path ("": none, the default)."""

    def __init__(
        self,
        data: Path,
        env: dict[str, str],
        extra: list[str] | None = None,
        listen: str = "127.0.0.1:0",
        socket: str = "",
    ) -> None:
        self.data = data
        self.env = env
        self.extra = extra or []
        self.listen = listen
        self.socket = socket
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log_path = data.parent / f"{data.name}-serve.log"

    def start(self, timeout: float = 30.0) -> Controller:
        self.data.mkdir(parents=True, exist_ok=True)
        r, w = os.pipe()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    PY,
                    "-m",
                    "rc",
                    "serve",
                    "--listen",
                    self.listen,
                    "--data",
                    str(self.data),
                    "--ready-fd",
                    str(w),
                    "--socket",
                    self.socket,
                    *self.extra,
                ],
                env=self.env,
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=REPO,
            )
        os.close(w)
        buf = b""
        deadline = time.monotonic() + timeout
        os.set_blocking(r, False)
        try:
            while b"\n" not in buf:
                if self.proc.poll() is not None:
                    raise AssertionError(f"rc serve exited {self.proc.returncode}:\n{self.log()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"rc serve did not start:\n{self.log()}")
                try:
                    buf += os.read(r, 1024)
                except BlockingIOError:
                    time.sleep(0.02)
        finally:
            os.close(r)
        self.url = buf.decode().strip()
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def admin_token(self) -> str:
        return (self.data / "admin.token").read_text().strip()

    def client(self, token: str | None = None, timeout: float = 30.0) -> Client:
        return Client(self.url, token or self.admin_token, timeout=timeout)

    def token(self, name: str, role: str = "user") -> str:
        """Create a token and return its secret."""
        return self.client().post("/v1/tokens", {"name": name, "role": role})["secret"]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return stop_process(self.proc, sig=sig) if self.proc else 0

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Worker:
    """A worker process (from the zipapp under python3 -I by default).

    `shared_account` (the default here): every job runs as the worker's own
    user (root, in CI), whoever submitted it, as the tests' many identities
    (alice, bob, ...) have no Unix accounts of their own. The tests of
    identity itself (tests/e2e/test_identity_e2e.py) give False: jobs run as
    their real users."""

    def __init__(
        self,
        url: str,
        token: str,
        workdir: Path,
        env: dict[str, str],
        host: str = "testhost",
        devices: str = "cpu:2",
        extra: list[str] | None = None,
        pyz: Path | None = None,
        config: Path | None = None,
        launcher: list[str] | None = None,
        shared_account: bool = True,
    ) -> None:
        self.launcher = launcher or []  # e.g. ["nohup"]: what the worker is started under
        self.shared_account = shared_account
        self.url, self.token, self.workdir, self.env = url, token, workdir, dict(env)
        self.host, self.devices, self.extra, self.pyz = host, devices, extra or [], pyz
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"worker-{host}.log"

    def command(self) -> list[str]:
        token_file = self.workdir / f"worker-{self.host}.token"
        token_file.write_text(self.token)
        os.chmod(token_file, 0o600)
        base = [BARE_PY, "-I", str(self.pyz)] if self.pyz else [PY, "-m", "rc"]
        args = [
            "worker",
            "--controller",
            self.url,
            "--token-file",
            str(token_file),
            "--host",
            self.host,
        ]
        if self.devices:  # "" → the devices of the config file
            args += ["--devices", self.devices]
        if self.config:
            args += ["--config", str(self.config)]
        if self.shared_account:
            args.append("--shared-account")
        return self.launcher + base + args + self.extra

    def start(self) -> Worker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
            )
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        return stop_process(self.proc, timeout=timeout, sig=sig) if self.proc else 0

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def kill_jobs_left(self) -> None:
        """SIGKILL what this host's jobs left in its cgroups (rc-worker-HOST-*):
        a worker ended by kill9 ends none of them, and a test that does not
        start it again would leave them running (a hold's sleep, for ever)."""
        roots = [Path(r) for r in DEFAULT_ROOTS]
        for top in (t for r in roots for t in r.glob(f"rc-worker-{self.host}-*")):
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in procs.read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)


class Cli:
    """Runs `python -m rc ...` against one controller with one token."""

    def __init__(self, url: str, token: str, env: dict[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self.env["RC_CONTROLLER"] = url
        self.env["RC_TOKEN"] = token
        self.cwd = cwd

    def run(
        self, *args: str, timeout: float = 60.0, input: bytes | None = None, check: bool = False
    ) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [PY, "-m", "rc", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        if check and res.returncode != 0:
            raise AssertionError(
                f"rc {' '.join(args)} exited {res.returncode}:\n"
                f"{res.stderr.decode(errors='replace')}"
            )
        return res

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [PY, "-m", "rc", *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kw,
        )

    def json(self, *args: str, timeout: float = 60.0) -> Any:
        res = self.run(*args, "-o", "json", timeout=timeout, check=True)
        return json.loads(res.stdout)


def device_state(c: Client, device_id: str) -> str:
    for v in c.get("/v1/devices")["devices"]:
        if v["device"]["id"] == device_id:
            return v["device"]["state"]
    return ""


def job(c: Client, job_id: int) -> dict:
    return c.get(f"/v1/jobs/{job_id}")["job"]


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


# -- real Unix users (jobs run as the people who submit them) ----------------------

TEST_USERS = ("rc-test-alice", "rc-test-bob")
"""The Unix users the identity tests create (tests/conftest.py unix_users)."""
SYSTEM_PY = "/usr/bin/python3"
"""An interpreter every user may run (this venv's lives under /root, 0700)."""
RUNUSER = "/usr/sbin/runuser"
"""util-linux's runuser: run a command as another user (root only)."""
USERADD_WAIT_S = 60.0


def ensure_unix_user(name: str) -> None:
    """Create Unix user `name` (home under /home, shell /bin/sh) unless it
    exists. Idempotent, and patient with another useradd holding the
    password files' lock (several test runs share the machine)."""
    import pwd

    deadline = time.monotonic() + USERADD_WAIT_S
    while True:
        try:
            pwd.getpwnam(name)
            return
        except KeyError:
            pass
        done = subprocess.run(
            ["/usr/sbin/useradd", "--create-home", "--shell", "/bin/sh", name],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if done.returncode in (0, 9):  # 9: it exists (made meanwhile by another run)
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"useradd {name} failed: {done.stderr.decode(errors='replace')}")
        time.sleep(0.2)  # the password files are locked by another useradd: try again


class UserCli:
    """The CLI of the zipapp `pyz` (in a directory every user may read) run
    as Unix user `name` with `runuser`, from its home directory, with an
    environment of its own: its HOME, no RC_TOKEN, and `env` on top
    (RC_SOCKET, RC_CONTROLLER...)."""

    def __init__(self, name: str, pyz: Path, env: dict[str, str] | None = None) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name, self.uid, self.home = name, entry.pw_uid, entry.pw_dir
        self.pyz = pyz
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": entry.pw_dir,
            "LANG": "C.UTF-8",
            **(env or {}),
        }

    def command(self, *args: str) -> list[str]:
        return [RUNUSER, "-u", self.name, "--", SYSTEM_PY, "-I", str(self.pyz), *args]

    def run(
        self, *args: str, timeout: float = 60.0, input: bytes | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*args),
            env=self.env,
            cwd=cwd or self.home,
            capture_output=True,
            timeout=timeout,
            input=input,
            check=False,
        )

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(*args),
            env=self.env,
            cwd=kw.pop("cwd", self.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kw,
        )
