"""Log tails in reports (README "Operating a worker"): a job's report carries
the output its LogSink holds and the controller has not acknowledged
(JobReport.log_offset/log_tail), the controller stores it through the log
store before it applies the report, and the bytes leave the sink only once
the reply says the log reaches past them. The sink's hand-off and its
uploader on a fake clock, the reporter against a log store standing in for
the controller, and the controller's side through the real ASGI app
in-process (tests.test_long_poll.call), on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import threading

import orjson
import pytest

from rc.controller.app import build_app
from rc.controller.logstore import LogStore
from rc.proto import calls
from rc.proto.errors import ApiError, TransportError
from rc.proto.model import JobState, Stdio
from rc.proto.wire import LOG_TAIL_BYTES, WORKER_PROTOCOL
from rc.worker.logsink import LogSink
from rc.worker.registration import _tail_bytes
from rc.worker.reporter import Report, Reporter
from tests.helpers.asgi import REG, REPORTS, _Uploads, call, lab  # noqa: F401 (a fixture)
from tests.helpers.fakeclock import FakeClock
from tests.helpers.inprocess import Lab
from tests.helpers.wait import wait_until

JOB = 7


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the sink's hand-off -------------------------------------------------------


def test_a_tail_the_controller_stored_leaves_the_sink_and_the_uploader_never_sends_it():
    clock, up = FakeClock(), _Uploads()
    sink = LogSink(up, JOB, clock=clock, batch_seconds=1.0, tail_limit=lambda: 100)
    sink.write(b"first\n")
    assert sink.tail(100) == (0, b"first\n")
    assert sink.tail(3) == (0, b"fir")  # a copy of the front, at most the limit
    sink.tail_stored(6)
    assert sink.tail(100) is None and sink.offset == 6
    sink.write(b"second\n")
    assert sink.tail(100) == (6, b"second\n")
    sink.tail_stored(4)  # an acknowledgement from before: nothing more leaves
    assert sink.tail(100) == (6, b"second\n")
    assert sink.close(10, hand_off=True)  # handed off: no upload, at once
    assert sink.handed
    sink.tail_stored(13)
    sink.release()
    clock.advance(5)
    assert sink._thread is not None
    sink._thread.join(10)
    assert up.got == [] and sink.lost == 0


def test_a_released_hand_off_the_controller_did_not_store_goes_through_the_uploader():
    clock, up = FakeClock(), _Uploads()
    sink = LogSink(up, JOB, clock=clock, batch_seconds=1.0, tail_limit=lambda: 100)
    sink.write(b"line\n")
    assert sink.close(10, hand_off=True) and sink.handed
    assert up.got == []  # the batch timer stands still
    sink.release()  # the report settled without the tail stored
    wait_until(lambda: up.got == [(0, b"line\n")], 10, "the uploader's send")
    sink._thread.join(10)
    assert not sink._thread.is_alive() and sink.lost == 0


def test_output_over_the_tail_limit_or_without_tails_is_flushed_by_close_as_before():
    for limit, data in ((4, b"longer\n"), (0, b"x\n")):
        up = _Uploads()
        sink = LogSink(up, JOB, clock=FakeClock(), tail_limit=lambda n=limit: n)
        sink.write(data)
        assert sink.close(10, hand_off=True)
        assert not sink.handed and up.got == [(0, data)]
        assert sink.tail(100) is None


def test_the_uploader_and_a_tail_acknowledged_in_between_keep_every_byte_once_in_order(tmp_path):
    """The uploader holds bytes 0-10 in flight while a report's tail (0-15)
    is stored and acknowledged, then the uploader's answer comes: its
    acknowledgement is an offset, so it drops nothing the sink still needs;
    and the other way round (a tail of 0-5 acknowledged while the upload of
    0-10 is in flight). The stored log is the stream, once."""
    for tail_end in (15, 5):
        store = LogStore(tmp_path / f"logs{tail_end}", cap=1 << 20, on_append=lambda j: None)
        up = _Uploads()
        up.gate.clear()
        real = up.call

        def upload(route, job_id, *, body, params, real=real):
            real(route, job_id, body=body, params=params)
            store._append(JOB, params["offset"], bytes(body))

        up.call = upload
        sink = LogSink(up, JOB, clock=FakeClock(), batch_bytes=10)
        sink.write(b"0123456789")  # a full batch: the uploader takes it and waits
        wait_until(lambda: sink._chunk is not None and sink.first_at is not None, 10)
        sink.write(b"abcde")
        offset, data = sink.tail(tail_end)
        assert (offset, data) == (0, b"0123456789abcde"[:tail_end])
        store._append(JOB, offset, data)  # the controller stores the report's tail
        sink.tail_stored(offset + len(data))
        up.gate.set()
        assert sink.close(10)
        assert store.read(JOB, 0, 100) == b"0123456789abcde"
        assert sink.lost == 0 and sink.offset == 15


def test_no_tail_is_taken_while_the_spool_holds_the_front(tmp_path):
    """Output that went to the disk spool (the controller was away) is the
    front of the stream: a report takes no tail then, the uploader sends
    it all, in order."""
    from rc.worker.spool import Spool

    clock, up = FakeClock(), _Uploads()
    spool = Spool(str(tmp_path / "spool"), max_bytes=1 << 20)
    sink = LogSink(up, JOB, spool=spool, clock=clock, max_buffer=4, tail_limit=lambda: 100)
    up.gate.clear()
    sink.write(b"abcd")
    sink._set_failing(True)  # as after a failed upload: the uploader retries at once
    wait_until(lambda: sink.first_at is not None and sink._chunk is not None, 10)
    sink.write(b"efgh")  # memory is full and uploads fail: both go to the spool
    assert sink.spilled == 8 and sink.tail(100) is None
    closed = []
    closer = threading.Thread(target=lambda: closed.append(sink.close(30, hand_off=True)))
    closer.start()  # no hand-off with the spool in use: close flushes, as before
    wait_until(lambda: sink.closing, 10, "close to flush")
    assert not sink.handed and closed == []
    up.gate.set()
    closer.join(30)
    assert closed == [True] and up.bytes() == b"abcdefgh" and sink.lost == 0
    spool.close()


def test_tails_race_the_uploader_without_losing_doubling_or_reordering(tmp_path):
    """A writer, the uploader (batches of 64 bytes) and a reporter taking
    and acknowledging tails all at once: the store ends with the stream."""
    store = LogStore(tmp_path / "logs", cap=1 << 30, on_append=lambda j: None)
    one = threading.Lock()  # the controller's per-job append lock (LogStore.append)

    class Direct:
        def call(self, route, job_id, *, body, params):
            assert (route, job_id) == (calls.LOG_APPEND, JOB)
            with one:
                store._append(JOB, params["offset"], bytes(body))

    sink = LogSink(Direct(), JOB, batch_bytes=64, batch_seconds=0.001)
    lines = [b"%06d\n" % i for i in range(3000)]
    done = threading.Event()

    def reporter():
        while not done.wait(0.0005):
            got = sink.tail(200)
            if got is not None:
                with one:
                    end = store._append(JOB, got[0], got[1])[0]
                sink.tail_stored(end)

    t = threading.Thread(target=reporter, daemon=True)
    t.start()
    for line in lines:
        sink.write(line)
    done.set()
    t.join(10)
    assert sink.close(30)
    assert store.read(JOB, 0, 1 << 20) == b"".join(lines)


# -- the reporter ----------------------------------------------------------------


class _Controller:
    """POST /v1/workers/{id}/reports as a Reporter sees it (Client.call),
    storing tails in a real LogStore; `lose` replies are lost after the
    tails were stored (the controller did its work, the worker never hears),
    `refuse` answers every tail with log_error; `old` refuses the fields as
    a controller from before them does."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.bodies: list[dict] = []
        self.lose = 0
        self.refuse = ""
        self.old = False
        self.uploads: list[tuple[int, bytes]] = []

    def call(self, route, *ids, body, params=None):
        if route is calls.LOG_APPEND:
            return self._upload(*ids, body, params)
        assert (route, ids) == (calls.REPORTS, ("box",))
        self.bodies.append(body)
        if self.old and any("log_tail" in r for r in body["reports"]):
            raise ApiError(400, "bad_request", "Reports.reports[0].log_offset is not a known field")
        results = []
        for r in body["reports"]:
            res = {"job_id": r["job_id"], "ok": True}
            if "log_tail" in r:
                if self.refuse:
                    res["log_error"] = self.refuse
                else:
                    data = base64.b64decode(r["log_tail"])
                    res["log_size"] = self.store._append(r["job_id"], r["log_offset"], data)[0]
            results.append(res)
        if self.lose:
            self.lose -= 1
            raise TransportError("the reply was lost")
        return {"results": results}

    def _upload(self, job_id, raw, params):  # the sink's uploads
        assert job_id == JOB
        self.uploads.append((params["offset"], bytes(raw)))
        self.store._append(JOB, params["offset"], bytes(raw))


def _reporter(ctl: _Controller, tail_bytes: int = LOG_TAIL_BYTES):
    done: list[tuple[int, bool]] = []
    rep = Reporter(ctl, "box", lambda j, ok: done.append((j, ok)))  # retries: real 0.2 s
    rep.tail_bytes = tail_bytes
    return rep, done


def _finished_job(ctl: _Controller, out: bytes, rep: Reporter) -> LogSink:
    """A job that printed `out` and ended: its running and terminal reports."""
    sink = LogSink(ctl, JOB, clock=FakeClock(), tail_limit=lambda: rep.tail_bytes)
    sink.write(out)
    assert sink.close(10, hand_off=True)
    rep.submit(Report(JOB, "running", started_at=1.0, log=sink))
    rep.submit(Report(JOB, "succeeded", 0, started_at=1.0, log=sink))
    return sink


def test_a_short_jobs_start_end_and_output_go_in_one_request_with_no_upload(tmp_path):
    ctl = _Controller(LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda j: None))
    rep, done = _reporter(ctl)
    sink = _finished_job(ctl, b"x\n", rep)
    assert rep.drain(10)
    rep.stop()
    [body] = ctl.bodies
    assert body["reports"] == [
        {
            "job_id": JOB,
            "state": "succeeded",
            "exit_code": 0,
            "reason": "",
            "started_at": 1.0,
            "log_offset": 0,
            "log_tail": b64(b"x\n"),
        }
    ]
    sink._thread.join(10)
    assert ctl.uploads == [] and ctl.store.read(JOB, 0, 100) == b"x\n"
    assert done == [(JOB, True)] and sink.offset == 2


def test_a_running_report_carries_the_first_output_and_the_job_keeps_its_sink(tmp_path):
    ctl = _Controller(LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda j: None))
    rep, _ = _reporter(ctl)
    sink = LogSink(ctl, JOB, clock=FakeClock(), tail_limit=lambda: rep.tail_bytes)
    sink.write(b"started\n")
    rep.submit(Report(JOB, "running", started_at=1.0, log=sink))
    assert rep.drain(10)
    [body] = ctl.bodies
    assert body["reports"][0]["log_tail"] == b64(b"started\n")
    assert sink.offset == 8 and sink.tail(100) is None  # acknowledged: gone from memory
    sink.write(b"more\n")  # the job goes on; its sink is its own
    assert sink.close(10) and ctl.uploads == [(8, b"more\n")]
    rep.stop()
    assert ctl.store.read(JOB, 0, 100) == b"started\nmore\n"


def test_a_retried_report_whose_reply_was_lost_neither_loses_nor_doubles_its_tail(tmp_path):
    ctl = _Controller(LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda j: None))
    ctl.lose = 1
    rep, done = _reporter(ctl)
    sink = _finished_job(ctl, b"hello\n", rep)
    assert rep.drain(30)
    rep.stop()
    assert len(ctl.bodies) == 2  # the same report and tail, again
    assert ctl.bodies[0] == ctl.bodies[1]
    sink._thread.join(10)
    assert ctl.store.read(JOB, 0, 100) == b"hello\n"
    assert ctl.uploads == [] and done == [(JOB, True)]


def test_a_refused_tail_falls_back_to_the_uploader(tmp_path):
    ctl = _Controller(LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda j: None))
    ctl.refuse = "logs_not_stored"
    rep, done = _reporter(ctl)
    sink = _finished_job(ctl, b"refused\n", rep)
    assert rep.drain(10)
    rep.stop()
    wait_until(lambda: ctl.uploads == [(0, b"refused\n")], 10, "the uploader's send")
    sink._thread.join(10)
    assert ctl.store.read(JOB, 0, 100) == b"refused\n" and sink.lost == 0
    assert done == [(JOB, True)]


def test_a_controller_that_refuses_the_fields_gets_the_batch_again_without_them(tmp_path):
    ctl = _Controller(LogStore(tmp_path / "logs", cap=1 << 20, on_append=lambda j: None))
    ctl.old = True
    rep, done = _reporter(ctl)
    sink = _finished_job(ctl, b"old\n", rep)
    assert rep.drain(10)
    rep.stop()
    assert [("log_tail" in b["reports"][0]) for b in ctl.bodies] == [True, False]
    assert rep.tail_bytes == 0 and done == [(JOB, True)]
    wait_until(lambda: ctl.uploads == [(0, b"old\n")], 10, "the uploader's send")
    sink._thread.join(10)


def test_without_tails_announced_a_report_carries_none():
    """A controller from before tails says nothing in its registration
    reply: the worker sends no field it would refuse."""
    assert _tail_bytes({"worker_id": "box", "instance": "i", "heartbeat_seconds": 10}) == 0
    assert _tail_bytes({"log_tail_bytes": True}) == 0
    assert _tail_bytes({"log_tail_bytes": LOG_TAIL_BYTES}) == LOG_TAIL_BYTES

    class Recorder:
        def __init__(self) -> None:
            self.bodies: list = []

        def call(self, route, *ids, body, params=None):
            if route is calls.LOG_APPEND:  # the sink's uploads
                return None
            self.bodies.append(body)
            return {"results": [{"job_id": JOB, "ok": True}]}

    ctl = Recorder()
    rep = Reporter(ctl, "box", lambda j, ok: None, clock=FakeClock())
    sink = LogSink(ctl, JOB, clock=FakeClock(), tail_limit=lambda: rep.tail_bytes)
    sink.write(b"x\n")
    rep.submit(Report(JOB, "running", started_at=1.0, log=sink))
    assert rep.drain(10)
    rep.stop()
    assert ctl.bodies and all("log_tail" not in r for b in ctl.bodies for r in b["reports"])
    assert sink.close(10)


# -- the controller's side -----------------------------------------------------


def _running_job(lab: Lab, app, **fields) -> int:
    async def go():
        status, body = await call(
            app, "POST", "/v1/workers/register", {**REG, "protocol": WORKER_PROTOCOL}
        )
        assert status == 200
        assert orjson.loads(body)["log_tail_bytes"] == LOG_TAIL_BYTES
        job_id = (await lab.submit_async(**fields))[0]
        await lab.ctl.kick()
        return job_id

    return lab.run(go())


def _report(lab: Lab, app, reports: list[dict]) -> list[dict]:
    status, body = lab.run(call(app, "POST", REPORTS, {"reports": reports}))
    assert status == 200, body
    return orjson.loads(body)["results"]


@pytest.mark.usefixtures("engine")
def test_the_controller_stores_a_tail_before_the_end_and_a_retry_stores_nothing_twice(lab):
    app = build_app(lab.ctl)
    job = _running_job(lab, app)
    start = {"job_id": job, "state": "running", "started_at": 1.0}
    [res] = _report(lab, app, [{**start, "log_offset": 0, "log_tail": b64(b"one\n")}])
    assert res["ok"] is True and res["log_size"] == 4 and res["log_error"] == ""
    end = {"job_id": job, "state": "succeeded", "exit_code": 0, "started_at": 1.0}
    tail = {"log_offset": 0, "log_tail": b64(b"one\ntwo\n")}  # from before the ack
    for _ in range(2):  # the reply was lost: the same report again
        [res] = _report(lab, app, [{**end, **tail}])
        assert res["log_size"] == 8
    assert lab.ctl.logs.read(job, 0, 100) == b"one\ntwo\n"
    assert lab.job(job).state is JobState.SUCCEEDED
    assert lab.ctl.metrics.log_tails == 3 and lab.ctl.metrics.log_uploads == 0


@pytest.mark.usefixtures("engine")
def test_a_refused_tail_does_not_refuse_its_report(lab):
    app = build_app(lab.ctl)
    job = _running_job(lab, app)
    run = {"job_id": job, "state": "running", "started_at": 1.0}
    cases = [
        ({"log_offset": 5, "log_tail": b64(b"gap")}, "offset_gap"),
        ({"log_offset": 0, "log_tail": b64(b"x" * (LOG_TAIL_BYTES + 1))}, "limit_exceeded"),
        ({"log_offset": 0, "log_tail": "not base64!"}, "bad_request"),
        ({"log_offset": -1, "log_tail": b64(b"x")}, "bad_request"),
    ]
    for fields, code in cases:
        [res] = _report(lab, app, [{**run, **fields}])
        assert res["ok"] is True and res["log_size"] is None and res["log_error"] == code
    [res] = _report(lab, app, [{"job_id": 999, "state": "running", **cases[0][0]}])
    assert res["log_error"] == "not_found"
    assert lab.ctl.logs.read(job, 0, 100) == b"" and lab.job(job).state is JobState.RUNNING


@pytest.mark.usefixtures("engine")
def test_a_tty_jobs_tail_is_refused_as_its_uploads_are(lab):
    app = build_app(lab.ctl)
    job = _running_job(lab, app, stdio=Stdio.TTY)
    tail = {"log_offset": 0, "log_tail": b64(b"secret\n")}
    [res] = _report(lab, app, [{"job_id": job, "state": "running", **tail}])
    assert res["ok"] is True and res["log_error"] == "logs_not_stored"
    assert lab.ctl.logs.size(job) == 0
