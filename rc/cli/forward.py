"""`rc forward HOLD [LOCAL:]REMOTE`: a port of the hold's host on this one.

rc listens on 127.0.0.1:LOCAL here (LOCAL defaults to REMOTE; 0 picks a
free port, printed). Each TCP connection it accepts becomes one pipe
session inside the hold whose start names REMOTE instead of a command
(POST /v1/jobs/{hold}/sessions {"stdio": "pipe", "port": REMOTE}); the hold's
worker connects to 127.0.0.1:REMOTE on its host and the relay carries the
bytes (rc.worker.forward). Nothing new listens on the GPU host, and only
its loopback ports can be reached.

- Connections are independent: many at once (up to the controller's
  forward_connections_per_user, 256 by default), and either side closing
  ends that connection only. Its end of file here is a half close there
  (the far side still answers); the far side closing ends the connection.
- Ctrl-C (or SIGTERM, SIGHUP) ends the forward and every connection, exit 0.
  The hold ending ends it too, saying so (exit 1).
- Only the hold's owner or an admin may forward into it; anyone else is
  refused before rc listens (and by the controller at every connection).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import threading

from rc.cli.complete import attach, holds
from rc.cli.context import UsageError, add_client_flags, client, number_in, stderr
from rc.cli.follow import wait_terminal
from rc.cli.output import hold_end, job_state, on_devices
from rc.cli.relay import open_halves, open_session
from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.relay import Download, Upload

__all__ = ["Forwarder", "add_parsers", "cmd_forward", "parse_ports"]

RECV_BYTES = 1 << 20
"""Most bytes one read of a local connection takes."""
BACKLOG = 128
"""Connections the local listener queues before rc accepts them."""


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "forward",
        help="a port of a hold's host on 127.0.0.1 here (Jupyter, TensorBoard, ssh)",
        description="Listen on 127.0.0.1:LOCAL and carry each connection through the "
        "controller to 127.0.0.1:REMOTE on the host of hold HOLD (the hold's worker "
        "connects there). LOCAL defaults to REMOTE; 0 picks a free port. Ctrl-C ends it.",
    )
    attach(
        p.add_argument("hold", type=number_in(1), metavar="HOLD", help="a running hold of yours"),
        holds,
    )
    p.add_argument("ports", metavar="[LOCAL:]REMOTE", help="e.g. 8888, or 2222:22")
    add_client_flags(p)
    p.set_defaults(handler="forward:cmd_forward")


def parse_ports(text: str) -> tuple[int, int]:
    """`[LOCAL:]REMOTE` as (local, remote): REMOTE in 1..65535, LOCAL in
    0..65535 (0: any free port), REMOTE when not given. Raises UsageError."""
    local_text, sep, remote_text = text.rpartition(":")
    remote = _port(remote_text, "REMOTE", 1)
    local = _port(local_text, "LOCAL", 0) if sep else remote
    return local, remote


def _port(text: str, what: str, lo: int) -> int:
    if not text.isascii() or not text.isdigit() or not lo <= int(text) <= 65535:
        raise UsageError(f"{what} port {text!r} is not a number in {lo}..65535")
    return int(text)


def _check_hold(c: Client, hold: int) -> dict:
    """The hold's record, once it is known to be a running hold the caller
    may forward into. Raises RcError naming what is wrong."""
    try:
        job = c.call(calls.JOB_GET, hold)["job"]
    except ApiError as e:
        if e.status == 404:
            raise RcError(f"no hold {hold} (rc ps lists yours)") from None
        raise
    if job["kind"] != "hold":
        raise RcError(f"job {hold} is not a hold (rc forward reaches into a hold of yours)")
    if job["state"] not in ("assigned", "running"):
        raise RcError(f"hold {hold} is {job_state(job, None)}; rc forward needs a running hold")
    me = c.call(calls.WHOAMI)
    # ownership is the principal (a controller from before principals sends
    # neither field: the controller's own check on the session still holds)
    owner, principal = job.get("owner", ""), me.get("principal", "")
    if me["role"] != "admin" and owner and principal != owner:
        raise RcError(
            f"hold {hold} belongs to {job['submitter']}; only its owner or an admin "
            "may forward into it"
        )
    return job


class Forwarder:
    """The listener and its connections. `serve()` accepts until `stop()`
    (any thread, or a signal handler); each connection runs on a thread
    of its own."""

    def __init__(self, c: Client, hold: int, remote: int, listener: socket.socket) -> None:
        self.c = c
        self.hold = hold
        self.remote = remote
        self.listener = listener
        self.why_stopped = ""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()
        self._live: set[tuple[socket.socket, tuple]] = set()
        self.served = 0

    def stop(self, why: str = "") -> None:
        """End the forward: the accept loop returns, every connection closes."""
        if why and not self.why_stopped:
            self.why_stopped = why
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def serve(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.listener, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    continue
                self.served += 1
                threading.Thread(
                    target=self._connection, args=(conn,), daemon=True, name="rc-forward"
                ).start()
        finally:
            self.listener.close()
            with self._lock:
                live = list(self._live)
            for conn, halves in live:
                _close(conn, *halves)

    def _connection(self, conn: socket.socket) -> None:
        halves: list = []
        try:
            self._carry(conn, halves)
        finally:
            _close(conn, *halves)
            self.c.close()  # this thread's kept-alive connection (one per thread)

    def _carry(self, conn: socket.socket, halves: list) -> None:
        try:
            view = open_session(self.c, self.hold, {"stdio": "pipe", "port": self.remote})
        except ApiError as e:
            stderr(f"a connection was refused: {e.code}: {e.message}")
            if e.status in (403, 404) or e.code in ("session_ended", "not_a_hold"):
                self.stop(f"hold {self.hold}: {e.message}")
            return
        except RcError as e:
            stderr(f"a connection could not be carried: {e}")
            return
        sid = view["session_id"]
        try:
            up, down = open_halves(self.c, calls.SESSION_RELAY.at(self.hold, sid))
        except RcError as e:
            stderr(f"connection {sid}: {e}")
            return
        halves += [up, down]
        entry = (conn, (up, down))
        with self._lock:
            self._live.add(entry)
        try:
            threading.Thread(
                target=_pump_local, args=(conn, up), daemon=True, name="rc-forward-in"
            ).start()
            got = _pump_remote(down, conn)
        finally:
            with self._lock:
                self._live.discard(entry)
        if got == 0:
            self._say_why(sid)

    def _say_why(self, sid: int) -> None:
        """A connection that brought nothing back: say why, when it never
        reached the port (nothing listens there, say)."""
        with contextlib.suppress(RcError):
            view = self.c.call(
                calls.SESSION_GET,
                self.hold,
                sid,
                params={"wait": "5s", "state": "running"},
                timeout=15,
            )
            if view["state"] == "ended" and view.get("exit_code") is None:
                stderr(f"connection {sid}: {view.get('reason') or 'it ended'}")


def _pump_local(conn: socket.socket, up: Upload) -> None:
    """This side's bytes into the session; end of file ends its input."""
    try:
        while True:
            data = conn.recv(RECV_BYTES)
            if not data:
                up.finish()
                return
            up.send(data)
    except (OSError, TransportError):
        up.close()


def _pump_remote(down: Download, conn: socket.socket) -> int:
    """The far side's bytes to this connection until they end; returns how
    many came."""
    got = 0
    try:
        for data in down:
            conn.sendall(data)
            got += len(data)
    except (OSError, TransportError):
        pass
    return got


def _close(conn: socket.socket, *halves) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        conn.close()
    for h in halves:
        h.close()


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(BACKLOG)
    except OSError as e:
        s.close()
        raise RcError(
            f"cannot listen on 127.0.0.1:{port}: {e.strerror or e} "
            "(give another local port: rc forward HOLD LOCAL:REMOTE, or 0 for any)"
        ) from None
    return s


def cmd_forward(args: argparse.Namespace) -> int:
    local, remote = parse_ports(args.ports)
    c = client(args)
    job = _check_hold(c, args.hold)
    listener = _listen(local)
    fwd = Forwarder(c, args.hold, remote, listener)

    def leave(signum, frame):
        fwd.stop()

    old = {s: signal.signal(s, leave) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def watch() -> None:
        with contextlib.suppress(RcError):
            ended = wait_terminal(c, args.hold)
            fwd.stop(f"hold {args.hold} ended: {hold_end(ended)}")

    threading.Thread(target=watch, daemon=True, name="rc-forward-hold").start()
    host = on_devices(job).partition(":")[0]
    stderr(
        f"forwarding 127.0.0.1:{listener.getsockname()[1]} to 127.0.0.1:{remote} on "
        f"{host} (hold {args.hold}); Ctrl-C ends it"
    )
    try:
        fwd.serve()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if fwd.why_stopped:
        stderr(fwd.why_stopped)
        return 1
    return 0
