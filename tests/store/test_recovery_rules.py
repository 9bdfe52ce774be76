"""The exits from quarantine, rule by rule, the sweeper's thresholds and
startup grace, heartbeat renewal, registration reconciliation and the flap
guard (docs/design.md#quarantine-and-proof and the sections after it), on
the real store with a fake clock."""

from __future__ import annotations

import pytest

from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.store import devices, jobs, workers
from rc.controller.submission import validate_submit
from rc.proto.model import JobState, RecoveryProof, Role
from rc.proto.wire import DeviceDecl, RegisterRequest, SubmitRequest
from tests.helpers.inprocess import Lab

CLEAN = RecoveryProof(survivors_checked=True)
FOUND = RecoveryProof(survivors_checked=True, survivors_found=True)
ISOLATED = RecoveryProof(isolated=True)
NONE = RecoveryProof()


class Fleet(Lab):
    """The controller in-process (tests.helpers.inprocess.Lab) with a host `h` that has
    one device, cpu0; `t` is the fake clock."""

    def __init__(self, tmp_path, **cfg) -> None:
        super().__init__(tmp_path, **cfg)
        self.boot = "boot-1"

    @property
    def t(self) -> float:
        return self.now

    @t.setter
    def t(self, value: float) -> None:
        self.now = value

    w = Lab.write
    r = Lab.read

    def register(self, proof=NONE, boot=None):
        if boot is not None:
            self.boot = boot
        req = RegisterRequest(
            host="h",
            devices=(DeviceDecl("cpu0"),),
            boot_id=self.boot,
            recovery=proof,
            labels={"cpu0": {"kind": "cpu"}},
        )
        return self.w(workers.register, req, self.ctl.match_cache, self.ctl.thresholds)

    def device(self):
        row = self.r(lambda tx: tx.one("device_get", ("h:cpu0",)))
        return row["state"], row["quarantine_reason"]

    def submit(self):
        req = SubmitRequest(command=("sleep", "1"), device_id="h:cpu0")
        new = validate_submit(
            req, Caller(1, "alice", Role.USER, unix_user="alice"), self.ctl.cfg.limits
        )
        job_id, _ = self.w(jobs.enqueue, new, self.ctl.match_cache)
        return job_id

    def job(self, job_id):
        return self.r(lambda tx: tx.one("job_get", (job_id,)))

    def events(self, kind):
        rows = self.r(lambda tx: tx.all("events_since", (0, 0.0, 1000)))
        return [r["text"] for r in rows if r["kind"] == kind]

    def heartbeat(self, named=()):
        return self.w(workers.heartbeat, "h", tuple(named), self.ctl.thresholds)

    def sweep(self):
        return self.w(workers.sweep, self.ctl.thresholds, self.ctl.started_at)

    def quarantine(self, reason):
        """Put h:cpu0 in quarantine for `reason` the way the system does."""
        if reason == "registration":
            self.submit()
            self.register()
        elif reason == "worker_lost":
            self.t += 400
            self.sweep()
        elif reason == "lease_expired":
            self.submit()
            self.t += 301
            self.heartbeat()  # alive, but naming nothing: the lease is not renewed
            self.sweep()
        elif reason == "fault":
            self.w(devices.fault, "h:cpu0", "verify failed: gpu memory errors", None, "h")
        assert self.device() == ("unhealthy", reason), self.device()


@pytest.fixture
def f(tmp_path):
    fl = Fleet(tmp_path, startup_grace=0.0)
    fl.register()
    yield fl
    fl.close()


# -- exits from quarantine ---------------------------------------------------

CLEARABLE = ["worker_lost", "lease_expired", "registration"]


@pytest.mark.parametrize("reason", CLEARABLE)
def test_reboot_returns_a_reboot_clearable_device(f, reason):
    f.quarantine(reason)
    f.register(boot="boot-2")
    assert f.device() == ("ready", "")


@pytest.mark.parametrize("reason", CLEARABLE)
@pytest.mark.parametrize("proof", [CLEAN, ISOLATED], ids=["clean-scan", "isolated"])
def test_proof_returns_a_reboot_clearable_device(f, reason, proof):
    f.quarantine(reason)
    f.register(proof)
    assert f.device() == ("ready", "")
    [text] = f.events("device_recovered")
    assert text == f"was quarantined for {reason}; {proof.summary()}"


@pytest.mark.parametrize("reason", CLEARABLE)
@pytest.mark.parametrize("proof", [NONE, FOUND], ids=["no-proof", "survivors-found"])
def test_no_proof_keeps_the_device_out(f, reason, proof):
    f.quarantine(reason)
    f.register(proof)
    assert f.device() == ("unhealthy", reason)
    assert f.events("device_recovered") == []


@pytest.mark.parametrize("how", ["reboot", "clean-scan", "isolated"])
def test_fault_never_clears_without_an_admin(f, how):
    f.quarantine("fault")
    if how == "reboot":
        f.register(boot="boot-2")
    else:
        f.register(CLEAN if how == "clean-scan" else ISOLATED)
    f.heartbeat()
    assert f.device() == ("unhealthy", "fault")
    f.w(devices.clear, "h:cpu0", "admin")
    assert f.device() == ("ready", "")
    assert f.events("device_cleared") == ["cleared by admin (was quarantined for fault)"]


def test_fault_overrides_a_clearable_reason_but_not_the_reverse(f):
    f.quarantine("worker_lost")
    f.w(devices.fault, "h:cpu0", "acquire hook failed", None, "h")
    assert f.device() == ("unhealthy", "fault")
    f.t += 400
    f.sweep()
    assert f.device() == ("unhealthy", "fault")


def test_silence_never_promotes_a_device(f):
    f.quarantine("worker_lost")
    for _ in range(5):
        f.t += 60
        f.sweep()
        f.heartbeat()
    assert f.device() == ("unhealthy", "worker_lost")


def test_clear_refuses_a_noop_and_a_live_lease(f):
    with pytest.raises(Refused) as e:
        f.w(devices.clear, "h:cpu0", "admin")
    assert e.value.code == "device_not_cleared"
    job_id = f.submit()
    f.w(devices.fault, "h:cpu0", "bad", job_id, "h")
    with pytest.raises(Refused, match="live lease"):
        f.w(devices.clear, "h:cpu0", "admin")


def test_flap_guard_waits_for_a_human_after_three_recoveries(f):
    for i in range(3):
        f.quarantine("registration")
        f.register(CLEAN)
        assert f.device() == ("ready", ""), i
        f.t += 60
    f.quarantine("registration")
    f.register(CLEAN)
    assert f.device() == ("unhealthy", "registration")
    assert len(f.events("device_recovered")) == 3
    assert f.events("recovery_refused")
    f.t += 3601  # the window slides
    f.register(CLEAN)
    assert f.device() == ("ready", "")


def test_a_refused_recovery_is_recorded_once_per_quarantine(f):
    """Found by a new user: each registration presenting its proof again
    recorded the same refusal once more."""
    for _ in range(3):
        f.quarantine("registration")
        f.register(CLEAN)
        f.t += 60
    f.quarantine("registration")
    for _ in range(3):
        f.register(CLEAN)
        f.t += 10
    assert f.device() == ("unhealthy", "registration")
    assert f.events("recovery_refused") == [
        "recovered 3 times within 1h; waiting for an admin (rc clear)"
    ]
    f.w(devices.clear, "h:cpu0", "admin")
    f.quarantine("registration")  # a new quarantine: a new refusal is worth saying
    f.register(CLEAN)
    assert len(f.events("recovery_refused")) == 2


# -- the sweeper --------------------------------------------------------------


def test_unknown_after_30s_then_worker_lost_after_5m(f):
    job_id = f.submit()
    f.t += 31
    f.sweep()
    assert f.device() == ("unknown", "")
    f.t += 270
    f.sweep()
    assert f.device() == ("unhealthy", "worker_lost")
    job = f.job(job_id)
    assert job["state"] == "lost" and job["kill_reason"] == "worker lost"
    assert f.events("worker_lost") and f.events("job_lost")


def test_unknown_device_returns_on_heartbeat(f):
    f.t += 31
    f.sweep()
    assert f.device() == ("unknown", "")
    f.heartbeat()
    assert f.device() == ("ready", "")


def test_lapsed_lease_quarantines_and_loses_the_job(f):
    job_id = f.submit()
    f.t += 250
    f.heartbeat()  # names nothing
    f.t += 51
    f.heartbeat()
    f.sweep()
    assert f.device() == ("unhealthy", "lease_expired")
    assert f.job(job_id)["state"] == "lost"
    assert f.job(job_id)["kill_reason"] == "lease expired"


def test_heartbeat_renews_only_named_jobs_of_that_worker(f):
    job_id = f.submit()
    for _ in range(5):
        f.t += 200
        f.heartbeat([job_id])
        f.sweep()
    assert f.job(job_id)["state"] == "assigned"
    # another worker naming this job renews nothing
    other = RegisterRequest(host="g", devices=(DeviceDecl("cpu0"),), boot_id="x")
    f.w(workers.register, other, f.ctl.match_cache, f.ctl.thresholds)
    for _ in range(5):
        f.t += 200
        f.heartbeat([job_id])  # h still alive ...
        f.w(workers.heartbeat, "g", (job_id,), f.ctl.thresholds)
    assert f.job(job_id)["state"] == "assigned"
    stop = f.w(workers.heartbeat, "g", (job_id,), f.ctl.thresholds)
    assert stop == [job_id]  # not g's job: g is told to stop it


def test_startup_grace_expires_nothing(tmp_path):
    fl = Fleet(tmp_path, startup_grace=30.0)
    try:
        fl.register()
        job_id = fl.submit()
        fl.t += 1000  # as if the controller had been down for a long time
        fl.ctl.started_at = fl.t
        fl.sweep()
        assert fl.job(job_id)["state"] == "assigned"
        assert fl.device()[0] == "unknown"  # demotion still happens
        fl.heartbeat([job_id])
        fl.t += 31
        fl.sweep()
        assert fl.job(job_id)["state"] == "assigned"
    finally:
        fl.close()


# -- registration -------------------------------------------------------------


def test_reregistration_loses_in_flight_jobs(f):
    job_id = f.submit()
    f.register()
    job = f.job(job_id)
    assert job["state"] == "lost" and job["kill_reason"] == "worker re-registered"
    assert f.device() == ("unhealthy", "registration")


def test_reboot_loses_in_flight_jobs_and_readies_their_devices(f):
    job_id = f.submit()
    f.register(boot="boot-2")
    assert f.job(job_id)["kill_reason"] == "host rebooted"
    assert f.device() == ("ready", "")


def test_a_first_boot_id_is_not_a_reboot(tmp_path):
    fl = Fleet(tmp_path, startup_grace=0.0)
    try:
        fl.boot = ""
        fl.register()
        fl.submit()
        fl.register(boot="boot-9")
        assert fl.device() == ("unhealthy", "registration")
    finally:
        fl.close()


# -- retention mode ---------------------------------------------------------------


def test_retention_keeps_jobs_of_silent_workers(tmp_path):
    fl = Fleet(tmp_path, startup_grace=0.0, retain_disconnected_jobs=True)
    try:
        fl.register()
        job_id = fl.submit()
        fl.t += 2000
        fl.sweep()
        assert fl.device() == ("unhealthy", "worker_lost")
        assert fl.job(job_id)["state"] == "assigned"
        fl.heartbeat([job_id])
        assert fl.device() == ("busy", "")
        fl.w(jobs.release, job_id, "h", JobState.SUCCEEDED, 0, "", None)
        assert fl.device() == ("ready", "")
    finally:
        fl.close()


def test_retention_kill_of_a_silent_workers_job_finalizes_now(tmp_path):
    fl = Fleet(tmp_path, startup_grace=0.0, retain_disconnected_jobs=True)
    try:
        fl.register()
        job_id = fl.submit()
        fl.t += 31
        fl.sweep()
        assert fl.device() == ("unknown", "")
        fl.w(jobs.kill, job_id, Caller(1, "alice", Role.USER, unix_user="alice"), "", True)
        assert fl.job(job_id)["state"] == "killed"
        # the worker comes back still running it: told to stop, device not freed yet
        assert fl.heartbeat([job_id]) == [job_id]
        assert fl.device() == ("unknown", "")
        fl.heartbeat([])
        assert fl.device() == ("ready", "")
    finally:
        fl.close()


def test_the_same_worker_process_registering_again_keeps_its_jobs(f):
    def register(instance, running=()):
        req = RegisterRequest(
            host="h",
            devices=(DeviceDecl("cpu0"),),
            boot_id=f.boot,
            instance=instance,
            running_job_ids=tuple(running),
        )
        f.w(workers.register, req, f.ctl.match_cache, f.ctl.thresholds)

    register("proc-1")
    job_id = f.submit()  # assigned, never handed out
    register("proc-1")  # e.g. after a controller restart
    assert f.job(job_id)["state"] == "assigned"
    assert f.device() == ("busy", "")
    register("proc-2")  # a restarted worker: the job may have run
    assert f.job(job_id)["state"] == "lost"
    assert f.device() == ("unhealthy", "registration")


def test_the_same_process_keeps_a_running_job_it_names(f):
    def register(instance, running=()):
        req = RegisterRequest(
            host="h",
            devices=(DeviceDecl("cpu0"),),
            boot_id=f.boot,
            instance=instance,
            running_job_ids=tuple(running),
        )
        f.w(workers.register, req, f.ctl.match_cache, f.ctl.thresholds)

    register("proc-1")
    job_id = f.submit()
    f.w(jobs.mark_running, job_id, "h", f.t)
    register("proc-1", [job_id])
    assert f.job(job_id)["state"] == "running"
    register("proc-1", [])  # running but not named: unknown fate
    assert f.job(job_id)["state"] == "lost"


def test_a_restarted_controller_hands_out_nothing_until_the_worker_speaks(tmp_path):
    """Found by a new user: after `rc down; rc up -d`, a job went to a device of
    the dead worker (still "ready" in the records) and was lost when the new
    worker registered."""
    fl = Fleet(tmp_path, startup_grace=0.0)
    fl.register()
    assert fl.device() == ("ready", "")
    fl.close()
    fl = Fleet(tmp_path, startup_grace=0.0)  # the controller restarts
    try:
        assert fl.device() == ("unknown", "")
        job_id = fl.submit()
        fl.run(fl.ctl.kick())
        assert fl.job(job_id)["state"] == "queued"  # not handed to a silent worker
        fl.heartbeat()
        assert fl.device()[0] == "busy"  # the worker spoke: the job goes
    finally:
        fl.close()


# -- the worker's periodic re-check (POST /v1/workers/{id}/recheck) ------------


def recheck(f, proof=CLEAN):
    return f.w(workers.recover, "h", proof, f.ctl.thresholds, True)


@pytest.mark.parametrize(
    "detail",
    [
        "processes of job 7 survived teardown: pid 12 'sleep 300'",
        "GPU GPU-1 still has compute processes: pid 12 'python' (300 MiB)",
    ],
)
def test_a_clean_recheck_returns_a_device_faulted_for_survivors(f, detail):
    f.w(devices.fault, "h:cpu0", detail, None, "h")
    assert recheck(f, FOUND) == [] and f.device() == ("unhealthy", "fault")
    assert recheck(f) == ["h:cpu0"] and f.device() == ("ready", "")
    (text,) = f.events("device_recovered")
    assert text == (
        "was quarantined for fault; a scan of every process found none left from an "
        "earlier job (the worker's periodic re-check)"
    )


@pytest.mark.parametrize(
    "detail", ["verify failed: ecc", "acquire hook failed", "cannot check that GPU G is empty"]
)
def test_a_recheck_never_returns_a_fault_that_is_not_survivors(f, detail):
    f.w(devices.fault, "h:cpu0", detail, None, "h")
    assert recheck(f) == [] and f.device() == ("unhealthy", "fault")


def test_the_recheck_is_held_to_the_flap_guard(f):
    for _ in range(3):
        f.w(devices.fault, "h:cpu0", "processes of job 7 survived teardown: pid 1 'x'", None, "h")
        assert recheck(f) == ["h:cpu0"]
        f.t += 60
    f.quarantine("registration")
    assert recheck(f) == [] and f.device() == ("unhealthy", "registration")
    assert f.events("recovery_refused")


def test_a_verify_failure_after_survivors_keeps_the_device_for_an_admin(f):
    """A fault over a fault kept the first detail, so a survivors fault later
    hit by a failed verify script still looked like survivors alone, and a
    clean re-check returned a device no scan can vouch for."""
    f.w(devices.fault, "h:cpu0", "processes of job 7 survived teardown: pid 1 'x'", None, "h")
    f.w(devices.fault, "h:cpu0", "verify failed: ecc", None, "h")
    assert recheck(f) == [] and f.device() == ("unhealthy", "fault")
