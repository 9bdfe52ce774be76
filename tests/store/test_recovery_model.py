"""A hypothesis state machine over the real store with a fake clock: heartbeat,
sweep, register, reboot, proof, clear, fault, drain, kill, beside submits and
completions (docs/design.md#quarantine-and-proof).

Invariants after every step:
- at most one live lease per device, and a device with a live lease is never ready;
- every active job holds exactly one live lease, every live lease an active job;
- a quarantined device always carries a reason;
- terminal job states never change;
- a device never returns to the pool without a proof, a reboot or an admin
  clear, and `fault` never clears without an admin;
- no device is assigned (or ready) while a survivor scan of it is pending or
  dirty: the model leaves survivors on quarantined devices, and `rc clear`
  (its survivor scan pending while scheduling passes run, then the verdict),
  `rc clear --kill` and the worker's re-check (store.workers.recover on a
  proof that is clean only when the model's host has no survivor) return a
  device only once nothing is left on it.
"""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.store import devices, jobs, workers
from rc.controller.submission import validate_submit
from rc.proto.model import JobKind, JobState, RecoveryProof, Role
from rc.proto.wire import DeviceDecl, RegisterRequest, SubmitRequest
from tests.helpers.inprocess import Lab
from tests.helpers.pgcluster import engine_settings

HOSTS = ("h0", "h1")
DEVICES = ("cpu0", "cpu1")
CLEARABLE = {"worker_lost", "lease_expired", "registration"}
PROOFS = {
    "none": RecoveryProof(),
    "clean": RecoveryProof(survivors_checked=True),
    "survivors": RecoveryProof(survivors_checked=True, survivors_found=True),
    "isolated": RecoveryProof(isolated=True),
}
USER = Caller(1, "alice", Role.USER, unix_user="alice")
ADMIN = Caller(2, "admin", Role.ADMIN, unix_user="root")


class FleetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lab = Lab()  # the controller in-process on a fake clock (tests.helpers.inprocess)
        self.ctl = self.lab.ctl
        self.boot = {h: uuid.uuid4().hex for h in HOSTS}
        self.terminal: dict[int, str] = {}
        self.faulted: set[str] = set()
        self.dirty: dict[str, set[int]] = {}
        """Devices with a survivor on them (the model's truth about the host)
        → the jobs whose leases on it were live then (a teardown faults a
        device before its job's lease is released: no other may come)."""
        self.pending: set[str] = set()
        """Devices whose survivor scan (a clear) has not answered yet."""
        self.pending_leases: set[int] = set()
        for h in HOSTS:
            self._register(h, RecoveryProof())

    def teardown(self) -> None:
        self.lab.close()

    def run(self, coro):
        return self.lab.run(coro)

    def write(self, fn, *args):
        return self.lab.write(fn, *args)

    def read(self, fn, *args):
        return self.lab.read(fn, *args)

    # -- observation --------------------------------------------------------

    def devices(self) -> dict[str, tuple[str, str]]:
        return {
            r["id"]: (r["state"], r["quarantine_reason"])
            for r in self.read(lambda tx: tx.all("devices_all"))
        }

    def active_jobs(self) -> list:
        return self.read(lambda tx: tx.all("jobs_active"))

    def guarded(self, allowed, fn, *args):
        """Run a step and check that quarantined devices left quarantine only
        in the ways `allowed(device_id, reason)` permits."""
        before = self.devices()
        result = fn(*args)
        after = self.devices()
        for d, (state, reason) in before.items():
            if state == "unhealthy" and d in after and after[d][0] != "unhealthy":
                assert allowed(d, reason), f"{d} left quarantine ({reason}) by {fn.__name__}"
                if reason == "fault":
                    self.faulted.discard(d)
        return result

    # -- rules -------------------------------------------------------------------

    def _register(self, host: str, proof: RecoveryProof):
        req = RegisterRequest(
            host=host,
            devices=tuple(DeviceDecl(n) for n in DEVICES),
            boot_id=self.boot[host],
            recovery=proof,
            labels={n: {"kind": "cpu"} for n in DEVICES},
        )
        return self.write(workers.register, req, self.ctl.match_cache, self.ctl.thresholds)

    @rule(host=st.sampled_from(HOSTS), reboot=st.booleans(), proof=st.sampled_from(sorted(PROOFS)))
    def register(self, host, reboot, proof):
        if reboot:
            self.boot[host] = uuid.uuid4().hex
            self.dirty = {d: j for d, j in self.dirty.items() if not d.startswith(host + ":")}
        if proof in ("clean", "isolated") and self._dirty_on(host):
            proof = "survivors"  # a worker's scan sees the survivors the model left
        p = PROOFS[proof]

        def allowed(d, reason):
            mine = d.startswith(host + ":")
            return mine and reason in CLEARABLE and (reboot or p.proves())

        self.guarded(allowed, self._register, host, p)

    @rule(host=st.sampled_from(HOSTS), name_all=st.booleans())
    def heartbeat(self, host, name_all):
        named = (
            tuple(r["id"] for r in self.active_jobs() if r["worker_id"] == host) if name_all else ()
        )

        def beat():
            try:
                return self.write(workers.heartbeat, host, named, self.ctl.thresholds)
            except Refused:
                return None

        self.guarded(lambda d, reason: False, beat)

    @rule(
        priority=st.integers(-2, 2),
        pinned=st.sampled_from([None, *[f"{h}:{n}" for h in HOSTS for n in DEVICES]]),
        hold=st.booleans(),
    )
    def submit(self, priority, pinned, hold):
        req = SubmitRequest(
            command=() if hold else ("true",),
            kind=JobKind.HOLD if hold else JobKind.JOB,
            device_id=pinned or "",
            selector="" if pinned else "kind=cpu",
            priority=priority,
            max_runtime_seconds=600 if hold else 0,
            reason="r" if hold else "",
        )
        new = validate_submit(req, USER, self.ctl.cfg.limits)
        try:
            self.guarded(lambda d, r: False, self.write, jobs.enqueue, new, self.ctl.match_cache)
        except Refused:
            pass

    @rule()
    def schedule(self):
        self.guarded(lambda d, r: False, self.run, self.ctl.kick())

    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "killed"]))
    def finish(self, data, outcome):
        active = self.active_jobs()
        if not active:
            return
        r = data.draw(st.sampled_from(active))
        self.guarded(
            lambda d, reason: False,
            self.write,
            jobs.release,
            r["id"],
            r["worker_id"],
            JobState(outcome),
            0,
            "",
            self.lab.now,
        )

    @rule(data=st.data())
    def kill(self, data):
        active = self.active_jobs()
        if not active:
            return
        r = data.draw(st.sampled_from(active))
        self.guarded(lambda d, reason: False, self.write, jobs.kill, r["id"], ADMIN, "")

    @rule(seconds=st.sampled_from([1.0, 20.0, 40.0, 200.0, 400.0, 1000.0]))
    def tick(self, seconds):
        self.lab.now += seconds

    @rule()
    def sweep(self):
        self.guarded(
            lambda d, r: False, self.write, workers.sweep, self.ctl.thresholds, self.ctl.started_at
        )

    @rule(host=st.sampled_from(HOSTS), name=st.sampled_from(DEVICES))
    def fault(self, host, name):
        d = f"{host}:{name}"
        self.guarded(
            lambda dd, r: False, self.write, devices.fault, d, "verify failed: x", None, host
        )
        self.faulted.add(d)

    @rule(host=st.sampled_from(HOSTS), name=st.sampled_from(DEVICES))
    def clear(self, host, name):
        """`rc clear --force`: for a scan that cannot run, on the admin's word
        (the model's admin forces only a device with no survivor on it:
        forcing past one is outside what rc can guarantee)."""
        d = f"{host}:{name}"
        if d in self.dirty:
            return

        def admin_clear():
            try:
                self.write(devices.clear, d, "admin")
            except Refused:
                pass

        self.guarded(lambda dd, r: dd == d, admin_clear)

    # -- survivors, verified clears, the re-check ----------------------------------

    def _dirty_on(self, host: str) -> bool:
        return any(d.startswith(host + ":") for d in self.dirty)

    @rule(host=st.sampled_from(HOSTS), name=st.sampled_from(DEVICES), fault=st.booleans())
    def leave_survivor(self, host, name, fault):
        """A process outlives its job on a device that is out (or, with
        `fault`, a teardown finds one and faults the device as the worker does)."""
        d = f"{host}:{name}"
        if fault:
            detail = "processes of job 7 survived teardown: pid 12 'sleep 301'"
            try:
                self.guarded(lambda dd, r: False, self.write, devices.fault, d, detail, None, host)
            except Refused:  # retired
                return
        if self.devices().get(d, ("", ""))[0] == "unhealthy":
            self.dirty.setdefault(d, set()).update(self._leases().get(d, set()))

    def _leases(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for lease in self.read(lambda tx: tx.all("leases_live")):
            out.setdefault(lease["device_id"], set()).add(lease["job_id"])
        return out

    @rule(data=st.data())
    def survivor_exits(self, data):
        if self.dirty:
            self.dirty.pop(data.draw(st.sampled_from(sorted(self.dirty))))

    @rule(
        host=st.sampled_from(HOSTS),
        name=st.sampled_from(DEVICES),
        kill=st.booleans(),
        passes=st.integers(0, 2),
    )
    def verified_clear(self, host, name, kill, passes):
        """POST /v1/devices/{id}/clear: refused or not first, then the scan is
        pending while the scheduler runs, then its verdict decides."""
        d = f"{host}:{name}"
        try:
            self.read(devices.clearable, d)
        except Refused:
            return
        self.pending.add(d)
        self.pending_leases = self._leases().get(d, set())
        for _ in range(passes):
            self.schedule()
            self.no_assignment_while_pending_or_dirty()
        self.pending.discard(d)
        if kill:
            self.dirty.pop(d, None)
        if d in self.dirty:
            return  # 409 survivors_found: the device stays out

        def admin_clear():
            try:
                self.write(devices.clear, d, "admin", "a survivor scan found nothing")
            except Refused:
                pass

        self.guarded(lambda dd, r: dd == d, admin_clear)

    @rule(host=st.sampled_from(HOSTS))
    def recheck(self, host):
        """The worker's periodic re-check: its scan is clean only when no
        survivor is left on the host."""
        p = PROOFS["survivors" if self._dirty_on(host) else "clean"]

        def allowed(d, reason):
            mine = d.startswith(host + ":")
            return mine and (reason in CLEARABLE or (reason == "fault" and d not in self.faulted))

        self.guarded(allowed, self.write, workers.recover, host, p, self.ctl.thresholds, True)

    @rule(host=st.sampled_from(HOSTS), name=st.sampled_from(DEVICES), on=st.booleans())
    def drain(self, host, name, on):
        d = f"{host}:{name}"
        draining = self.read(lambda tx: tx.one("device_drain_state", (d,)))
        try:
            _, already = self.guarded(
                lambda dd, r: False, self.write, devices.drain, d, on, "", "admin"
            )
        except Refused as e:  # a retired device
            assert e.status == 404 and draining is None, e
        else:  # a no-op says so (and changes nothing); anything else is a real change
            assert draining is not None and already == (bool(draining["draining"]) == on)
            after = self.read(lambda tx: tx.one("device_drain_state", (d,)))
            assert bool(after["draining"]) == on
            if already:
                assert after["drain_reason"] == draining["drain_reason"]

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def leases_and_states_agree(self):
        def check(tx):
            live = tx.all("leases_live")
            per_device: dict[str, int] = {}
            for lease in live:
                per_device[lease["device_id"]] = per_device.get(lease["device_id"], 0) + 1
            assert all(n == 1 for n in per_device.values()), per_device
            for r in tx.all("devices_all"):
                if r["id"] in per_device:
                    assert r["state"] != "ready", f"{r['id']} is ready with a live lease"
                if r["state"] == "unhealthy":
                    assert r["quarantine_reason"], f"{r['id']} quarantined without a reason"
            active = {r["id"] for r in tx.all("jobs_active")}
            leased = [lease["job_id"] for lease in live]
            assert sorted(leased) == sorted(active), (leased, active)
            return [
                (r["id"], r["state"])
                for r in tx.all(
                    "jobs_list",
                    {
                        "device": "",
                        "user": "",
                        "owner": "",
                        "states": "[]",
                        "name": "",
                        "since": 0,
                        "array": 0,
                        "before": 0,
                        "limit": 10000,
                    },
                )
            ]

        for job_id, state in self.read(check):
            if job_id in self.terminal:
                assert state == self.terminal[job_id], f"job {job_id} left {self.terminal[job_id]}"
            elif JobState(state).terminal:
                self.terminal[job_id] = state

    @invariant()
    def no_assignment_while_pending_or_dirty(self):
        states = self.devices()
        leases = self._leases()
        for d in self.pending | set(self.dirty):
            if d in states:
                assert states[d][0] == "unhealthy", (d, states[d], d in self.pending)
                before = self.dirty.get(d, set()) | (
                    self.pending_leases if d in self.pending else set()
                )
                new = leases.get(d, set()) - before
                assert not new, f"{d} was assigned to {new} while a survivor scan is open or dirty"

    @precondition(lambda self: True)
    @invariant()
    def faults_stay_until_an_admin(self):
        states = self.devices()
        for d in self.faulted:
            if d in states:
                assert states[d] == ("unhealthy", "fault"), (d, states[d])


FLEET_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_fleet_machine(engine):
    """The machine on each store engine (the engine fixture, tests/conftest.py)."""
    run_state_machine_as_test(FleetMachine, settings=engine_settings(engine, FLEET_SETTINGS))
