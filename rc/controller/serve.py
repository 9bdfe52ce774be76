"""`rc serve`: run the controller under Hypercorn, started programmatically.

We bind the listening socket ourselves (so "address already in use" is a
clear one-line error, and port 0 reports the port it got), then hand it to
Hypercorn. Before the database is opened it takes DATA/serve.lock (an
exclusive flock held for the life of the process, the holder's pid inside),
so a second rc serve on the same data dir is refused. With a --socket it
also listens on that Unix socket (rc.controller.localsocket). Once listening, the controller writes DATA/controller.json
({url, pid, instance, socket}) for `rc up`, `rc down` and tests, and prints the URL.
SIGINT/SIGTERM stop it gracefully: HTTP first (5 s for in-flight requests),
then the loops, then the database.

On PostgreSQL (--database) several rc serve share one database: each takes
the leadership lease if it is free (rc.controller.store.leader), else is a
standby behind a closed gate (app.Gate: every request 503 standby) that tries
to take it every 0.5 s; the one holding it starts its Controller as a
restarted controller does. Losing the lease (renewals failing until its
deadline, a fenced write, a broken database connection) closes the gate,
ends relay sessions and stops the process with exit status 3 (SteppedDown):
a supervisor restarts it, and it rejoins as a standby. A clean stop gives
the lease up at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from rc.controller.app import build_app
from rc.controller.config import ControllerConfig
from rc.controller.core import ADMIN_TOKEN_FILE, Controller
from rc.controller.errors import ControllerError, StartupError
from rc.controller.localsocket import LocalSocket, LocalUsers
from rc.proto import pidlock
from rc.proto.mounts import volatile_warning

__all__ = ["STATE_FILE", "bind", "run"]

log = logging.getLogger("rc.serve")

STATE_FILE = "controller.json"
LOCK_FILE = "serve.lock"
SHUTDOWN_GRACE_S = 5.0
KEEP_ALIVE_S = 15.0
"""How long an idle kept-alive connection stays open: longer than a worker's
heartbeat interval (10 s by default), so that its connection is reused, and
short, because Hypercorn notices a client that closed an idle connection only
when this runs out: a burst of short connections (rc forward, rc exec) holds
a descriptor each for this long (README "Limits")."""
NOFILE_MAX = 1 << 20
"""The most open files the controller raises its own soft limit to."""


def raise_nofile_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (at most
    NOFILE_MAX): a soft limit of 1024 runs out under a few hundred relayed
    connections. Returns the soft limit in force; never raises."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = NOFILE_MAX if hard == resource.RLIM_INFINITY else min(hard, NOFILE_MAX)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        return soft
    except (OSError, ValueError):
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def parse_listen(text: str) -> tuple[str, int]:
    """ "HOST:PORT", "[::1]:PORT" or ":PORT" (all interfaces); the port in
    ASCII digits ("８０" is not 80). Raises StartupError."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise StartupError(
            f"listen address {text!r} must look like HOST:PORT (e.g. 127.0.0.1:8080)"
        )
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def bind(listen: str) -> socket.socket:
    """A bound, listening TCP socket. Raises StartupError naming the problem."""
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise StartupError(f"cannot resolve listen host {host!r}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        if e.errno == 98:
            raise StartupError(
                f"cannot listen on {listen}: address already in use "
                "(another rc serve? pick another port with --listen)"
            ) from None
        raise StartupError(f"cannot listen on {listen}: {e.strerror}") from None
    return sock


def lock_data_dir(data_dir: str) -> int:
    """Take the data dir's exclusive lock (DATA/serve.lock, rc.proto.pidlock)
    before the database is opened, so two controllers never share one data
    dir; returns the lock's fd, to keep open for the life of the process.
    Raises StartupError when another rc serve holds it or the dir is unusable."""
    data = Path(data_dir)
    try:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        return pidlock.take(str(data / LOCK_FILE))
    except pidlock.LockBusy as e:
        pid = f" (pid {e.pid})" if e.pid else ""
        raise StartupError(f"data dir {data_dir} is in use by another rc serve{pid}") from None
    except OSError as e:
        raise StartupError(
            f"cannot use data dir {data_dir}: {e.strerror or e}"
            f"{f' ({e.filename})' if e.filename else ''}"
        ) from None


def check_tls_pair(certfile: str, keyfile: str) -> None:
    """Load the certificate and key as Hypercorn will; a bad pair raises
    StartupError naming both files and the problem (not Hypercorn's traceback)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # a passphrase-protected key is refused, never prompted for on the terminal
        ctx.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except ssl.SSLError as e:
        raise StartupError(
            f"TLS --certfile {certfile} / --keyfile {keyfile}: {_tls_problem(e, certfile, keyfile)}"
        ) from None
    except OSError as e:
        raise StartupError(
            f"TLS --certfile {certfile} / --keyfile {keyfile}: {e.strerror or e}"
        ) from None


def _tls_problem(e: ssl.SSLError, certfile: str, keyfile: str) -> str:
    if e.reason == "KEY_VALUES_MISMATCH":
        return "the private key does not belong to the certificate"

    def head(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read(1 << 20)
        except OSError:
            return b""

    if b"-----BEGIN CERTIFICATE-----" not in head(certfile):
        return f"{certfile} holds no PEM certificate"
    key = head(keyfile)
    if b"ENCRYPTED" in key:
        return f"{keyfile} is protected by a passphrase (give an unencrypted key)"
    if b"PRIVATE KEY-----" not in key:
        return f"{keyfile} holds no PEM private key"
    return f"not a usable certificate and private key ({e.reason or e})"


def _url(sock: socket.socket, tls: bool) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"


async def _serve(cfg: ControllerConfig, ready_fd: int | None) -> None:
    """Run the controller until SIGINT/SIGTERM, in steps: check TLS, lock the
    data dir and bind, open the store (or the leadership on PostgreSQL), the
    local socket, take the lease when free, announce, serve, shut down.
    `ready_fd` gets the URL once listening. Raises StartupError (a start
    that failed, each step closing what the ones before it opened), or
    SteppedDown when, on PostgreSQL, it lost the leadership lease."""
    tls = _checked_tls(cfg)
    users = LocalUsers.parse(cfg.local_users)
    raise_nofile_limit()
    lock_fd, sock = _lock_and_bind(cfg)  # the lock is held until this process exits
    ctl = Controller(cfg)
    url = _url(sock, tls)
    leadership = await _open_store(cfg, ctl, url, sock, lock_fd)
    local = await _open_local_socket(cfg, users, ctl, url, leadership, sock, lock_fd)
    gate = None if leadership is None else _Gate(leadership)
    first = await _lead_from_the_start(ctl, leadership, gate, local, sock, lock_fd)
    app = build_app(ctl, gate)
    hc = _hypercorn_config(cfg, sock, tls)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    state = _announce(cfg, ctl, url, gate)
    outcome: dict[str, str] = {}
    leading = None
    if leadership is not None:
        leading = asyncio.create_task(
            _lead(ctl, leadership, gate, stop, outcome, first), name="rc-leadership"
        )
    if ready_fd is not None:
        os.write(ready_fd, (url + "\n").encode())
        os.close(ready_fd)

    async def shutdown_trigger() -> None:
        await stop.wait()
        ctl.hub.close()  # long polls and log follows answer now, not at their deadline

    try:
        await hypercorn_serve(app, hc, shutdown_trigger=shutdown_trigger)
    finally:
        await _shut_down(ctl, leading, local, leadership, gate, outcome, state, lock_fd)
    if "lost" in outcome:
        raise SteppedDown(outcome["lost"])
    if "failed" in outcome:
        raise StartupError(outcome["failed"])


def _checked_tls(cfg: ControllerConfig) -> bool:
    """Whether the controller serves TLS (--certfile given), after checking
    both files are readable, given together and a usable pair. Raises
    StartupError naming the problem."""
    tls = bool(cfg.certfile)
    for f in (cfg.certfile, cfg.keyfile):
        if f and not os.access(f, os.R_OK):
            raise StartupError(f"cannot read TLS file {f}")
    if bool(cfg.certfile) != bool(cfg.keyfile):
        raise StartupError("--certfile and --keyfile go together")
    if tls:
        check_tls_pair(cfg.certfile, cfg.keyfile)
    return tls


def _lock_and_bind(cfg: ControllerConfig) -> tuple[int, socket.socket]:
    """Take the data dir's lock (lock_data_dir), then bind the listening
    socket (bind): (the lock's fd, the socket). A bind that fails lets the
    lock go, then raises StartupError."""
    lock_fd = lock_data_dir(cfg.data_dir)
    try:
        sock = bind(cfg.listen)
    except BaseException:
        os.close(lock_fd)
        raise
    return lock_fd, sock


async def _open_store(cfg: ControllerConfig, ctl: Controller, url: str, sock, lock_fd: int):
    """On PostgreSQL (--database) open the leadership (advertising
    --advertise-url, else `url`) and return it, the controller not yet
    started; else start the controller and return None. On a failure it
    closes `sock` and the lock `lock_fd`, then raises."""
    try:
        if cfg.database:
            from rc.controller.store.leader import Leadership

            return await Leadership(
                cfg.database, ctl.instance, cfg.advertise_url or url, cfg.leader_ttl
            ).open()
        await ctl.start()
        return None
    except BaseException:
        sock.close()
        os.close(lock_fd)
        raise


async def _open_local_socket(
    cfg: ControllerConfig, users, ctl: Controller, url: str, leadership, sock, lock_fd: int
) -> LocalSocket | None:
    """With --socket, start listening on that Unix socket (local users get
    tokens there) and return it; else None. On a failure it stops what
    _open_store opened, closes `sock` and the lock, then raises."""
    if not cfg.socket:
        return None
    local = LocalSocket(cfg.socket, users, ctl.tokens, ctl.clock, lambda: url)
    try:
        await local.start()
    except BaseException:
        if leadership is None:
            await ctl.stop()
        else:
            await leadership.close()
        sock.close()
        os.close(lock_fd)
        raise
    return local


async def _lead_from_the_start(ctl, leadership, gate, local, sock, lock_fd: int):
    """On PostgreSQL, take the leadership lease if it is free and start as the
    active controller before the ready line, as a lone controller is: returns
    the event set when a write is fenced (_activate), or None (not on
    PostgreSQL, or a standby for now). A start that fails undoes every step
    before it and raises StartupError."""
    if leadership is None or not await leadership.take():
        return None
    # the lease was free: active before the ready line, as a lone controller is
    got = await _activate(ctl, leadership, gate)
    if isinstance(got, str):
        if local is not None:
            await local.stop()
        await ctl.stop()
        await leadership.release()
        await leadership.close()
        sock.close()
        os.close(lock_fd)
        raise StartupError(got)
    return got


def _hypercorn_config(cfg: ControllerConfig, sock: socket.socket, tls: bool) -> HypercornConfig:
    """Hypercorn's settings: serve on `sock` (already bound), no access log,
    SHUTDOWN_GRACE_S for in-flight requests, KEEP_ALIVE_S, no Server header,
    and the certificate and key when `tls`."""
    hc = HypercornConfig()
    hc.bind = [f"fd://{sock.fileno()}"]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("rc.hypercorn")
    hc.graceful_timeout = SHUTDOWN_GRACE_S
    hc.keep_alive_timeout = KEEP_ALIVE_S
    hc.include_server_header = False
    if tls:
        hc.certfile, hc.keyfile = cfg.certfile, cfg.keyfile
    return hc


def _announce(cfg: ControllerConfig, ctl: Controller, url: str, gate) -> Path:
    """Write DATA/controller.json ({url, pid, instance, socket}) and say on
    stderr where the controller listens (and, on PostgreSQL, whether it is
    active or a standby) and where a new admin token was written. Returns
    the state file's path."""
    state = Path(cfg.data_dir) / STATE_FILE
    state.write_text(
        json.dumps({"url": url, "pid": os.getpid(), "instance": ctl.instance, "socket": cfg.socket})
    )
    on_socket = f" and {cfg.socket}" if cfg.socket else ""
    on_database = f", database {ctl.db.path}" if cfg.database else ""  # its password hidden
    if gate is not None:
        on_database += ", active" if gate.open else ", standby"
    print(
        f"rc serve: listening on {url}{on_socket} (data {cfg.data_dir}{on_database})",
        file=sys.stderr,
        flush=True,
    )
    _said_admin_token(ctl, cfg)
    for path, what in ((cfg.data_dir, "the state directory"), (cfg.log_dir, "the log directory")):
        if path and (warning := volatile_warning(path, what)):
            print(f"rc serve: warning: {warning}", file=sys.stderr, flush=True)
    return state


async def _shut_down(
    ctl: Controller,
    leading: asyncio.Task | None,
    local: LocalSocket | None,
    leadership,
    gate,
    outcome: dict[str, str],
    state: Path,
    lock_fd: int,
) -> None:
    """Once HTTP has stopped: end the leadership task, the local socket and
    the controller's loops and database (when it started), give the lease
    up unless it was lost, remove controller.json if it is still ours, and
    last let the data dir's lock go."""
    try:
        if leading is not None:
            leading.cancel()
            try:
                await leading
            except asyncio.CancelledError:
                pass
        if local is not None:
            await local.stop()
        if leadership is None or gate.started:
            await ctl.stop()
        if leadership is not None:
            if "lost" not in outcome:
                await leadership.release()  # a standby takes over at its next try
            await leadership.close()
        try:
            if json.loads(state.read_text()).get("pid") == os.getpid():
                state.unlink()
        except (OSError, ValueError):
            pass
    finally:
        os.close(lock_fd)  # the database is closed: the data dir is free
    log.info("rc serve stopped")


class SteppedDown(ControllerError):
    """This controller lost the leadership lease and stopped (exit 3)."""


class _Gate:
    """app.Gate of a controller on PostgreSQL: closed while it is a standby
    (and after it stepped down), open while it is the active one and started."""

    def __init__(self, leadership) -> None:
        self.leadership = leadership
        self.open = False
        self.started = False

    def active_url(self) -> str | None:
        return self.leadership.active_url()


def _said_admin_token(ctl: Controller, cfg: ControllerConfig) -> None:
    if ctl.created_admin_token:
        print(
            f"rc serve: admin token written to {Path(cfg.data_dir) / ADMIN_TOKEN_FILE}",
            file=sys.stderr,
            flush=True,
        )


async def _activate(ctl: Controller, leadership, gate: _Gate) -> asyncio.Event | str:
    """Start as the active controller (as a restarted controller starts),
    fenced by the lease just taken: returns the event set when a write is
    fenced, or the message of a start failure."""
    lease = leadership.lease
    log.info(
        "took the leadership lease (epoch %d): this controller is now the active one (%s)",
        lease.epoch,
        leadership.url,
    )
    fenced = asyncio.Event()
    ctl.db.fence_by(lease)

    def on_fenced(e: Exception) -> None:
        if not fenced.is_set():
            fenced.why = str(e)  # type: ignore[attr-defined]
            fenced.set()

    ctl.db.on_fenced = on_fenced
    gate.started = True  # from here on ctl.stop closes what ctl.start opened
    try:
        await ctl.start()
    except Exception as e:  # noqa: BLE001 - reported as a start failure
        log.error("could not start as the active controller: %s", e)
        return f"could not start as the active controller: {e}"
    gate.open = True
    return fenced


async def _lead(
    ctl: Controller,
    leadership,
    gate: _Gate,
    stop: asyncio.Event,
    outcome: dict[str, str],
    fenced: asyncio.Event | None,
) -> None:
    """A controller on PostgreSQL: a standby until it takes the leadership
    lease (`fenced` None), then the active one (started as a restarted
    controller is) until it loses the lease (its renewal failed until the
    expiry, or a write was fenced); then it stops (exit 3): a clean
    in-process return to standby is not built, so it is restarted to rejoin
    as a standby. Whatever ends it sets `stop`, with the reason in `outcome`."""
    try:
        await _lead_on(ctl, leadership, gate, outcome, fenced)
    except Exception as e:
        log.exception("the leadership task failed")
        outcome["failed"] = f"the leadership task failed: {e}"
    finally:
        stop.set()


async def _lead_on(ctl, leadership, gate, outcome, fenced) -> None:
    from rc.controller.store.leader import TAKE_EVERY_S

    seen = None
    while fenced is None:
        if await leadership.take():
            got = await _activate(ctl, leadership, gate)
            if isinstance(got, str):
                outcome["failed"] = got
                return
            _said_admin_token(ctl, ctl.cfg)
            fenced = got
            break
        active = await leadership.peek()
        now_active = active.url if active is not None and active.live else None
        if (now_active, active.epoch if active else 0) != seen:
            seen = (now_active, active.epoch if active else 0)
            if now_active:
                log.info("standby: the active controller is %s (epoch %d)", *seen)
            else:
                log.info("standby: no controller is active; trying to take over")
        await asyncio.sleep(TAKE_EVERY_S)
    lease = leadership.lease
    holding = asyncio.create_task(leadership.hold(), name="rc-lease-renewal")
    fence_wait = asyncio.create_task(fenced.wait(), name="rc-fence-watch")
    try:
        await asyncio.wait({holding, fence_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (holding, fence_wait):
            t.cancel()
    why = (
        holding.result()
        if holding.done() and not holding.cancelled()
        else getattr(fenced, "why", "a write was fenced")
    )
    gate.open = False
    await leadership.peek()
    other = leadership.active_url()
    where = (
        f"the active controller is {other}"
        if other and other != leadership.url
        else ("a standby takes over")
    )
    ctl.relay.shutdown(f"controller lost leadership; {where}")
    log.error(
        "lost the leadership lease (epoch %d): %s; stopping: restart rc serve to rejoin "
        "as a standby",
        lease.epoch,
        why,
    )
    outcome["lost"] = (
        f"lost the leadership lease (epoch {lease.epoch}): {why}; {where}. "
        "Stopped: restart rc serve to rejoin as a standby"
    )


def _loop_factory():
    """uvloop's event loop when it is installed (the optional `fast` extra),
    else None: asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(cfg: ControllerConfig, ready_fd: int | None = None) -> int:
    """Serve until SIGINT/SIGTERM. Returns 0, or 1 with a one-line error on
    stderr; 3 when, on PostgreSQL, this controller lost the leadership lease
    and stopped (restart it to rejoin as a standby).

    `ready_fd`, when given, receives the URL and a newline once listening.
    """
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(_serve(cfg, ready_fd))
    except SteppedDown as e:
        print(f"rc serve: {e}", file=sys.stderr)
        return 3
    except ControllerError as e:
        print(f"rc serve: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
