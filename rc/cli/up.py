"""`rc up` and `rc down`: the one-box deployment.

`rc up` runs the controller and a worker for this host's devices as child
processes of its own (`python -m rc serve` / `worker`, see rc.cli.children),
makes the tokens they need, and writes the client config so a plain `rc run`
works next. `rc up -d` leaves them in the background and records them in
the data directory's up.json, which `rc down` reads to stop them; once they
are stopped, up.json keeps their settings (--listen, --devices, --host) for
the next `rc up` there.
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rc.cli.children import (
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    alive_pid,
    spawn_ready,
    stop_pid,
    stop_process,
    supervise,
)
from rc.cli.context import UsageError, stderr, whole_seconds_arg
from rc.cli.credentials import ensure_client_config, ensure_token, worker_token_host, write_secret
from rc.cli.output import command_text, escape_controls, on_devices, one_line
from rc.cli.pool import say_out_of_pool
from rc.cli.serve import add_scheduling_options, check_hold_idle, have_controller
from rc.cli.upsettings import (
    defaults_for,
    differences,
    keep_settings,
    read_state,
    scheduling_given,
    serve_flags,
    shared_line,
)
from rc.proto import calls, pidlock
from rc.proto.client import Client
from rc.proto.errors import RcError
from rc.proto.model import DEVICES_PER_WORKER_MAX

__all__ = ["add_parsers", "default_data_dir"]

UP_STATE = "up.json"
UP_LISTEN = "127.0.0.1:8080"
WORKER_TOKEN_FILE = "worker.token"


def default_data_dir() -> Path:
    """$XDG_DATA_HOME/rc, else ~/.local/share/rc."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "rc"


UP_LOCK = "up.lock"
UP_LOCK_WAIT_S = 120.0
"""How long an rc up waits for another one on the same data dir to finish
starting (the second then finds it up: "already up")."""


def _one_up_at_a_time(data: Path) -> int:
    """Lock DATA/up.lock (rc.proto.pidlock), waiting up to UP_LOCK_WAIT_S
    while another rc up holds it; returns the lock's fd. Raises RcError when
    the wait runs out. Two `rc up -d` at the same instant: the second waits,
    then finds the first's controller and worker up."""
    path = str(data / UP_LOCK)
    deadline = time.monotonic() + UP_LOCK_WAIT_S
    said = False
    while True:
        try:
            return pidlock.take(path)
        except pidlock.LockBusy as e:
            if time.monotonic() > deadline:
                raise RcError(
                    f"another rc up (pid {e.pid or 'unknown'}) has been starting in {data} "
                    f"for over {UP_LOCK_WAIT_S:g} s; see {data / 'serve.log'}"
                ) from None
            if not said:
                stderr(f"another rc up (pid {e.pid or 'unknown'}) is starting in {data}; waiting")
                said = True
            time.sleep(0.1)


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "up",
        help="start a controller and a local worker (one-box deployment)",
        description="Start a controller and a worker for this host's devices. "
        "Writes the client config so the next rc run needs no flags.",
    )
    p.add_argument("-d", "--detach", action="store_true", help="run in the background")
    p.add_argument(
        "--data", default=None, metavar="DIR", help=f"data directory (default {default_data_dir()})"
    )
    p.add_argument(
        "--listen",
        default=None,  # given or not: a running rc up is compared only with what is given
        metavar="HOST:PORT",
        help=f"controller address (default {UP_LISTEN}; loopback unless --certfile or --insecure)",
    )
    p.add_argument(
        "--devices",
        default=None,  # auto, unless the running rc up has other
        metavar="auto|N",
        help="auto: the GPUs nvidia-smi lists, else 2 CPU devices; N: N CPU devices (1 to 1024)",
    )
    p.add_argument(
        "--host",
        default=None,
        metavar="NAME",
        help="the worker's host name (default: this machine's short name); a second "
        "rc up on one machine needs its own",
    )
    p.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="the controller's local socket, where local users get a token from the kernel "
        "(default: $RC_SOCKET or /run/rc/rc.sock as root, DATA/rc.sock otherwise; a second "
        "one-box run as root needs its own)",
    )
    p.add_argument("--certfile", default="", help="TLS certificate for the controller")
    p.add_argument("--keyfile", default="", help="TLS private key for the controller")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --listen without TLS"
    )
    add_scheduling_options(p, passed_on=True)  # handed to its rc serve as given
    p.set_defaults(handler="up:cmd_up")

    p = sub.add_parser(
        "down",
        help="stop what rc up -d started",
        description="Stop the controller and the worker that rc up -d started "
        "for this data directory.",
    )
    p.add_argument(
        "--data", default=None, metavar="DIR", help=f"data directory (default {default_data_dir()})"
    )
    p.set_defaults(handler="up:cmd_down")


def _is_loopback(listen: str) -> bool:
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _wait_settled(c, host: str, log_hint: str) -> list[dict]:
    """Wait until the controller has heard from this host's worker: every
    device of `host` is ready, busy or unhealthy (none `unknown`). Returns
    the devices (the `device` objects of GET /v1/devices)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        mine = [
            v["device"] for v in c.call(calls.DEVICES)["devices"] if v["device"]["host"] == host
        ]
        if mine and all(d["state"] != "unknown" for d in mine):
            return mine
        if time.monotonic() > deadline:
            waiting = ", ".join(d["id"] for d in mine if d["state"] == "unknown")
            raise RcError(
                f"the worker on {host} has not spoken to the controller within "
                f"{START_TIMEOUT_S:.0f}s"
                + (f" ({waiting} still unknown)" if waiting else " (it declared no device)")
                + f"; see {log_hint} and rc devices"
            )
        time.sleep(0.1)


def _default_host() -> str:
    """This machine's short host name, made a valid rc host name."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0] or "localhost")


def _valid_host(name: str) -> bool:
    """The controller's rule for host names: ASCII letters, digits, '.', '_',
    '-'; 1 to 63, starting with a letter or digit."""
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name))


@dataclass
class _Box:
    """One rc up as it goes: its data dir, up.json as the rc up before it left
    it (`st`), the settings it runs with, and what of it runs: the pids, the
    processes this rc up started (None: not started here) and the
    controller's URL. `down` is how to stop it, in words."""

    data: Path
    st: dict
    listen: str
    devices: str
    scheduling: dict[str, str]
    host: str
    socket: str | None
    serve_pid: int | None
    worker_pid: int | None
    down: str
    url: str = ""
    controller: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None


def cmd_up(args: argparse.Namespace) -> int:
    """rc up: check the flags, take the data dir's lock, then either say rc is
    already up, or start what of it is missing, record it in up.json, wait
    for its worker and say what runs. Returns 0, or in the foreground what
    supervise returns once rc stops. Raises UsageError for a bad flag and
    RcError when rc cannot come up."""
    data = Path(args.data) if args.data else default_data_dir()
    state_path = data / UP_STATE
    # a running rc up, or the settings of the last one
    listen = _checked_flags(args, read_state(state_path))
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Held until the state file names what runs (an exception before that ends
    # this process, and the kernel drops the lock with it).
    lock = _one_up_at_a_time(data)
    box = _settled_settings(args, data, listen)
    if box.serve_pid and box.worker_pid:
        # Not an error: `pip install . && rc up -d && rc run ...` can be re-run.
        _say_already_up(box, args)
        pidlock.release(lock, str(data / UP_LOCK))
        return 0
    if (box.serve_pid or box.worker_pid) and not args.detach:
        raise UsageError(
            "part of an earlier rc up -d still runs; rc up -d restarts what is "
            f"missing, or {box.down} stops it"
        )
    admin, points_here = _start_missing(box, args)
    # Both parts run and the worker has registered (or was already running):
    # rc is up. Record them before anything else can fail, so that rc down
    # and the next rc up find them.
    _record(box)
    pidlock.release(lock, str(data / UP_LOCK))
    mine = _wait_for_the_worker(box, args, admin)
    _say_up(box, args, mine, points_here)
    if args.detach:
        stderr(f"running in the background (logs in {data}); stop with: {box.down}")
        return 0
    stderr("press Ctrl-C to stop")
    return supervise(
        box.controller, box.worker, lambda: keep_settings(state_path, read_state(state_path))
    )


def _checked_flags(args: argparse.Namespace, st: dict) -> str:
    """Check rc up's flags before anything is started or written: the
    controller is installed, the hold idle timeouts agree, --listen (given,
    else the last rc up's, else UP_LISTEN) is HOST:PORT and loopback unless
    TLS or --insecure, --devices and --host are valid. `st` is up.json as
    read now. Returns the address to listen at; raises RcError or UsageError
    naming the problem."""
    if not have_controller():  # the zipapp
        raise RcError(
            "rc up needs rc installed with pip (pip install .), which brings the controller; "
            "the zipapp carries only the worker and the client"
        )
    check_hold_idle(
        whole_seconds_arg(args.hold_idle_timeout or "2h"),
        whole_seconds_arg(args.hold_idle_timeout_max or "0"),
        whole_seconds_arg(args.hold_idle_timeout_min or "0"),
    )
    listen = args.listen or st.get("listen") or UP_LISTEN
    host_port = listen.rpartition(":")
    port = host_port[2]
    if not host_port[1] or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise UsageError(f"--listen {listen!r}: use HOST:PORT, e.g. 127.0.0.1:8080")
    if not _is_loopback(listen) and not args.certfile and not args.insecure:
        raise UsageError(
            f"--listen {listen} is not a loopback address: give --certfile and "
            "--keyfile for TLS, or --insecure to serve plain HTTP on the network"
        )
    if args.devices is not None and not (
        args.devices == "auto"
        or (
            args.devices.isascii()
            and args.devices.isdigit()
            and 0 < int(args.devices) <= DEVICES_PER_WORKER_MAX
        )
    ):
        raise UsageError(
            f"--devices {args.devices!r}: use auto or a number of CPU devices, 1 to {DEVICES_PER_WORKER_MAX}"
        )
    if args.host is not None and not _valid_host(args.host):
        raise UsageError(
            f"--host {args.host!r}: letters, digits, '.', '_' and '-', at most 63, "
            "starting with a letter or digit"
        )
    return listen


def _settled_settings(args: argparse.Namespace, data: Path, listen: str) -> _Box:
    """This rc up's settings, read under the data dir's lock: up.json as the rc
    up before us left it, which of its processes still run, and each setting
    given now, else the last rc up's. Raises RcError when a part of rc
    already runs there with settings other than those given."""
    st = read_state(data / UP_STATE)  # as the rc up before us left it
    serve_pid = st.get("serve_pid") if alive_pid(st.get("serve_pid")) else None
    worker_pid = st.get("worker_pid") if alive_pid(st.get("worker_pid")) else None
    down = f"rc down{f' --data {data}' if args.data else ''}"
    if serve_pid or worker_pid:
        differ = differences(args, st, worker_pid is not None, serve_pid is not None)
        if differ:
            raise RcError(
                f"rc is already up in {data} with other settings: {'; '.join(differ)}. "
                f"To change them, `{down}` first; for a second one-box beside it, give it "
                "its own --data DIR, --listen and --host NAME"
            )
    # given now, else what the last rc up in this data dir was given
    return _Box(
        data=data,
        st=st,
        listen=listen,
        devices=args.devices or st.get("devices") or "auto",
        # the last rc up's options, each given one replacing its own (never the others)
        scheduling={
            **defaults_for(os.geteuid() == 0),  # a shared box's safe defaults
            **dict(st.get("scheduling") or {}),
            **scheduling_given(args),
        },
        host=args.host or st.get("host") or "",
        socket=args.socket if args.socket is not None else st.get("socket"),
        serve_pid=serve_pid,
        worker_pid=worker_pid,
        down=down,
    )


def _say_already_up(box: _Box, args: argparse.Namespace) -> None:
    """On stderr: rc already runs here, how to stop it, and each of its
    devices out of the pool. Best effort: it also makes sure the client
    config points here, and a failure of that or of the devices' read is one
    note, never an error."""
    host = box.host or _default_host()
    stderr(
        f"already up: controller at {box.st.get('url')} (pid {box.serve_pid}), worker pid "
        f"{box.worker_pid}; stop both with {box.down}"
    )
    try:  # best effort: a missing config or a device out of the pool would leave rc stuck
        url = box.st["url"]
        admin = Client(url, (box.data / "admin.token").read_text().strip(), timeout=5)
        points_here = ensure_client_config(admin, url)
        mine = [
            v["device"] for v in admin.call(calls.DEVICES)["devices"] if v["device"]["host"] == host
        ]
        say_out_of_pool(mine, host, box.data, args, url, points_here, False)
    except (RcError, OSError, KeyError, TypeError, ValueError) as e:
        stderr(f"note: could not check the client config and the devices: {e}")


def _start_missing(box: _Box, args: argparse.Namespace) -> tuple[Client, bool]:
    """Start the controller unless it runs, make the worker's token and the
    client config, then start the worker unless it runs (-d: both log to
    DATA/serve.log and DATA/worker.log). Returns the admin client and
    whether the client config points here. On any failure it stops what it
    started, then raises."""
    serve_log = open(box.data / "serve.log", "ab") if args.detach else None  # noqa: SIM115 - the children inherit it; rc up exits soon after
    worker_log = open(box.data / "worker.log", "ab") if args.detach else None  # noqa: SIM115
    try:
        if box.serve_pid:
            box.url = box.st["url"]
        else:
            _start_controller(box, args, serve_log)
        admin = Client(box.url, (box.data / "admin.token").read_text().strip())
        token_file = box.data / WORKER_TOKEN_FILE
        bound = worker_token_host(box.url, token_file)
        # the data dir's worker token remembers the host name it was made for
        box.host = box.host or bound or _default_host()
        if bound is None or bound not in ("", box.host):
            write_secret(token_file, ensure_token(admin, f"worker-{box.host}", "worker"))
        points_here = ensure_client_config(admin, box.url)
        if not box.worker_pid:
            _start_worker(box, args, worker_log, token_file)
    except BaseException:
        for proc in (box.worker, box.controller):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
        raise
    return admin, points_here


def _start_controller(box: _Box, args: argparse.Namespace, log) -> None:
    """Start rc serve (`log`: the file it writes to with -d, else None) and
    wait until it listens; sets box.controller, .url and .serve_pid. A worker
    still running keeps dialling the address it was given, so the controller
    listens there again. Raises RcError when it does not start."""
    if box.worker_pid and box.st.get("url"):  # the running worker keeps dialling this address
        box.listen = box.st["url"].rpartition("//")[2]
    cmd = [sys.executable, "-m", "rc", "serve", "--listen", box.listen, "--data", str(box.data)]
    if box.socket is not None:
        cmd += ["--socket", box.socket]
    if args.certfile:
        cmd += ["--certfile", args.certfile, "--keyfile", args.keyfile]
    cmd += serve_flags(box.scheduling)
    box.controller, box.url = spawn_ready(
        cmd, log, args.detach, "controller", box.data / "serve.log"
    )
    box.serve_pid = box.controller.pid


def _start_worker(box: _Box, args: argparse.Namespace, log, token_file: Path) -> None:
    """Start rc worker for this host's devices with the token in `token_file`
    (`log`: the file it writes to with -d, else None) and wait until it is
    ready; sets box.worker and .worker_pid. Raises RcError when it does not
    start."""
    cmd = [
        sys.executable,
        "-m",
        "rc",
        "worker",
        "--controller",
        box.url,
        "--token-file",
        str(token_file),
        "--devices",
        "auto" if box.devices == "auto" else f"cpu:{box.devices}",
        "--host",
        box.host,
    ]
    if os.geteuid() == 0:
        # root's own jobs on its own box run; everyone else's run as them
        cmd.append("--allow-root-jobs")
    box.worker, _ = spawn_ready(cmd, log, args.detach, "worker", box.data / "worker.log")
    box.worker_pid = box.worker.pid


def _record(box: _Box) -> None:
    """Write up.json: the URL, the pids and the settings rc now runs with (the
    scheduling options of the controller that runs: the last rc up's unless
    this one started it)."""
    st = box.st
    (box.data / UP_STATE).write_text(
        json.dumps(
            {
                "url": box.url,
                "serve_pid": box.serve_pid,
                "worker_pid": box.worker_pid,
                "data": str(box.data),
                "listen": st.get("listen", box.listen) if st.get("url") == box.url else box.listen,
                "devices": box.devices,
                "host": box.host,
                "socket": box.socket,
                "scheduling": box.scheduling
                if box.controller is not None
                else st.get("scheduling", {}),
            }
        )
    )


def _wait_for_the_worker(box: _Box, args: argparse.Namespace, admin: Client) -> list[dict]:
    """Wait until the controller has heard from this host's worker
    (_wait_settled) and return its devices. If that fails, a foreground rc
    up stops the processes it started and keeps only the settings in
    up.json; then it raises."""
    state_path = box.data / UP_STATE
    try:
        return _wait_settled(
            admin, box.host, str(box.data / "worker.log") if args.detach else "the messages above"
        )
    except BaseException:
        if not args.detach:  # the foreground rc up owns its children (it started both)
            for proc, what in ((box.worker, "worker"), (box.controller, "controller")):
                if proc is not None:
                    stop_process(proc, what)
            keep_settings(state_path, read_state(state_path))
        raise


def _say_up(box: _Box, args: argparse.Namespace, mine: list[dict], points_here: bool) -> None:
    """On stderr: rc is up (its URL, the worker's devices `mine`, the admin
    token's file), whose box it is, and each device out of the pool."""
    stderr(
        f"up: controller at {box.url}, worker on {box.host} with "
        f"{', '.join(d['id'] for d in mine)}; the admin token is in {box.data / 'admin.token'}"
    )
    stderr(_whose_box(box.data))
    stderr(
        shared_line(box.scheduling if box.controller is not None else box.st.get("scheduling", {}))
    )
    say_out_of_pool(mine, box.host, box.data, args, box.url, points_here, not args.detach)


def _whose_box(data: Path) -> str:
    """Who may use this one-box, in words: as root, every local user (each
    job runs as its submitter), through the controller's socket; otherwise
    only the user running it (a single-user box)."""
    try:
        sock = json.loads((data / "controller.json").read_text()).get("socket") or ""
    except (OSError, ValueError):
        sock = ""
    if os.geteuid() == 0:
        via = f" (their rc finds the socket {sock})" if sock else ""
        return (
            "a shared box: every local user may run rc here with no token, and each "
            f"one's jobs run as that user{via}; root's run as root"
        )
    return (
        f"a single-user box: jobs run as {getpass.getuser()} only, and other users' jobs "
        "are refused (sudo rc up -d makes a box every local user can use)"
    )


def _say_what_stops(st: dict, data: Path) -> None:
    """Before `rc down` stops the worker: name the jobs and holds running on
    it, which end `killed` ("the worker is shutting down"). Best effort: a
    controller that does not answer within 5 s is not asked again."""
    try:
        admin = Client(st["url"], (data / "admin.token").read_text().strip(), timeout=5)
        active = admin.call(calls.STATE)["jobs"]
    except (RcError, OSError, KeyError, TypeError, ValueError):
        return
    host = st.get("host") or _default_host()
    running = [
        j
        for j in active
        if j.get("state") == "running" and j.get("device_id", "").rpartition(":")[0] == host
    ]
    if not running:
        return
    holds = sum(j.get("kind") == "hold" for j in running)
    parts = [
        f"{n} {word}{'' if n == 1 else 's'}"
        for n, word in ((len(running) - holds, "running job"), (holds, "hold"))
        if n
    ]
    stderr(f"stopping the worker ends {' and '.join(parts)}:")
    for j in sorted(running, key=lambda j: j["id"]):
        what = (
            f"hold {j['id']}: {j.get('reason', '')}"
            if j.get("kind") == "hold"
            else f"job {j['id']}: {command_text(j.get('command') or [])}"
        )
        line = f"  {what} ({j.get('submitter', '?')} on {on_devices(j) or '?'})"
        stderr(escape_controls(one_line(line)))


def cmd_down(args: argparse.Namespace) -> int:
    data = Path(args.data) if args.data else default_data_dir()
    state_path = data / UP_STATE
    if not state_path.exists():
        # already down: not an error, as a repeated rc up -d is not one
        stderr(f"already down: nothing to stop (no {UP_STATE} in {data})")
        return 0
    st = read_state(state_path)
    if not st:
        raise RcError(f"{state_path} is corrupt; stop the processes by hand")
    if not st.get("serve_pid") and not st.get("worker_pid"):  # only the last one's settings
        stderr(f"already down: nothing to stop (rc up -d is not running in {data})")
        return 0
    if alive_pid(st.get("worker_pid")):
        _say_what_stops(st, data)
    stopped = []
    for key, what in (("worker_pid", "worker"), ("serve_pid", "controller")):
        pid = st.get(key)
        if alive_pid(pid):
            stop_pid(pid, what)
            stopped.append(f"the {what} (pid {pid})")
    keep_settings(state_path, st)
    if not stopped:
        stderr("nothing was running (the processes of the last rc up -d had already exited)")
        return 0
    stderr(f"stopped {' and '.join(stopped)}" + (f" of {st['url']}" if st.get("url") else ""))
    return 0
