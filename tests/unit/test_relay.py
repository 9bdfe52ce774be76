"""The relay without processes: pipes, sessions, timeouts, frames, a
terminal's first size and end of input, locations.

The controller's Relay runs on a real event loop with a fake clock; the
frame codec is the one the worker and the CLI share.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from rc.cli.context import UsageError
from rc.cli.copy import Remote, parse_location
from rc.cli.relay import _pump_stdin
from rc.controller.errors import Refused
from rc.controller.relay import Ended, Pipe, Relay
from rc.proto.model import Stdio
from rc.proto.relay import FrameDecoder, FrameError, data_frame, resize_frame
from rc.proto.wire import SessionReport, SessionRequest
from rc.worker.terminal import Terminal
from tests.helpers.wait import wait_until


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- pipes ------------------------------------------------------------------------------


def test_pipe_keeps_order_and_ends_with_eof():
    async def go():
        p = Pipe(limit=100)
        await p.put(b"ab")
        await p.put(b"cd")
        p.close()
        assert await p.get() == b"abcd"
        assert await p.get() is None

    run(go())


async def _settle(rounds: int = 20) -> None:
    """Let every task ready to run go as far as it can (no clock involved):
    what is still pending afterwards is waiting on something."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_pipe_writer_waits_while_full_then_continues():
    async def go():
        p = Pipe(limit=4)
        await p.put(b"1234")
        blocked = asyncio.ensure_future(p.put(b"5"))
        await _settle()
        assert not blocked.done(), "a full pipe must make its writer wait"
        assert await p.get(limit=2) == b"12"
        await asyncio.wait_for(blocked, 1)
        assert await p.get() == b"345"

    run(go())


def test_breaking_a_pipe_wakes_both_sides_and_drops_bytes():
    async def go():
        p = Pipe(limit=2)
        await p.put(b"xy")
        writer = asyncio.ensure_future(p.put(b"z"))
        empty = Pipe()
        reader = asyncio.ensure_future(empty.get())
        await _settle()
        p.breaks("gone")
        empty.breaks("gone")
        for t in (writer, reader):
            with pytest.raises(Ended, match="gone"):
                await t
        with pytest.raises(Ended):
            await p.get()

    run(go())


# -- sessions ------------------------------------------------------------------------------


def test_one_connection_per_half_and_no_reopening():
    async def go():
        r = Relay(60, 16)
        s = r.for_job(7, "alice", "box", Stdio.TTY)
        r.attach(s, "worker_in")
        r.attach(s, "client_out")
        with pytest.raises(Refused) as e:
            r.attach(s, "client_out")
        assert e.value.status == 409 and e.value.code == "conflict"
        r.detach(s, "client_out")
        with pytest.raises(Refused) as e:
            r.attach(s, "client_out")
        assert e.value.code == "session_ended"
        r.finish(s, "done")
        with pytest.raises(Refused) as e:
            r.for_job(7, "alice", "box", Stdio.TTY)
        assert e.value.code == "session_ended"

    run(go())


def test_a_job_session_no_worker_came_to_starts_afresh():
    """`rc run --tty` attaches while its job is assigned; the job went back to
    the queue and rc left: the next connection gets a fresh session. One a
    worker half was in stays ended."""

    async def go():
        r = Relay(60, 16)
        s = r.for_job(7, "alice", "box", Stdio.TTY)
        r.attach(s, "client_in")
        r.attach(s, "client_out")
        r.detach(s, "client_out")
        r.finish(s, "the client went away")
        fresh = r.for_job(7, "alice", "box", Stdio.TTY)
        assert fresh is not s and not fresh.ended
        r.attach(fresh, "client_out")
        r.attach(fresh, "worker_out")
        r.finish(fresh, "done")
        with pytest.raises(Refused) as e:
            r.for_job(7, "alice", "box", Stdio.TTY)
        assert e.value.code == "session_ended"

    run(go())


def test_a_side_left_alone_is_ended_after_the_timeout():
    async def go():
        clock = Clock()
        r = Relay(60, 16, clock=clock)
        s = r.for_job(1, "alice", "box", Stdio.PIPE)
        r.attach(s, "worker_out")
        clock.t += 59
        r.tick(clock.t)
        assert not s.ended
        clock.t += 2
        r.tick(clock.t)
        assert s.ended and "no client attached" in s.end_reason
        with pytest.raises(Ended):
            await s.out.put(b"x")

    run(go())


def test_both_sides_attached_never_time_out_and_ended_sessions_are_forgotten():
    async def go():
        clock = Clock()
        r = Relay(60, 16, clock=clock)
        s = r.for_job(1, "alice", "box", Stdio.TTY)
        r.attach(s, "client_out")
        r.attach(s, "worker_out")
        clock.t += 3600
        r.tick(clock.t)
        assert not s.ended
        r.detach(s, "client_out")
        r.detach(s, "worker_out")
        r.finish(s, "the output ended", clean=True)
        clock.t += 601
        r.tick(clock.t)
        assert r.get(1, 0) is None

    run(go())


def test_per_user_session_limit():
    async def go():
        r = Relay(60, 2)
        r.for_job(1, "alice", "box", Stdio.TTY)
        r.for_job(2, "alice", "box", Stdio.TTY)
        r.for_job(3, "bob", "box", Stdio.TTY)
        with pytest.raises(Refused) as e:
            r.for_job(4, "alice", "box", Stdio.TTY)
        assert e.value.status == 429

    run(go())


def test_forward_connections_have_their_own_per_user_limit():
    async def go():
        r = Relay(60, 1, forwards_per_user=2)
        fwd = SessionRequest(Stdio.PIPE, port=8888)
        r.open_in_hold(5, ("box:cpu0",), "box", "alice", SessionRequest(Stdio.PIPE, ("cat",)))
        a = r.open_in_hold(5, ("box:cpu0",), "box", "alice", fwd)
        r.open_in_hold(5, ("box:cpu0",), "box", "alice", fwd)
        assert a.start.port == 8888 and a.forward
        with pytest.raises(Refused) as e:
            r.open_in_hold(5, ("box:cpu0",), "box", "alice", fwd)
        assert e.value.status == 429 and "2 forward connections" in e.value.message
        with pytest.raises(Refused) as e:
            r.open_in_hold(5, ("box:cpu0",), "box", "alice", SessionRequest(Stdio.PIPE, ("ls",)))
        assert "1 terminal or pipe sessions" in e.value.message
        r.finish(a, "the connection was closed")
        r.open_in_hold(5, ("box:cpu0",), "box", "alice", fwd)  # an ended one frees its place

    run(go())


def test_hold_session_is_handed_out_until_acknowledged_and_keeps_its_outcome():
    async def go():
        clock = Clock()
        woken = []
        r = Relay(60, 16, notify=woken.extend, clock=clock)
        s = r.open_in_hold(
            5, ("box:cpu0",), "box", "alice", SessionRequest(Stdio.PIPE, ("cat",), rows=0, cols=0)
        )
        assert "worker:box" in woken
        assert [x.session_id for x in r.starts_for("box")] == [s.key[1]]
        assert r.starts_for("box") == () and r.starts_for("other") == ()
        clock.t += 11
        assert len(r.starts_for("box")) == 1, "an unacknowledged start is handed out again"
        r.report(s, SessionReport("running"))
        clock.t += 11
        assert r.starts_for("box") == ()
        r.report(s, SessionReport("ended", 3, "exited with code 3", "oops\n"))
        v = s.view()
        assert (v.state, v.exit_code, v.stderr, v.hold_id) == ("ended", 3, "oops\n", 5)
        assert await s.out.get() is None, "output of a session that never attached is complete"

    run(go())


def test_a_session_whose_worker_never_reports_ends_without_an_exit_code():
    async def go():
        clock = Clock()
        r = Relay(60, 16, clock=clock)
        s = r.open_in_hold(5, ("box:cpu0",), "box", "alice", SessionRequest(Stdio.TTY))
        r.report(s, SessionReport("running"))
        r.finish(s, "the worker's output connection broke")
        clock.t += 29
        r.tick(clock.t)
        assert s.view().state == "running"
        clock.t += 2
        r.tick(clock.t)
        v = s.view()
        assert v.state == "ended" and v.exit_code is None and "did not say" in v.reason

    run(go())


# -- frames ------------------------------------------------------------------------------


def test_frames_round_trip_across_chunk_boundaries():
    raw = data_frame(b"ls\r\x03\x1a\xff") + resize_frame(40, 120) + b'{"t":"future"}\n'
    d = FrameDecoder()
    events = []
    for i in range(len(raw)):
        events += d.feed(raw[i : i + 1])
    assert events == [("d", b"ls\r\x03\x1a\xff"), ("r", 40, 120)]


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b'{"t":"d"}\n',
        b'{"t":"r","rows":-1,"cols":2}\n',
        b"[1]\n",
        b'{"t":"d","b":"%%%"}\n',
    ],
)
def test_malformed_frames_are_errors(line):
    with pytest.raises(FrameError):
        FrameDecoder().feed(line)


def test_an_overlong_frame_is_an_error():
    with pytest.raises(FrameError, match="longer"):
        FrameDecoder().feed(b"x" * ((1 << 20) + 1))


# -- the first window size of a terminal ---------------------------------------------------


class _Input:
    """A worker's input half that yields `frames`, then stays open until closed."""

    path = "/v1/jobs/1/tty/in"

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.closed = threading.Event()

    def __iter__(self):
        yield from self.frames
        self.closed.wait(30)


class _Halves:
    def __init__(self, frames: list[bytes]) -> None:
        self.inp = _Input(frames)

    def close(self) -> None:
        self.inp.closed.set()


@pytest.mark.parametrize(
    "rows,cols,want", [(0, 0, (24, 80)), (0, 132, (24, 80)), (40, 120, (40, 120))]
)
def test_the_clients_first_resize_frame_settles_a_terminals_size(rows, cols, want):
    """Whatever the first frame says, 0x0 included (the client does not know
    its size), the worker stops waiting for one (TTY_SIZE_WAIT_S is only for
    a client that never sends any)."""
    halves = _Halves([resize_frame(rows, cols)])
    term = Terminal(halves, lambda sending: None, None)
    try:
        wait_until(lambda: term.size is not None, 10, "the first frame to settle the size")
        assert term.wait_size(3600) == want
    finally:
        halves.close()
        term.close()


class _Upload:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.finished = False

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def finish(self) -> None:
        self.finished = True


class _NoSizeTerminal:
    is_tty = True

    def size(self) -> tuple[int, int]:
        return 0, 0


def test_stdin_ending_adds_nothing_to_a_terminal_session_and_0x0_is_sent_as_24x80():
    up = _Upload()
    r, w = os.pipe()
    wake_r, wake_w = os.pipe()
    try:
        os.write(w, b"ab")
        os.close(w)
        _pump_stdin(up, r, _NoSizeTerminal(), wake_r)
    finally:
        for fd in (r, wake_r, wake_w):
            os.close(fd)
    assert up.sent == [resize_frame(24, 80), data_frame(b"ab")]
    assert up.finished


class _OutputTerminal:
    """stdin is not a terminal, stdout is (`rc shell HOLD < script` in a window)."""

    is_tty = False

    def __init__(self) -> None:
        self.rows_cols = (30, 100)

    def size(self) -> tuple[int, int]:
        return self.rows_cols


def test_resizes_are_forwarded_when_only_stdout_is_a_terminal_even_after_stdin_ends():
    """Report 18: with stdin from a pipe, window resizes were never sent."""
    up = _Upload()
    term = _OutputTerminal()
    r, w = os.pipe()
    wake_r, wake_w = os.pipe()
    pump = threading.Thread(target=_pump_stdin, args=(up, r, term, wake_r), daemon=True)
    pump.start()
    try:
        os.write(w, b"ls\r")
        wait_until(lambda: len(up.sent) == 2, 10, "the first size and the keys")
        term.rows_cols = (40, 120)
        os.write(wake_w, b"w")  # what the SIGWINCH handler writes
        wait_until(lambda: len(up.sent) == 3, 10, "the first resize")
        os.close(w)  # stdin ends; the window can still change
        term.rows_cols = (50, 132)
        os.write(wake_w, b"w")
        wait_until(lambda: len(up.sent) == 4, 10, "a resize after the end of stdin")
        assert up.sent == [
            resize_frame(30, 100),
            data_frame(b"ls\r"),
            resize_frame(40, 120),
            resize_frame(50, 132),
        ]
        assert not up.finished  # the input stays open for the resizes
    finally:
        os.close(wake_w)  # as splice() does at the end: the pump ends
        pump.join(10)
        for fd in (r, wake_r):
            os.close(fd)
    assert not pump.is_alive()


# -- rc cp locations --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,want",
    [
        ("box:gpu0:/data/x", Remote("box:gpu0", "/data/x")),
        ("box:gpu0:rel/x", Remote("box:gpu0", "rel/x")),
        ("./a:b", "./a:b"),
        ("C:\\x", "C:\\x"),
        ("plain/path", "plain/path"),
        ("a:b:c:d", "a:b:c:d"),
    ],
)
def test_parse_location(text, want):
    assert parse_location(text) == want


def test_location_typos_are_refused_with_a_correct_example():
    with pytest.raises(UsageError, match="dgx:gpu0:/x"):
        parse_location("dgx:/x")
    with pytest.raises(UsageError, match="no path"):
        parse_location("box:gpu0:")
