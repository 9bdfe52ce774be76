"""The real store and scheduler in-process, on a fake clock: submit-time
refusals, ceilings, idempotency, and starvation (issue "Scheduling").

`Lab` drives the real transaction functions the HTTP routes call
(validate_submit → jobs.enqueue, jobs.release, jobs.kill, fleet.register,
Controller.kick) against a real SQLite file; nothing is mocked. Other test
modules (the state machine, explain) import it.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from rc.controller import fleet, jobs, rows, views
from rc.controller.api.jobs import validate_submit
from rc.controller.auth import Caller
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller
from rc.controller.errors import Refused
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN, Job, JobKind, JobState, Role, Stdio
from rc.proto.wire import DeviceDecl, JobExplanation, RegisterRequest, SubmitRequest

T0 = 1_800_000_000.0


class Lab:
    """A Controller (no background loops) over a fresh data dir, fake clock `now`."""

    def __init__(self, data: Path | None = None, *, aging: float = 0.0, cap: int = 0) -> None:
        self._own = data is None
        self.data = Path(data or tempfile.mkdtemp(prefix="rc-lab-"))
        self.now = T0
        self.loop = asyncio.new_event_loop()
        cfg = ControllerConfig(data_dir=str(self.data), aging=aging, max_devices_per_user=cap)
        self.ctl = Controller(cfg, clock=lambda: self.now)
        self.run(self.ctl.start(loops=False))

    def close(self) -> None:
        self.run(self.ctl.stop())
        self.loop.close()
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def write(self, fn, *args):
        return self.run(self.ctl.db.write(fn, *args))

    def read(self, fn, *args):
        return self.run(self.ctl.db.read(fn, *args))

    # -- the fleet -----------------------------------------------------------

    def register(self, host: str, devices: dict[str, tuple[int, dict[str, str]]],
                 boot_id: str = "boot-1") -> None:
        """Register `host` with {name: (ceiling seconds, detected labels)}."""
        req = RegisterRequest(
            host=host,
            boot_id=boot_id,
            devices=tuple(DeviceDecl(name, ceiling) for name, (ceiling, _) in devices.items()),
            labels={name: dict(labels) for name, (_, labels) in devices.items()},
        )
        self.write(fleet.register, req, self.ctl.fleet, self.ctl.thresholds)

    # -- jobs ------------------------------------------------------------------

    def submit(self, who: str = "alice", **fields) -> tuple[int, bool]:
        """validate_submit + enqueue, as POST /v1/jobs does. Returns (id, created);
        raises Refused. A job gets command ("true",) unless given one."""
        if fields.get("kind", JobKind.JOB) is JobKind.JOB:
            fields.setdefault("command", ("true",))
        if not fields.get("device_id"):
            fields.setdefault("selector", "*")
        new = validate_submit(SubmitRequest(**fields), Caller(0, who, Role.USER),
                              self.ctl.cfg.limits)
        return self.write(jobs.enqueue, new, self.ctl.fleet)

    def job(self, job_id: int) -> Job:
        return self.read(lambda tx: rows.job(tx.one("job_get", (job_id,))))

    def finish(self, job_id: int, state: JobState = JobState.SUCCEEDED) -> None:
        """The worker reports the job ended (releases its device; a pass follows)."""
        j = self.job(job_id)
        self.write(jobs.release, job_id, j.worker_id, state, 0, "", None)

    def kill(self, job_id: int, who: str = "alice") -> str:
        return self.write(jobs.kill, job_id, who, False, "")

    def kick(self) -> None:
        self.run(self.ctl.kick())

    def explain(self, job_id: int) -> JobExplanation:
        return self.read(views.explain_job, job_id, self.ctl.policy)

    def running_on(self, device_id: str) -> int | None:
        def q(tx):
            return next((r["job_id"] for r in tx.all("leases_live")
                         if r["device_id"] == device_id), None)
        return self.read(q)


@pytest.fixture
def lab(tmp_path):
    made = []

    def make(**kw) -> Lab:
        lb = Lab(tmp_path / f"lab{len(made)}", **kw)
        made.append(lb)
        return lb

    yield make
    for lb in made:
        lb.close()


def refused(fn, *args, **kw) -> Refused:
    with pytest.raises(Refused) as e:
        fn(*args, **kw)
    return e.value


# ---------------------------------------------------------------- submit-time rules

def two_hosts(lb: Lab) -> None:
    lb.register("a", {"g0": (3600, {"model": "h100", "vram": "81920M"}),
                      "g1": (0, {"model": "h100", "vram": "81920M"})})
    lb.register("b", {"g0": (600, {"model": "a100", "vram": "[N/A]"})})


def test_refused_at_submit_with_the_inventorys_codes(lab):
    lb = lab()
    two_hosts(lb)
    cases = [
        (dict(selector="model=tpu"), 400, "no_matching_device"),
        (dict(selector="vram>=40G,model=a100"), 400, "no_matching_device"),  # [N/A] never
        (dict(device_id="a:g9"), 400, "unknown_device"),
        (dict(device_id="b:g0", max_runtime_seconds=601), 400, "runtime_above_ceiling"),
        (dict(selector="model=a100", max_runtime_seconds=7200), 400, "runtime_above_ceiling"),
        (dict(priority=PRIORITY_MAX + 1), 400, "priority_out_of_range"),
        (dict(priority=PRIORITY_MIN - 1), 400, "priority_out_of_range"),
        (dict(selector="model==h100"), 400, "bad_selector"),
        (dict(kind=JobKind.HOLD, command=("sh",), max_runtime_seconds=60, reason="x"), 400,
         "bad_request"),
        (dict(kind=JobKind.HOLD, cwd="/tmp", max_runtime_seconds=60, reason="x"), 400,
         "bad_request"),
        (dict(kind=JobKind.HOLD, env={"A": "1"}, max_runtime_seconds=60, reason="x"), 400,
         "bad_request"),
        (dict(kind=JobKind.HOLD, idle_timeout_seconds=5, max_runtime_seconds=60, reason="x"),
         400, "bad_request"),
        (dict(kind=JobKind.HOLD, stdio=Stdio.TTY, max_runtime_seconds=60, reason="x"), 400,
         "bad_request"),
        (dict(kind=JobKind.HOLD, max_runtime_seconds=60, reason="  "), 400, "bad_request"),
        (dict(kind=JobKind.HOLD, reason="x"), 400, "bad_request"),  # no ttl
    ]
    for fields, status, code in cases:
        e = refused(lb.submit, **fields)
        assert (e.status, e.code) == (status, code), fields
    e = refused(lb.submit, selector="model=a100", max_runtime_seconds=7200)
    assert "600s" in e.message  # names the highest ceiling
    e = refused(lb.submit, selector="model==h100")
    assert "'model==h100'" in e.message  # names the bad term
    assert lb.read(lambda tx: tx.scalar("count_queued")) == 0
    # a runtime above some ceilings is fine when one candidate allows it: never clamped
    job_id, _ = lb.submit(selector="model=h100", max_runtime_seconds=7200)
    j = lb.job(job_id)
    assert (j.device_id, j.max_runtime_seconds) == ("a:g1", 7200)


def test_a_job_without_a_runtime_inherits_the_ceiling_where_it_lands(lab):
    lb = lab()
    two_hosts(lb)
    pinned, _ = lb.submit(device_id="b:g0")
    sel, _ = lb.submit(selector="vram>=40G")          # lands on a:g0 (first free match)
    own, _ = lb.submit(selector="model=h100", max_runtime_seconds=60)
    assert (lb.job(pinned).device_id, lb.job(pinned).max_runtime_seconds) == ("b:g0", 600)
    assert (lb.job(sel).device_id, lb.job(sel).max_runtime_seconds) == ("a:g0", 3600)
    assert (lb.job(own).device_id, lb.job(own).max_runtime_seconds) == ("a:g1", 60)


def test_a_queued_pinned_job_takes_the_ceiling_its_device_has_when_it_lands(lab):
    lb = lab()
    lb.register("a", {"g0": (3600, {})})
    first, _ = lb.submit(device_id="a:g0")
    queued, _ = lb.submit(device_id="a:g0")
    assert lb.job(queued).max_runtime_seconds == 0  # nothing inherited while queued
    # the host reboots with a lower ceiling: the first job is lost, the device freed
    lb.register("a", {"g0": (1800, {})}, boot_id="boot-2")
    assert lb.job(first).state is JobState.LOST
    j = lb.job(queued)
    assert (j.state, j.max_runtime_seconds) == (JobState.ASSIGNED, 1800)


def test_idempotency(lab):
    lb = lab()
    two_hosts(lb)
    a, created = lb.submit(idempotency_key="k", command=("echo", "1"))
    b, again = lb.submit(idempotency_key="k", command=("echo", "1"))
    assert (a, created, again) == (b, True, False)
    e = refused(lb.submit, idempotency_key="k", command=("echo", "2"))
    assert (e.status, e.code) == (409, "idempotency_conflict")
    e = refused(lb.submit, who="bob", idempotency_key="k", command=("echo", "1"))
    assert (e.status, e.code) == (409, "idempotency_conflict")  # never someone else's job


def test_concurrent_duplicates_make_exactly_one_job(lab):
    lb = lab()
    two_hosts(lb)
    req = validate_submit(SubmitRequest(command=("true",), selector="*", idempotency_key="dup"),
                          Caller(0, "alice", Role.USER), lb.ctl.cfg.limits)

    async def many():
        return await asyncio.gather(*[lb.ctl.db.write(jobs.enqueue, req, lb.ctl.fleet)
                                      for _ in range(25)])

    out = lb.run(many())
    assert len({job_id for job_id, _ in out}) == 1
    assert sum(created for _, created in out) == 1
    assert lb.read(lambda tx: len(tx.all("jobs_list", {"device": "", "submitter": "",
                                                        "state": "", "before": 0,
                                                        "limit": 100}))) == 1


# ---------------------------------------------------------------- starvation

STEP_S = 10.0
AGING_S = 60.0


def stream(lb: Lab, steps: int) -> float | None:
    """One device; an old priority -10 job waits while a stream of priority 10
    jobs arrives, one per STEP_S, each freeing the device as the next arrives.
    Returns how long the old job waited before it started (None: never)."""
    lb.register("a", {"g0": (0, {})})
    running, _ = lb.submit(priority=PRIORITY_MAX)
    old, _ = lb.submit(priority=PRIORITY_MIN)
    start = lb.now
    for _ in range(steps):
        lb.now += STEP_S
        lb.submit(priority=PRIORITY_MAX)
        lb.finish(running)
        running = lb.running_on("a:g0")
        if running == old:
            return lb.now - start
    return None


def test_a_stream_of_high_priority_jobs_does_not_starve_an_old_one(lab):
    waited = stream(lab(aging=AGING_S), steps=400)
    # the aging bound: one step per AGING_S closes the 20-step gap, then the
    # next time the device frees it is the old job's
    bound = (PRIORITY_MAX - PRIORITY_MIN) * AGING_S + STEP_S
    assert waited is not None and waited <= bound, waited


def test_without_aging_the_same_stream_starves_it(lab):
    assert stream(lab(aging=0), steps=150) is None
