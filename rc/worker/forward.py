"""One connection of a port forward (`rc forward HOLD [LOCAL:]REMOTE`), on
the worker's side (docs/design.md#the-relay).

The client turns each TCP connection it accepts into a pipe session inside
the hold whose start names a port (SessionStart.port). The worker then runs
no process: it connects to 127.0.0.1:port on this host (loopback only:
nothing new listens here, and no other address is ever dialled), dials the
relay's two worker halves (rc.worker.attached.Halves) and copies bytes both
ways:

- the relay's input → the socket; its end of file is a half close
  (shutdown SHUT_WR), so a request/response protocol still gets its answer;
- the socket → the relay's output; the far side closing ends the output
  cleanly, which ends the session once the client has read it all;
- the relay ending the session (the client went away, the hold ended) shuts
  the socket down at once.

A port nothing listens on ends the session before any relay half connects:
its report says why, and the controller ends the (empty) output cleanly.
`Forward.moved` counts the bytes carried, both ways together.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from rc.proto import calls
from rc.proto.errors import RcError, TransportError
from rc.proto.wire import SessionStart
from rc.worker.attached import Halves, join_started

__all__ = ["CONNECT_TIMEOUT_S", "Forward", "run_forward"]

log = logging.getLogger("rc.worker.forward")

CONNECT_TIMEOUT_S = 10.0
"""How long connecting to the forwarded loopback port may take."""
RECV_BYTES = 1 << 20
"""Most bytes one read of the forwarded socket takes."""
HOLD_CHECK_S = 0.2
"""How often a forward connection looks whether its hold has ended."""
INPUT_JOIN_S = 1.0
"""After the output ended, how long the input pump gets to stop."""

Report = Callable[..., None]


class Forward:
    """The socket of one forward connection and its two pumps. `run()`
    blocks until both directions are done; returns why it ended."""

    def __init__(self, sock: socket.socket, halves_factory: Callable[..., Halves]) -> None:
        self.sock = sock
        self.moved = 0
        self.hung_up = ""
        self._lock = threading.Lock()
        self.halves = halves_factory(self._hangup)

    def _hangup(self, reason: str) -> None:
        self.hung_up = reason
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _count(self, n: int) -> None:
        with self._lock:
            self.moved += n

    def _pump_in(self) -> None:
        try:
            for chunk in self.halves.inp:
                self.sock.sendall(chunk)
                self._count(len(chunk))
            self.sock.shutdown(socket.SHUT_WR)  # the client's end of file
        except (TransportError, OSError) as e:
            log.debug("forward input ended: %s", e)

    def run(self) -> str:
        """Copy both ways until the far side closes or the relay hangs up."""
        inp = threading.Thread(target=self._pump_in, daemon=True, name="rc-forward-in")
        inp.start()
        clean = False
        try:
            while True:
                data = self.sock.recv(RECV_BYTES)
                if not data:
                    clean = not self.hung_up
                    break
                self.halves.out.send(data)
                self._count(len(data))
        except (TransportError, OSError) as e:
            log.debug("forward output ended: %s", e)
        if clean:
            with contextlib.suppress(TransportError):
                self.halves.out.finish()
        join_started(inp, INPUT_JOIN_S)
        self.halves.close()
        with contextlib.suppress(OSError):
            self.sock.close()
        join_started(inp, INPUT_JOIN_S)
        if self.hung_up:
            return f"the connection was closed ({self.hung_up})"
        return "the connection was closed" if clean else "the connection broke"


def run_forward(ctx, st: SessionStart, hold, report: Report) -> None:
    """Serve session `st` (a forward to port st.port) inside `hold` (its
    JobRun) to its end, for the worker `ctx` (rc.worker.sessions.SessionContext),
    reporting running and ended through `report(ctx, st, state, exit_code,
    reason)`. The hold ending, or the worker stopping, closes the connection."""
    where = f"127.0.0.1:{st.port} on {ctx.cfg.host}"
    try:
        sock = socket.create_connection(("127.0.0.1", st.port), timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        report(ctx, st, "ended", None, f"cannot connect to {where}: {why}")
        return
    sock.settimeout(None)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    paths = calls.SESSION_RELAY.at(st.hold_id, st.session_id)
    try:
        fwd = Forward(
            sock,
            lambda on_hangup: Halves.connect(
                ctx.client, paths, on_hangup, threading.Event(), ctx.clock
            ),
        )
    except RcError as e:
        sock.close()
        report(ctx, st, "ended", None, f"cannot attach to the relay: {e}")
        return
    # said on the side: the first bytes wait for no report
    threading.Thread(
        target=_report_running, args=(ctx, st, report), daemon=True, name="rc-forward-report"
    ).start()
    done = threading.Event()
    threading.Thread(
        target=_watch_hold, args=(ctx, st, hold, fwd, done), daemon=True, name="rc-forward-hold"
    ).start()
    try:
        why = fwd.run()
    finally:
        done.set()
    report(ctx, st, "ended", 0, why)


def _report_running(ctx, st: SessionStart, report: Report) -> None:
    try:
        report(ctx, st, "running")
    finally:
        ctx.client.close()  # this thread's kept-alive connection


def _watch_hold(ctx, st: SessionStart, hold, fwd: Forward, done: threading.Event) -> None:
    while not done.wait(HOLD_CHECK_S):
        if hold.ending is not None or ctx.runs.get(st.hold_id) is not hold:
            fwd._hangup(hold.ending or f"hold {st.hold_id} ended")
            return
        if ctx.stopping():
            fwd._hangup("the worker is shutting down")
            return
