"""A hypothesis state machine over the real store and scheduler, beside a
small pure-Python model of the rules (docs/design.md#testing).

Steps: submits (pinned, selector, priorities, holds, idempotency keys, bad
requests), completions, kills (queued and running, by the owner and by
someone else), a host reboot, the running report, time passing (each
followed by a scheduling tick). After every step the real state must agree
with the model and:
- at most one live lease per device, on the device its job runs on;
- a job only ever lands on a device its target matches (checked against a
  hand-written match table, not rc.proto.selector) whose ceiling allows it;
- a freed device goes to the highest (aged) priority, oldest job that can use
  it (the model's rule; the per-user cap holds a job back);
- no job stays queued while a device it can use is free;
- the queue is shown in scheduling order; terminal states never change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rc.controller.errors import Refused
from rc.controller.store import jobs, views
from rc.proto.model import JobKind, JobState
from tests.inprocess import Lab

# Shrinking a failing run of this machine can take minutes; it is off unless
# RC_HYPOTHESIS_SHRINK=1 (a failure is still replayed from hypothesis's database).
settings.register_profile(
    "rc-scheduler-machine",
    max_examples=50,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[p for p in Phase if p is not Phase.shrink or os.environ.get("RC_HYPOTHESIS_SHRINK")],
)

FLEET = {
    "a": {
        "g0": (3600, {"model": "h100", "vram": "81920M"}),
        "g1": (0, {"model": "h100", "vram": "81920M"}),
    },
    "b": {
        "g0": (600, {"model": "a100", "vram": "40G"}),
        "g1": (7200, {"model": "a100", "vram": "[N/A]"}),
    },
}
CEILING = {f"{h}:{n}": c for h, devs in FLEET.items() for n, (c, _) in devs.items()}
DEVICES = sorted(CEILING)
A, B = {"a:g0", "a:g1"}, {"b:g0", "b:g1"}
MATCHES = {  # written by hand from FLEET: the model's own reading of the selectors
    "*": A | B,
    "model=h100": A,
    "model != h100": B,
    "vram>=40G": A | {"b:g0"},  # [N/A] never matches an ordered comparison
    "vram>40G": A,
    "model=a100, vram<=40G": {"b:g0"},
    "host=b": B,
    "vram < 1T,model >= b": A,  # "h100" >= "b", "a100" < "b"
    "gpu=none": set(),  # matches nothing: refused at submit
}
USERS = ("alice", "bob")
RUNTIMES = (0, 300, 600, 601, 1800, 3600, 3601, 7201, 10000)  # around every ceiling
TARGETS = st.one_of(
    st.tuples(st.just("sel"), st.sampled_from(sorted(MATCHES))),
    st.tuples(st.just("dev"), st.sampled_from(DEVICES + ["c:g9"])),
)


def fits(ask: int, ceiling: int) -> bool:
    return ceiling == 0 or ask == 0 or ask <= ceiling


@dataclass
class MJob:
    id: int
    who: str
    prio: int
    queued_at: float
    targets: frozenset[str]
    ask: int
    state: str = "queued"  # queued | active | done
    device: str = ""

    def eff(self, now: float, aging: float) -> int:
        return self.prio + (int((now - self.queued_at) // aging) if aging > 0 else 0)

    def candidates(self) -> list[str]:
        return sorted(d for d in self.targets if fits(self.ask, CEILING[d]))


class SchedulerMachine(RuleBasedStateMachine):
    """Real Lab on one side, MJob dicts on the other."""

    def __init__(self) -> None:
        super().__init__()
        self.lab: Lab | None = None
        self.jobs: dict[int, MJob] = {}
        self.keys: dict[str, tuple[tuple, int]] = {}
        self.final: dict[int, JobState] = {}
        self.boots = 1

    @initialize(aging=st.sampled_from([60.0, 60.0, 0.0]), cap=st.sampled_from([0, 0, 1]))
    def start(self, aging, cap):
        self.aging, self.cap = aging, cap
        self.lab = Lab(aging=aging, cap=cap)
        for host, devs in FLEET.items():
            self.lab.register(host, devs)

    def teardown(self) -> None:
        if self.lab is not None:
            self.lab.close()

    # -- the model's rule -----------------------------------------------------

    def model_pass(self) -> None:
        busy = {j.device for j in self.jobs.values() if j.state == "active"}
        used = {
            u: sum(1 for j in self.jobs.values() if j.state == "active" and j.who == u)
            for u in USERS
        }
        for j in self.order():
            if self.cap and used[j.who] >= self.cap:
                continue
            free = [d for d in j.candidates() if d not in busy]
            if free:
                j.state, j.device = "active", free[0]
                busy.add(free[0])
                used[j.who] += 1

    def order(self) -> list[MJob]:
        queued = [j for j in self.jobs.values() if j.state == "queued"]
        return sorted(queued, key=lambda j: (-j.eff(self.lab.now, self.aging), j.id))

    def expect_refusal(self, target, prio, kind, ask, who, sig, key) -> tuple[int, str] | None:
        """What the real submit must answer, in its own order of checks."""
        if not -10 <= prio <= 10:
            return 400, "priority_out_of_range"
        if kind is JobKind.HOLD and ask == 0:
            return 400, "bad_request"
        if key is not None and key in self.keys:
            return None if self.keys[key][0] == sig else (409, "idempotency_conflict")
        kind_of, name = target
        if kind_of == "dev":
            if name not in CEILING:
                return 400, "unknown_device"
            if not fits(ask, CEILING[name]):
                return 400, "runtime_above_ceiling"
        else:
            if not MATCHES[name]:
                return 400, "no_matching_device"
            if ask and not any(fits(ask, CEILING[d]) for d in MATCHES[name]):
                return 400, "runtime_above_ceiling"
        return None

    # -- rules -------------------------------------------------------------------

    @rule(
        aim=TARGETS,
        prio=st.integers(-11, 11),
        ask=st.sampled_from(RUNTIMES),
        kind=st.sampled_from([JobKind.JOB, JobKind.JOB, JobKind.HOLD]),
        who=st.sampled_from(USERS),
        key=st.sampled_from([None, None, "k1", "k2"]),
        cmd=st.sampled_from(["true", "false"]),
    )
    def submit(self, aim, prio, ask, kind, who, key, cmd):
        target = aim
        fields = {
            "priority": prio,
            "max_runtime_seconds": ask,
            "kind": kind,
            "idempotency_key": key,
        }
        if target[0] == "dev":
            fields["device_id"] = target[1]
        else:
            fields["selector"] = target[1]
        if kind is JobKind.HOLD:
            fields["reason"] = "looking at it"
        else:
            fields["command"] = (cmd,)
        sig = (target, prio, ask, kind, who, None if kind is JobKind.HOLD else cmd)
        want = self.expect_refusal(target, prio, kind, ask, who, sig, key)
        try:
            job_id, created = self.lab.submit(who, **fields)
        except Refused as e:
            assert want is not None, f"refused {e.code}: {e.message}"
            assert (e.status, e.code) == want, e.message
            return
        assert want is None, f"accepted, expected {want}"
        if key is not None and key in self.keys:
            assert (job_id, created) == (self.keys[key][1], False)
            return
        assert created and job_id not in self.jobs
        targets = MATCHES[target[1]] if target[0] == "sel" else {target[1]}
        self.jobs[job_id] = MJob(job_id, who, prio, self.lab.now, frozenset(targets), ask)
        if key is not None:
            self.keys[key] = (sig, job_id)
        self.model_pass()

    @rule(
        many=st.lists(
            st.tuples(
                st.sampled_from(["*", "model=h100", "vram>=40G", "host=b"]),
                st.integers(-3, 3),
                st.sampled_from(USERS),
            ),
            min_size=2,
            max_size=5,
        )
    )
    def burst(self, many):
        """Several ordinary jobs at once, so queues form and priorities compete."""
        for sel, prio, who in many:
            self.submit(("sel", sel), prio, 0, JobKind.JOB, who, None, "true")

    def _pick(self, data, state: str | None) -> MJob:
        pool = sorted(i for i, j in self.jobs.items() if state is None or j.state == state)
        return self.jobs[data.draw(st.sampled_from(pool))]

    def _has(self, state: str | None) -> bool:
        return any(state is None or j.state == state for j in self.jobs.values())

    @precondition(lambda self: self._has("active"))
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data, ok):
        j = self._pick(data, "active")
        self.lab.finish(j.id, JobState.SUCCEEDED if ok else JobState.FAILED)
        j.state = "done"
        self.model_pass()

    @precondition(lambda self: self._has("active"))
    @rule(data=st.data())
    def report_running(self, data):
        j = self._pick(data, "active")
        worker = self.lab.job(j.id).worker_id
        self.lab.write(jobs.mark_running, j.id, worker, self.lab.now)

    @precondition(lambda self: self._has(None))
    @rule(data=st.data(), owner=st.booleans())
    def kill(self, data, owner):
        j = self._pick(data, None)
        who = j.who if owner else next(u for u in USERS if u != j.who)
        try:
            what = self.lab.kill(j.id, who)
        except Refused as e:
            if not owner:
                assert e.code == "not_job_owner", e.message
            else:
                assert (e.code, j.state) == ("not_cancellable", "done"), e.message
            return
        assert owner and j.state != "done"
        was, j.state = j.state, "done"
        if was == "queued":
            assert what == "cancelled"
        else:
            assert what == "kill requested"
            self.lab.finish(j.id, JobState.KILLED)  # the worker's report
            self.model_pass()

    @rule(host=st.sampled_from(sorted(FLEET)))
    def host_reboots(self, host):
        self.boots += 1
        self.lab.register(host, FLEET[host], boot_id=f"boot-{self.boots}")  # a new boot id
        for j in self.jobs.values():
            if j.state == "active" and j.device.startswith(host + ":"):
                j.state = "done"
        self.model_pass()

    @rule(dt=st.sampled_from([1.0, 30.0, 61.0, 600.0]))
    def time_passes(self, dt):
        self.lab.now += dt
        self.lab.kick()
        self.model_pass()

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        if self.lab is None:
            return
        policy = self.lab.ctl.policy

        def read(tx):  # one consistent snapshot of everything the checks need
            return {
                "jobs": {
                    r["id"]: (r["state"], r["device_id"], r["max_runtime"])
                    for r in tx.all(
                        "jobs_list",
                        {"device": "", "submitter": "", "state": "", "before": 0, "limit": 10_000},
                    )
                },
                "leases": [(r["device_id"], r["job_id"]) for r in tx.all("leases_live")],
                "devices": {r["id"]: r["state"] for r in tx.all("device_slots")},
                "queue": [j.id for j in views.state(tx, policy).queued],
                # positions as rc ps plans them, and as one job's view counts them
                "planned": views.state(tx, policy).queue_positions,
                "counted": {
                    str(j): views.job_view(tx, j, policy).queue_position
                    for j in (r["id"] for r in tx.all("queued_jobs"))
                },
            }

        real = self.lab.read(read)
        self.agrees_with_the_model(real["jobs"])
        self.one_live_lease_per_device(real["leases"], real["devices"])
        self.nothing_waits_beside_a_free_device(real["jobs"], real["leases"], real["devices"])
        # what rc ps shows is the scheduling order
        assert real["queue"] == [j.id for j in self.order()]
        assert real["counted"] == real["planned"]

    def agrees_with_the_model(self, real):
        assert set(real) == set(self.jobs)
        for job_id, (state, device, runtime) in real.items():
            m = self.jobs[job_id]
            s = JobState(state)
            kind = "queued" if s is JobState.QUEUED else "active" if s.active else "done"
            assert kind == m.state, (job_id, state, m)
            if s.terminal:
                assert self.final.setdefault(job_id, s) is s, "a terminal state changed"
            if m.device:  # it landed: only ever where its target matches, ceiling allows
                assert device == m.device, (job_id, device, m.device)
                assert device in m.targets, (job_id, device, m.targets)
                assert fits(m.ask, CEILING[device]), (job_id, device)
                assert runtime == (m.ask or CEILING[device])

    def one_live_lease_per_device(self, leases, states):
        on = [d for d, _ in leases]
        assert len(on) == len(set(on)), leases
        active = {j.id: j.device for j in self.jobs.values() if j.state == "active"}
        assert {j: d for d, j in leases} == active
        for d, state in states.items():
            assert (state == "busy") == (d in on), (d, state)

    def nothing_waits_beside_a_free_device(self, jobs_, leases, states):
        """From the real state: no queued job (not held back by the cap) has a
        usable device that is ready."""
        holders = {j: self.jobs[j].who for _, j in leases}
        used = {u: sum(1 for w in holders.values() if w == u) for u in USERS}
        for job_id, (state, _, _) in jobs_.items():
            m = self.jobs[job_id]
            if state == "queued" and not (self.cap and used[m.who] >= self.cap):
                free = [d for d in m.candidates() if states[d] == "ready"]
                assert not free, (m, free)


SchedulerMachine.TestCase.settings = settings.get_profile("rc-scheduler-machine")
TestScheduler = SchedulerMachine.TestCase
