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
from rc.cli.serve import (
    SCHEDULING_OPTIONS,
    add_scheduling_options,
    check_hold_idle,
    have_controller,
    scheduling_value,
)
from rc.proto import pidlock
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
        mine = [v["device"] for v in c.get("/v1/devices")["devices"] if v["device"]["host"] == host]
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


REBOOT_CLEARABLE = ("registration", "worker_lost", "lease_expired")


def _out_of_pool(d: dict, as_admin: str, restart: str) -> str | None:
    """One line on a device that takes no job now and how it comes back, or
    None for a device in the pool. `as_admin` is the environment to put in
    front of an admin command ("RC_TOKEN=$(cat .../admin.token) "), `restart`
    says how to restart rc.

    A device quarantined for a reboot-clearable reason returns when a worker
    registers with a recovery proof (the controller's rule; a fresh worker
    scans /proc for processes of interrupted jobs), or by rc clear."""
    dev = d["id"]
    clear = f"{as_admin}rc clear {dev}"
    if d["state"] == "unhealthy":
        reason = d.get("quarantine_reason") or ""
        detail = d.get("quarantine_detail") or ""
        why = f"{reason or 'quarantined'}: {detail}" if detail else (reason or "quarantined")
        if reason in REBOOT_CLEARABLE:
            how = (
                "a process of the interrupted job may still be running. Once it has ended, "
                f"`{clear}` returns the device, and so does a restart ({restart}: the new "
                "worker finds nothing of the job left)"
            )
        else:
            how = f"once you have seen to it, `{clear}` returns the device"
        return f"{dev} is out of the pool ({why}): {how}"
    if d.get("draining"):
        reason = d.get("drain_reason") or ""
        return (
            f"{dev} is draining{f' ({reason})' if reason else ''}: it takes no new job "
            f"until `{as_admin}rc undrain {dev}`"
        )
    return None


def _say_out_of_pool(
    mine: list[dict],
    host: str,
    data: Path,
    args: argparse.Namespace,
    url: str,
    points_here: bool,
    foreground: bool,
) -> None:
    """Name on stderr each of `mine` (this host's devices) that takes no job
    now, why, and how it returns. `foreground`: this process runs rc (so
    Ctrl-C stops it, not rc down)."""
    as_admin = f"RC_TOKEN=$(cat {data / 'admin.token'}) "
    if not points_here:  # rc would ask another controller
        as_admin += f"RC_CONTROLLER={url} "
    if foreground:
        restart = "Ctrl-C, then `rc up` as before"
    else:
        restart = f"`rc down{f' --data {data}' if args.data else ''}`, then `rc up -d` as before"
    notes = [line for line in (_out_of_pool(d, as_admin, restart) for d in mine) if line]
    for line in notes:
        stderr(line)
    if notes and len(notes) == len(mine):
        stderr(f"no device of {host} takes jobs now: rc run waits in the queue until one returns")


SETTINGS = ("listen", "devices", "host", "socket", "scheduling")
"""What up.json keeps of an rc up once its processes are stopped, for the next
one in that data dir (unless given again)."""


def _keep_settings(path: Path, st: dict) -> None:
    """Leave in up.json (`path`) only the settings of the stopped rc up `st`
    (SETTINGS), no process: the next `rc up` there starts with them, and
    `rc down` finds nothing to stop. Removes the file when there are none."""
    kept = {k: st[k] for k in SETTINGS if st.get(k)}
    if kept:
        path.write_text(json.dumps(kept))
    else:
        path.unlink(missing_ok=True)


def _read_state(path: Path) -> dict:
    try:
        st = json.loads(path.read_text())
        return st if isinstance(st, dict) else {}
    except (OSError, ValueError):
        return {}


def _default_host() -> str:
    """This machine's short host name, made a valid rc host name."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0] or "localhost")


def _valid_host(name: str) -> bool:
    """The controller's rule for host names: ASCII letters, digits, '.', '_',
    '-'; 1 to 63, starting with a letter or digit."""
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name))


def _same_address(listen: str, st: dict) -> bool:
    """Whether `--listen listen` names the controller recorded in up.json
    (as given then, or as it listens now; port 0 matches any port)."""
    if listen == st.get("listen"):
        return True
    at = str(st.get("url", "")).rpartition("//")[2]
    if listen == at:
        return True
    host, _, port = listen.rpartition(":")
    return port == "0" and host == at.rpartition(":")[0]


def _differences(
    args: argparse.Namespace, st: dict, worker_runs: bool, serve_runs: bool = False
) -> list[str]:
    """The flags given to this rc up that the running one (up.json `st`)
    does not have and cannot take while it runs: --listen while any part
    runs, --devices and --host while its worker runs, the scheduling
    options while its controller runs."""
    out = []
    if args.listen is not None and st.get("url") and not _same_address(args.listen, st):
        out.append(f"--listen {args.listen} (it listens at {st['url']})")
    if serve_runs:
        running = st.get("scheduling") or {}
        for dest, text in _scheduling(args).items():
            if dest in running and _same_value(dest, running[dest], text):
                continue
            if running.get(dest) != text:
                flag = "--" + dest.replace("_", "-")
                now = f"{flag} {running[dest]}" if dest in running else "its default"
                out.append(f"{flag} {text} (its controller runs with {now})")
    if worker_runs:
        if args.devices is not None and args.devices != st.get("devices", args.devices):
            out.append(f"--devices {args.devices} (it runs with --devices {st['devices']})")
        if args.host is not None and args.host != st.get("host", args.host):
            out.append(f"--host {args.host} (its worker is host {st['host']})")
    return out


def _same_value(dest: str, a: str, b: str) -> bool:
    """Whether two texts of scheduling option `dest` give one value ("5m" is
    "300s"); a text the option does not take (an older up.json) is no match."""
    try:
        return scheduling_value(dest, a) == scheduling_value(dest, b)
    except argparse.ArgumentTypeError:
        return False


def _scheduling(args: argparse.Namespace) -> dict[str, str]:
    """The scheduling options given to this rc up (dest → the text given)."""
    return {d: getattr(args, d) for d in SCHEDULING_OPTIONS if getattr(args, d) is not None}


def _serve_flags(scheduling: dict[str, str]) -> list[str]:
    """rc serve's flags for these scheduling options (dest → text)."""
    out = []
    for dest in SCHEDULING_OPTIONS:
        if dest in scheduling:
            out += ["--" + dest.replace("_", "-"), scheduling[dest]]
    return out


def cmd_up(args: argparse.Namespace) -> int:
    if not have_controller():  # the zipapp
        raise RcError(
            "rc up needs rc installed with pip (pip install .), which brings the controller; "
            "the zipapp carries only the worker and the client"
        )
    check_hold_idle(
        whole_seconds_arg(args.hold_idle_timeout or "2h"),
        whole_seconds_arg(args.hold_idle_timeout_max or "0"),
    )
    data = Path(args.data) if args.data else default_data_dir()
    state_path = data / UP_STATE
    st = _read_state(state_path)  # a running rc up, or the settings of the last one
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
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Held until the state file names what runs (an exception before that ends
    # this process, and the kernel drops the lock with it).
    lock = _one_up_at_a_time(data)
    st = _read_state(state_path)  # as the rc up before us left it
    serve_pid = st.get("serve_pid") if alive_pid(st.get("serve_pid")) else None
    worker_pid = st.get("worker_pid") if alive_pid(st.get("worker_pid")) else None
    down = f"rc down{f' --data {data}' if args.data else ''}"
    if serve_pid or worker_pid:
        differ = _differences(args, st, worker_pid is not None, serve_pid is not None)
        if differ:
            raise RcError(
                f"rc is already up in {data} with other settings: {'; '.join(differ)}. "
                f"To change them, `{down}` first; for a second one-box beside it, give it "
                "its own --data DIR, --listen and --host NAME"
            )
    devices = args.devices or st.get("devices") or "auto"
    # given now, else what the last rc up in this data dir was given
    # the last rc up's options, each given one replacing its own (never the others)
    scheduling = {**dict(st.get("scheduling") or {}), **_scheduling(args)}
    host = args.host or st.get("host") or ""
    sock_path = args.socket if args.socket is not None else st.get("socket")
    if serve_pid and worker_pid:
        # Not an error: `pip install . && rc up -d && rc run ...` can be re-run.
        host = host or _default_host()
        stderr(
            f"already up: controller at {st.get('url')} (pid {serve_pid}), worker pid "
            f"{worker_pid}; stop both with {down}"
        )
        try:  # best effort: a missing config or a device out of the pool would leave rc stuck
            url = st["url"]
            admin = Client(url, (data / "admin.token").read_text().strip(), timeout=5)
            points_here = ensure_client_config(admin, url)
            mine = [
                v["device"]
                for v in admin.get("/v1/devices")["devices"]
                if v["device"]["host"] == host
            ]
            _say_out_of_pool(mine, host, data, args, url, points_here, False)
        except (RcError, OSError, KeyError, TypeError, ValueError) as e:
            stderr(f"note: could not check the client config and the devices: {e}")
        pidlock.release(lock, str(data / UP_LOCK))
        return 0
    if (serve_pid or worker_pid) and not args.detach:
        raise UsageError(
            "part of an earlier rc up -d still runs; rc up -d restarts what is "
            f"missing, or {down} stops it"
        )
    serve_log_path, worker_log_path = data / "serve.log", data / "worker.log"
    serve_log = open(serve_log_path, "ab") if args.detach else None  # noqa: SIM115 - the children inherit it; rc up exits soon after
    worker_log = open(worker_log_path, "ab") if args.detach else None  # noqa: SIM115
    controller = worker = None
    try:
        if serve_pid:
            url = st["url"]
        else:
            if worker_pid and st.get("url"):  # the running worker keeps dialling this address
                listen = st["url"].rpartition("//")[2]
            cmd = [sys.executable, "-m", "rc", "serve", "--listen", listen, "--data", str(data)]
            if sock_path is not None:
                cmd += ["--socket", sock_path]
            if args.certfile:
                cmd += ["--certfile", args.certfile, "--keyfile", args.keyfile]
            cmd += _serve_flags(scheduling)
            controller, url = spawn_ready(cmd, serve_log, args.detach, "controller", serve_log_path)
            serve_pid = controller.pid
        admin = Client(url, (data / "admin.token").read_text().strip())
        token_file = data / WORKER_TOKEN_FILE
        bound = worker_token_host(url, token_file)
        # the data dir's worker token remembers the host name it was made for
        host = host or bound or _default_host()
        if bound is None or bound not in ("", host):
            write_secret(token_file, ensure_token(admin, f"worker-{host}", "worker"))
        points_here = ensure_client_config(admin, url)
        if not worker_pid:
            cmd = [
                sys.executable,
                "-m",
                "rc",
                "worker",
                "--controller",
                url,
                "--token-file",
                str(token_file),
                "--devices",
                "auto" if devices == "auto" else f"cpu:{devices}",
                "--host",
                host,
            ]
            if os.geteuid() == 0:
                # root's own jobs on its own box run; everyone else's run as them
                cmd.append("--allow-root-jobs")
            worker, _ = spawn_ready(cmd, worker_log, args.detach, "worker", worker_log_path)
            worker_pid = worker.pid
    except BaseException:
        for proc in (worker, controller):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
        raise
    # Both parts run and the worker has registered (or was already running):
    # rc is up. Record them before anything else can fail, so that rc down
    # and the next rc up find them.
    state_path.write_text(
        json.dumps(
            {
                "url": url,
                "serve_pid": serve_pid,
                "worker_pid": worker_pid,
                "data": str(data),
                "listen": st.get("listen", listen) if st.get("url") == url else listen,
                "devices": devices,
                "host": host,
                "socket": sock_path,
                "scheduling": scheduling if controller is not None else st.get("scheduling", {}),
            }
        )
    )
    pidlock.release(lock, str(data / UP_LOCK))
    try:
        mine = _wait_settled(
            admin, host, str(worker_log_path) if args.detach else "the messages above"
        )
    except BaseException:
        if not args.detach:  # the foreground rc up owns its children (it started both)
            for proc, what in ((worker, "worker"), (controller, "controller")):
                if proc is not None:
                    stop_process(proc, what)
            _keep_settings(state_path, _read_state(state_path))
        raise
    stderr(
        f"up: controller at {url}, worker on {host} with {', '.join(d['id'] for d in mine)}; "
        f"the admin token is in {data / 'admin.token'}"
    )
    stderr(_whose_box(data))
    _say_out_of_pool(mine, host, data, args, url, points_here, not args.detach)
    if args.detach:
        stderr(f"running in the background (logs in {data}); stop with: {down}")
        return 0
    stderr("press Ctrl-C to stop")
    return supervise(
        controller, worker, lambda: _keep_settings(state_path, _read_state(state_path))
    )


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
        active = admin.get("/v1/state")["jobs"]
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
    st = _read_state(state_path)
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
    _keep_settings(state_path, st)
    if not stopped:
        stderr("nothing was running (the processes of the last rc up -d had already exited)")
        return 0
    stderr(f"stopped {' and '.join(stopped)}" + (f" of {st['url']}" if st.get("url") else ""))
    return 0
