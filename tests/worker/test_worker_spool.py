"""Logs across a controller outage: the controller is killed
while a job writes, the job keeps running and writing into the worker's disk
spool, the controller restarts on the same data dir and port, and the log is
complete and in order; when the spool fills, the loss is a marker in the log.
The spool itself, and the log sink's timers (batching, spilling a blocked
write) on a fake clock, without processes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rc.proto import calls
from rc.worker.logsink import SPILL_AFTER_S, LogSink
from rc.worker.spool import Spool
from tests.helpers.asgi import _Uploads
from tests.helpers.fakeclock import FakeClock
from tests.helpers.wait import wait_until


def test_spool_files_are_fifos_within_one_shared_budget(tmp_path):
    spool = Spool(str(tmp_path / "s"), max_bytes=10)
    a, b = spool.open(1), spool.open(2)
    assert list((tmp_path / "s").iterdir()) == []  # unlinked: nothing left after a crash
    assert a.append(b"hello") and b.append(b"12345")
    assert not a.append(b"!")  # the budget is shared
    buf = memoryview(bytearray(3))
    assert a.peek_into(buf) == 3 and bytes(buf) == b"hel"
    a.consume(3)
    assert a.append(b"!!") and a.pending == 4
    assert a.peek_into(memoryview(bytearray(10))) == 4
    a.consume(4)
    assert a.pending == 0 and spool.used == 5
    b.close()
    assert spool.used == 0
    a.close()
    assert Spool("", 0).open(3) is None  # spool_max_bytes = 0: no spool
    tmp = Spool("", 100)
    f = tmp.open(4)
    d = tmp.directory
    f.close()
    tmp.close()
    assert not Path(d).exists()  # a private temporary directory is removed


# -- the log sink's timers, on a fake clock ----------------------------------------------


def test_a_batch_goes_out_batch_seconds_after_its_first_byte():
    clock, up = FakeClock(), _Uploads()
    sink = LogSink(up, 1, clock=clock, batch_seconds=1.0, batch_bytes=1000)
    sink.write(b"abc")
    sink.write(b"def")
    clock.advance(0.99)
    assert up.got == []  # the uploader waits on the clock, which stands still
    clock.advance(0.01)
    wait_until(lambda: up.got == [(0, b"abcdef")], 10, "the batch after 1 s")
    sink.write(b"x" * 1000)  # a full batch goes at once, whatever the clock says
    wait_until(lambda: up.got[1:] == [(6, b"x" * 1000)], 10, "the full batch")
    assert sink.close(10)


def test_a_write_blocked_spill_after_s_goes_to_the_spool(tmp_path):
    """The controller answers, but slowly: a write blocked on the full
    memory buffer for SPILL_AFTER_S goes to the disk spool, so the job
    writes on; the order is kept."""
    clock, up = FakeClock(), _Uploads()
    spool = Spool(str(tmp_path / "spool"), max_bytes=1 << 20)
    sink = LogSink(up, 1, spool=spool, clock=clock, max_buffer=10, batch_bytes=10)
    up.gate.clear()
    sink.write(b"x" * 10)  # fills memory; the uploader takes it and waits
    writer = threading.Thread(target=sink.write, args=(b"y" * 10,), daemon=True)
    writer.start()
    # the clock's readings: the first byte's time, the uploader's look at it,
    # the writer's "blocked since", then one per look of the blocked writer
    clock.wait_for_reads(4)
    clock.advance(SPILL_AFTER_S - 0.01)
    clock.turns()
    assert writer.is_alive() and sink.spilled == 0
    clock.advance(0.01)
    writer.join(10)
    assert not writer.is_alive() and sink.spilled == 20  # memory first, then the write
    up.gate.set()
    assert sink.close(10)
    assert up.bytes() == b"x" * 10 + b"y" * 10 and sink.lost == 0
    spool.close()


def test_a_requeued_run_appends_after_the_stored_log_behind_a_separator(tmp_path):
    """A job the hardware requeued (README "GPU health"): the rerun's sink
    starts at the stored size (Assignment.log_offset) with the separator
    line; a late retry of the first run's last upload is deduplicated by
    its offset, so nothing is lost, doubled or interleaved."""
    from rc.controller.logstore import LogStore
    from rc.worker.job import restart_separator

    store = LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda job_id: None)

    class Direct:  # the controller's log endpoint, straight into the store
        def call(self, route, job_id, *, body, params):
            assert (route, job_id) == (calls.LOG_APPEND, 7)
            store._append(job_id, params["offset"], bytes(body))

    first = LogSink(Direct(), 7, batch_seconds=0.0)
    first.write(b"run 0\npartial")
    assert first.close(10)
    size = store.size(7)
    again = LogSink(Direct(), 7, batch_seconds=0.0)
    again.resume_at(size, restart_separator(1, mid_line=True))
    store._append(7, 6, b"partial")  # the first run's upload, retried late
    again.write(b"run 1\n")
    assert again.close(10)
    assert store.read(7, 0, 1000) == (
        b"run 0\npartial\n--- restart 1 after a hardware failure ---\nrun 1\n"
    )
    with pytest.raises(ValueError):
        again.resume_at(0)  # only before any output
