"""A hypothesis state machine over the real store and scheduler, beside a
small pure-Python model of the rules (docs/design.md#testing; README
"Order: priority, first come first served, aging, the per-user cap" and
"Several devices for one job").

Steps: submits (pinned to one device or to a list, selector jobs of 1..5
devices, priorities, holds, idempotency keys, bad requests), completions,
kills (queued and running, by the owner and by someone else), a host
reboot, the running report, a GPU health fault of a free device, a
hardware failure of an active job (its device faulted, the report naming
it: a selector job goes back to the queue in its old place, at most 3
times, never again onto that device), time passing (each followed by a
scheduling tick). After every step the real state must agree with the model and:
- at most one live lease per device; a job's live leases are exactly its
  devices, all on one host (granted together, released together);
- a job only ever lands on devices its target matches (checked against a
  hand-written match table, not rc.proto.selector) whose ceilings allow it;
- devices go to jobs in the model's order and by its rules: highest (aged)
  priority, oldest first; the host with the fewest free candidates, then
  one left partly used, then the lowest ids; a job that cannot be placed
  reserves the devices expected free soonest, and a later job takes a
  reserved device only when its bound ends before they are expected free;
  the per-user cap counts devices;
- no queued job has enough free, unreserved devices on one host;
- the queue is shown in scheduling order; terminal states never change;
- a device with an open fault (a GPU health rule's) is never assigned nor
  reserved, and a reboot does not return it;
- a job requeued after a hardware failure holds no lease while queued and
  never lands on a device excluded for it.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rc.controller.errors import Refused
from rc.controller.store import devices as store_devices
from rc.controller.store import jobs, views
from rc.proto.model import RESTARTS_MAX, JobKind, JobState
from rc.proto.wire import JobReport
from tests.helpers.inprocess import Lab
from tests.helpers.pgcluster import engine_settings

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
    "c": {  # a wider host without topology, as CPU devices are
        "d0": (0, {"model": "cpu"}),
        "d1": (0, {"model": "cpu"}),
        "d2": (1800, {"model": "cpu"}),
        "d3": (1800, {"model": "cpu"}),
    },
}
CEILING = {f"{h}:{n}": c for h, devs in FLEET.items() for n, (c, _) in devs.items()}
DEVICES = sorted(CEILING)
HOSTS = {h: [f"{h}:{n}" for n in sorted(devs)] for h, devs in FLEET.items()}
A, B, C = set(HOSTS["a"]), set(HOSTS["b"]), set(HOSTS["c"])
MATCHES = {  # written by hand from FLEET: the model's own reading of the selectors
    "*": A | B | C,
    "model=h100": A,
    "model != h100": B | C,
    "vram>=40G": A | {"b:g0"},  # [N/A] never matches an ordered comparison; c has no vram
    "vram>40G": A,
    "model=a100, vram<=40G": {"b:g0"},
    "host=b": B,
    "host=c": C,
    "vram < 1T,model >= b": A,  # "h100" >= "b", "a100" < "b"
    "gpu=none": set(),  # matches nothing: refused at submit
}
USERS = ("alice", "bob")
RUNTIMES = (0, 300, 600, 601, 1800, 3600, 3601, 7201, 10000)  # around every ceiling
TARGETS = st.one_of(
    st.tuples(st.just("sel"), st.sampled_from(sorted(MATCHES))),
    st.tuples(st.just("dev"), st.sampled_from(DEVICES + ["c:g9"])),
    st.tuples(  # a pinned list: maybe spanning hosts, with a device twice, or unknown
        st.just("pins"),
        st.one_of(
            st.sampled_from(sorted(HOSTS)).flatmap(
                lambda h: st.lists(st.sampled_from(HOSTS[h]), min_size=2, max_size=4, unique=True)
            ),
            st.lists(st.sampled_from(DEVICES + ["c:g9"]), min_size=2, max_size=3),
        ).map(tuple),
    ),
)
COUNTS = st.sampled_from([1, 1, 1, 2, 2, 3, 4, 5])


def fits(ask: int, ceiling: int) -> bool:
    return ceiling == 0 or ask == 0 or ask <= ceiling


def natural(d: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", d))


def host(d: str) -> str:
    return d.partition(":")[0]


@dataclass
class MJob:
    id: int
    who: str
    prio: int
    queued_at: float
    targets: frozenset[str]  # a selector's matches; for pins, the pins
    ask: int
    count: int
    pins: tuple[str, ...] = ()
    state: str = "queued"  # queued | active | done
    devices: tuple[str, ...] = ()
    runtime: int = 0  # the bound it got when assigned (0: none)
    since: float = 0.0  # assigned, then reported running
    running: bool = False
    kind: JobKind = JobKind.JOB
    restarts: int = 0  # requeued after a hardware failure
    excluded: frozenset[str] = frozenset()  # the faulty devices of its earlier runs

    def eff(self, now: float, aging: float) -> int:
        return self.prio + (int((now - self.queued_at) // aging) if aging > 0 else 0)

    def candidates(self) -> list[str]:
        pool = self.pins or sorted(self.targets, key=natural)
        return [d for d in pool if fits(self.ask, CEILING[d]) and d not in self.excluded]

    def end(self) -> float:
        return self.since + self.runtime if self.runtime else math.inf


class ModelPass:
    """One pass of the model's rule over SchedulerMachine `m`: the free
    devices, and what the pass took and reserved so far (m.reservations is
    rebuilt)."""

    def __init__(self, m: SchedulerMachine) -> None:
        self.m = m
        self.now = m.lab.now
        active = [j for j in m.jobs.values() if j.state == "active"]
        self.busy = {d: j for j in active for d in j.devices}
        self.free = {d for d in DEVICES if d not in self.busy and d not in m.faulted}
        self.taken_end: dict[str, float] = {}
        self.used = {u: sum(len(j.devices) for j in active if j.who == u) for u in USERS}
        self.reserved: dict[str, float] = {}  # device → when its reserver expects it free
        m.reservations = {}

    def end(self, d: str) -> float:
        """When device `d` is expected free."""
        if d in self.taken_end:
            return self.taken_end[d]
        return self.now if d in self.free else self.busy[d].end()

    def avail(self, j: MJob, d: str) -> bool:
        """Whether `j` may take `d` now (free, and not reserved unless it ends first)."""
        if d not in self.free:
            return False
        if d not in self.reserved:
            return True
        bound = j.ask or CEILING[d]
        return bound > 0 and self.now + bound <= self.reserved[d]

    def place(self, j: MJob, cands: list[str]) -> tuple[str, ...] | None:
        """The devices `j` gets now, or None."""
        if j.pins:
            if len(cands) == len(j.pins) and all(self.avail(j, d) for d in j.pins):
                return j.pins
            return None
        options = []
        for h, on_host in HOSTS.items():
            ds = [d for d in cands if host(d) == h and self.avail(j, d)]
            if len(ds) >= j.count:
                intact = all(d in self.free for d in on_host)
                pick = tuple(ds[: j.count])
                options.append(
                    (
                        (
                            len(ds),
                            len(on_host) if intact else 0,
                            [natural(d) for d in pick],
                        ),
                        pick,
                    )
                )
        if options:
            return min(options)[1]
        return None

    def reserve(self, j: MJob, cands: list[str]) -> None:
        """`j` reserves the devices of the host where `count` of its
        candidates free soonest."""
        best = None
        for h in HOSTS:
            pool = [
                d
                for d in cands
                if host(d) == h and d not in self.reserved and d not in self.m.faulted
            ]
            if len(pool) < j.count or (j.pins and len(pool) < len(j.pins)):
                continue
            soonest = sorted(pool, key=lambda d: (self.end(d), natural(d)))[: j.count]
            start = max(self.end(d) for d in soonest)
            if best is None or (start, h) < best[0]:
                best = ((start, h), j.pins or tuple(sorted(soonest, key=natural)))
        if best is not None:
            self.m.reservations[j.id] = (tuple(best[1]), best[0][0])
            for d in best[1]:
                self.reserved[d] = best[0][0]

    def take(self, j: MJob, chosen: tuple[str, ...]) -> None:
        """`j` runs on `chosen` from now."""
        ceilings = [CEILING[d] for d in chosen if CEILING[d]]
        j.state, j.devices, j.since, j.running = "active", tuple(chosen), self.now, False
        j.runtime = j.ask or min(ceilings, default=0)
        self.used[j.who] += len(chosen)
        for d in chosen:
            self.free.discard(d)
            self.taken_end[d] = j.end()


class SchedulerMachine(RuleBasedStateMachine):
    """Real Lab on one side, MJob dicts on the other."""

    def __init__(self) -> None:
        super().__init__()
        self.lab: Lab | None = None
        self.jobs: dict[int, MJob] = {}
        self.keys: dict[tuple[str, str], tuple[tuple, int]] = {}  # (who, key) → (sig, id)
        self.reservations: dict[int, tuple[tuple[str, ...], float]] = {}
        self.final: dict[int, JobState] = {}
        self.boots = 1
        self.faulted: set[str] = set()

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
        """The model's pass: each queued job in order is placed, else (on
        several devices) reserves where its candidates free soonest."""
        p = ModelPass(self)
        for j in self.order():
            if self.cap and p.used[j.who] + j.count > self.cap:
                continue
            cands = j.candidates()
            chosen = p.place(j, cands)
            if chosen is None and j.count >= 2:
                p.reserve(j, cands)  # where `count` of its candidates free soonest
                continue
            if chosen is None:  # a one-device job reserves nothing
                continue
            p.take(j, chosen)

    def order(self) -> list[MJob]:
        queued = [j for j in self.jobs.values() if j.state == "queued"]
        return sorted(queued, key=lambda j: (-j.eff(self.lab.now, self.aging), j.id))

    def expect_refusal(
        self, target, prio, kind, ask, who, sig, key, count
    ) -> tuple[int, str] | None:
        """What the real submit must answer, in its own order of checks."""
        kind_of, name = target
        pins = (name,) if kind_of == "dev" else name if kind_of == "pins" else ()
        if not 1 <= count <= 64:
            return 400, "bad_request"
        if pins:
            if len(set(pins)) < len(pins) or len({host(d) for d in pins}) > 1:
                return 400, "bad_request"
            if count not in (1, len(pins)):
                return 400, "bad_request"
            count = len(pins)
        if self.cap and count > self.cap:
            return 400, "limit_exceeded"
        if not -10 <= prio <= 10:
            return 400, "priority_out_of_range"
        if kind is JobKind.HOLD and ask == 0:
            return 400, "bad_request"
        if key is not None and (who, key) in self.keys:  # keys are per owner
            return None if self.keys[(who, key)][0] == sig else (409, "idempotency_conflict")
        if pins:
            for d in pins:
                if d not in CEILING:
                    return 400, "unknown_device"
                if not fits(ask, CEILING[d]):
                    return 400, "runtime_above_ceiling"
        else:
            matching = MATCHES[name]
            if not matching or max(len(matching & set(ds)) for ds in HOSTS.values()) < count:
                return 400, "no_matching_device"
            fitting = {d for d in matching if fits(ask, CEILING[d])}
            if ask and max(len(fitting & set(ds)) for ds in HOSTS.values()) < count:
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
        count=COUNTS,
    )
    def submit(self, aim, prio, ask, kind, who, key, cmd, count=1):
        target = aim
        fields = {
            "priority": prio,
            "max_runtime_seconds": ask,
            "kind": kind,
            "idempotency_key": key,
            "count": count,
        }
        if target[0] == "dev":
            fields["device_id"] = target[1]
        elif target[0] == "pins":
            fields["device_ids"] = target[1]
            if count > 1:  # as -n with -d: the length, or (a usage error) another
                fields["count"] = count = len(target[1]) if count % 2 else count
        else:
            fields["selector"] = target[1]
        if kind is JobKind.HOLD:
            fields["reason"] = "looking at it"
        else:
            fields["command"] = (cmd,)
        sig = (target, prio, ask, kind, who, None if kind is JobKind.HOLD else cmd, count)
        want = self.expect_refusal(target, prio, kind, ask, who, sig, key, count)
        try:
            job_id, created = self.lab.submit(who, **fields)
        except Refused as e:
            assert want is not None, f"refused {e.code}: {e.message}"
            assert (e.status, e.code) == want, e.message
            return
        assert want is None, f"accepted, expected {want}"
        if key is not None and (who, key) in self.keys:
            assert (job_id, created) == (self.keys[(who, key)][1], False)
            return
        assert created and job_id not in self.jobs
        pins = (target[1],) if target[0] == "dev" else target[1] if target[0] == "pins" else ()
        targets = frozenset(MATCHES[target[1]]) if target[0] == "sel" else frozenset(pins)
        self.jobs[job_id] = MJob(
            job_id,
            who,
            prio,
            self.lab.now,
            targets,
            ask,
            len(pins) or count,
            tuple(pins),
            kind=kind,
        )
        if key is not None:
            self.keys[(who, key)] = (sig, job_id)
        self.model_pass()

    @rule(
        many=st.lists(
            st.tuples(
                st.sampled_from(["*", "model=h100", "vram>=40G", "host=b", "host=c"]),
                st.integers(-3, 3),
                st.sampled_from(USERS),
                st.sampled_from([1, 1, 1, 2, 3]),
                st.sampled_from([0, 0, 300, 1800]),
            ),
            min_size=2,
            max_size=5,
        )
    )
    def burst(self, many):
        """Several ordinary jobs at once, so queues form, priorities compete and
        wide jobs wait among narrow ones."""
        for sel, prio, who, count, ask in many:
            self.submit(("sel", sel), prio, ask, JobKind.JOB, who, None, "true", count)

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
        if not j.running:  # a second report changes nothing
            j.running, j.since = True, self.lab.now
        # its expected end moved to its real start: a reservation may start
        # later, and a bounded job may fit before it (the scheduling tick)
        self.lab.kick()
        self.model_pass()

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
            # a cancelled job gives up its reservation: a pass runs (a job
            # behind it may start on the devices it had reserved)
            self.model_pass()
        else:
            assert what == "kill requested"
            self.lab.finish(j.id, JobState.KILLED)  # the worker's report
            self.model_pass()

    @rule(host=st.sampled_from(sorted(FLEET)))
    def host_reboots(self, host):
        self.boots += 1
        self.lab.register(host, FLEET[host], boot_id=f"boot-{self.boots}")  # a new boot id
        for j in self.jobs.values():
            if j.state == "active" and j.devices[0].startswith(host + ":"):
                j.state = "done"
        self.model_pass()

    @rule(data=st.data())
    def health_fault(self, data):
        """A GPU health rule faults a device no job holds (rc.worker.health):
        out of the pool until an admin clears it (a reboot does not)."""
        busy = {d for j in self.jobs.values() if j.state == "active" for d in j.devices}
        pool = [d for d in DEVICES if d not in busy and d not in self.faulted]
        if not pool:
            return
        d = data.draw(st.sampled_from(pool))
        why = f"health: xid-79 on {d}: GPU has fallen off the bus (kernel: NVRM: Xid 79)"
        self.lab.write(store_devices.fault, d, why, None, host(d))
        self.faulted.add(d)
        self.lab.kick()
        self.model_pass()

    @precondition(lambda self: self._has("active"))
    @rule(data=st.data())
    def hardware_failure(self, data):
        """An Xid on one GPU of an active job: the worker faults the device,
        then reports the job failed by the hardware (rc.worker.health). A
        selector job restarted fewer than RESTARTS_MAX times goes back to
        the queue in its old place, never again onto that device; a pinned
        job or a hold ends."""
        j = self._pick(data, "active")
        d = data.draw(st.sampled_from(j.devices))
        worker = self.lab.job(j.id).worker_id
        why = f"health: xid-79 on {d}: GPU has fallen off the bus (kernel: NVRM: Xid 79)"
        self.lab.write(store_devices.fault, d, why, j.id, host(d))
        self.faulted.add(d)
        cause = f"Xid 79 on {d}: GPU has fallen off the bus"
        report = JobReport(
            j.id, JobState.FAILED, 1, f"cause: hardware ({cause})", None, cause, (d,)
        )
        [(_, code, msg)] = self.lab.write(jobs.apply_reports, worker, [report]).results
        assert not code, msg
        if j.kind is JobKind.JOB and not j.pins and j.restarts < RESTARTS_MAX:
            j.state, j.devices, j.running = "queued", (), False
            j.restarts += 1
            j.excluded = j.excluded | {d}
        else:
            j.state = "done"
        self.lab.kick()
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
            snap = views.plan_snapshot(tx, policy)
            return {
                "jobs": {
                    r["id"]: (r["state"], tuple(json.loads(r["device_ids"])), r["max_runtime"])
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
                            "limit": 10_000,
                        },
                    )
                },
                "leases": [(r["device_id"], r["job_id"]) for r in tx.all("leases_live")],
                "devices": {r["id"]: r["state"] for r in tx.all("device_slots")},
                "queue": [j.id for j in views.state(tx, policy).queued],
                # positions as rc ps plans them, and as one job's view counts them
                "planned": views.state(tx, policy).queue_positions,
                "counted": {
                    str(j): views.job_view(tx, j, policy).queue_position
                    for j in (r["id"] for r in tx.all("queued_jobs", {"now": tx.now}))
                },
                "reservations": {
                    j: (r.devices, r.start_at) for j, r in snap.plan.reservations.items()
                },
                "reserved": dict(snap.plan.reserved),
                "assignable": list(snap.plan.assignments),
                "capped": set(snap.plan.capped),
            }

        real = self.lab.read(read)
        for d in self.faulted:  # an open fault: out, never assigned, never reserved
            assert real["devices"][d] == "unhealthy", (d, real["devices"][d])
            assert d not in real["reserved"], d
        self.agrees_with_the_model(real["jobs"])
        self.leases_go_with_their_job(real["leases"], real["devices"])
        self.nothing_waits_beside_enough_free_devices(real)
        # what rc ps shows is the scheduling order; what it reserves is the model's
        assert real["queue"] == [j.id for j in self.order()]
        assert real["counted"] == real["planned"]
        assert real["assignable"] == [], "a pass ran after every step: nothing is left to place"
        states = {j.id: j.state for j in self.jobs.values()}
        self.model_pass()  # the model's reservations now (the real pass ran after the last step)
        assert {j.id: j.state for j in self.jobs.values()} == states
        assert real["reservations"] == self.reservations

    def agrees_with_the_model(self, real):
        assert set(real) == set(self.jobs)
        for job_id, (state, devices, runtime) in real.items():
            m = self.jobs[job_id]
            s = JobState(state)
            kind = "queued" if s is JobState.QUEUED else "active" if s.active else "done"
            assert kind == m.state, (job_id, state, m)
            if s.terminal:
                assert self.final.setdefault(job_id, s) is s, "a terminal state changed"
            if m.devices:  # it landed: only where its target matches, ceilings allow
                assert devices == m.devices, (job_id, devices, m.devices)
                assert len(devices) == m.count and len({host(d) for d in devices}) == 1
                assert set(devices) <= m.targets, (job_id, devices, m.targets)
                assert not set(devices) & m.excluded, (job_id, devices, m.excluded)
                assert all(fits(m.ask, CEILING[d]) for d in devices), (job_id, devices)
                assert runtime == m.runtime

    def leases_go_with_their_job(self, leases, states):
        """One live lease per device; an active job holds a live lease on each
        of its devices and on nothing else; a job that is not active holds none."""
        on = [d for d, _ in leases]
        assert len(on) == len(set(on)), leases
        held: dict[int, set[str]] = {}
        for d, j in leases:
            held.setdefault(j, set()).add(d)
        active = {j.id: set(j.devices) for j in self.jobs.values() if j.state == "active"}
        assert held == active
        for d, state in states.items():
            assert (state == "busy") == (d in on), (d, state)

    def nothing_waits_beside_enough_free_devices(self, real):
        """From the real state: no queued job (not held back by the cap) has
        enough ready devices on one host that no other job reserved."""
        for job_id, (state, _, _) in real["jobs"].items():
            m = self.jobs[job_id]
            if state != "queued" or job_id in real["capped"]:
                continue
            free = [
                d
                for d in m.candidates()
                if real["devices"][d] == "ready" and real["reserved"].get(d, job_id) == job_id
            ]
            if m.pins:
                assert set(free) != set(m.pins), (m, free)
            else:
                for h in HOSTS:
                    assert sum(1 for d in free if host(d) == h) < m.count, (m, free)


def test_scheduler_machine(engine):
    """The machine on each store engine (the engine fixture, tests/conftest.py)."""
    base = settings.get_profile("rc-scheduler-machine")
    run_state_machine_as_test(SchedulerMachine, settings=engine_settings(engine, base))


class _Drawn:
    """A `data` argument of the machine's rules that draws a given value."""

    def __init__(self, value) -> None:
        self.value = value

    def draw(self, _strategy):
        return self.value


def test_a_cancelled_job_hands_its_reservation_to_the_job_behind_it(engine):
    """Found by the machine (and a bug of the model, not of rc): cancelling a
    queued 3-device job that held a reservation let the next job start on
    the reserved devices in the store, while the model ran no pass after a
    cancel and still had that job queued. The same steps, on each engine."""
    m = SchedulerMachine()
    m.start(aging=60.0, cap=0)
    try:
        bursts = (
            [("host=b", -1, "bob", 2, 0), ("*", -3, "bob", 3, 300)]
            + [("host=b", -2, "bob", 1, 1800), ("host=c", -1, "bob", 3, 0)]
            + [("host=b", -1, "alice", 1, 1800)],
            [("*", -1, "alice", 2, 300), ("model=h100", 1, "bob", 1, 300)]
            + [("vram>=40G", -1, "alice", 2, 1800)],
            [("host=b", 0, "alice", 1, 300), ("model=h100", 3, "bob", 3, 1800)]
            + [("vram>=40G", -2, "bob", 1, 0)],
            [("host=c", -2, "bob", 2, 1800), ("host=c", 3, "alice", 3, 0)]
            + [("vram>=40G", -1, "bob", 2, 1800), ("host=b", -1, "bob", 1, 300)]
            + [("*", -1, "alice", 1, 1800)],
            [("host=c", 1, "bob", 2, 300), ("model=h100", -2, "alice", 1, 0)]
            + [("host=b", -1, "alice", 1, 300), ("host=c", -2, "alice", 1, 0)]
            + [("*", 3, "bob", 1, 0)],
        )
        for many in bursts:
            m.burst(many)
            m.invariants_hold()
        assert m.jobs[12].state == "queued" and m.jobs[20].state == "queued"
        m.kill(_Drawn(12), True)
        m.invariants_hold()
        assert m.jobs[20].state == "active"
    finally:
        m.teardown()
