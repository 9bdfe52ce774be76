"""A SIGHUP, SIGTERM or Ctrl-C whose exception Python threw away is acted on
at the next long poll (rc.cli.context.raise_pending): a signal's handler
runs wherever the interpreter is, and an exception raised inside a
finalizer is ignored. CI once saw rc run sit 30 s in its queue wait after a
SIGHUP (tests/e2e/test_hold.py::test_a_hold_queues_and_ctrl_c_while_queued_cancels_it)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from rc.cli import context
from rc.cli.follow import wait_started
from rc.proto import calls


class _SignalledInFinalizer:
    """Sends `sig` to this process from its own __del__ and runs bytecode
    after it, so the handler's exception is raised, and lost, in there."""

    def __init__(self, sig: int) -> None:
        self.sig = sig

    def __del__(self) -> None:
        os.kill(os.getpid(), self.sig)
        for _ in range(1000):
            pass


@pytest.fixture
def handlers(monkeypatch):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    lost: list = []
    monkeypatch.setattr(sys, "unraisablehook", lost.append)
    context._pending.clear()
    context.hangup_interrupts()
    yield lost
    context._pending.clear()
    for s, h in saved.items():
        signal.signal(s, h)


def _lose(sig: int) -> None:
    _SignalledInFinalizer(sig)  # dropped at once: its __del__ runs here


@pytest.mark.parametrize(
    ("sig", "kind"),
    [
        (signal.SIGHUP, context.Hangup),
        (signal.SIGTERM, context.Hangup),
        (signal.SIGINT, KeyboardInterrupt),
    ],
)
def test_an_interruption_lost_in_a_finalizer_is_raised_again(handlers, sig, kind):
    _lose(sig)
    assert [type(u.exc_value) for u in handlers] == [kind]  # Python threw it away
    with pytest.raises(kind) as got:
        context.raise_pending()
    assert context.interrupt_cause(got.value) == (
        "Ctrl-C" if sig == signal.SIGINT else signal.Signals(sig).name
    )
    context.raise_pending()  # taken: quiet now


class _Queue:
    """A controller as rc run's queue wait sees it: the job stays queued at
    position 1; the first long poll loses a SIGHUP in a finalizer."""

    def __init__(self) -> None:
        self.polls = 0
        self.killed = ""

    def call(self, spec, job_id, **kw):
        if spec is calls.JOB_KILL:
            self.killed = kw["body"].reason
            return {}
        assert spec is calls.JOB_GET
        self.polls += 1
        assert self.polls < 5, "the queue wait went on after the SIGHUP"
        if self.polls == 1:
            _lose(signal.SIGHUP)
        state = "killed" if self.killed else "queued"
        return {"job": {"id": job_id, "state": state}, "queue_position": 1}


def test_the_queue_wait_cancels_on_a_sighup_that_was_lost(handlers, capsys):
    queue = _Queue()
    assert wait_started(queue, {"id": 7, "state": "queued"}, 1, "box:cpu0") is None
    assert queue.polls == 2  # the poll that lost it, then the cancel's look
    assert queue.killed == "cancelled while queued (SIGHUP)"
    assert "cancelled queued job 7" in capsys.readouterr().err
