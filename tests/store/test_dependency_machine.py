"""A hypothesis state machine over the real store and scheduler, on a fake
clock: jobs and array elements with dependencies (README "Dependencies",
"Arrays"), completions that succeed or fail, kills, scheduling passes.

After every step:
- a job never got a device before each of its dependencies had ended and met
  its condition;
- after a pass, no queued job has a dependency that can no longer be met: it
  was ended within that pass, as killed, naming the dependency;
- a job with an unmet dependency never holds a device or a reservation, and
  holds back no other job (its devices go to the jobs behind it);
- no array has more elements assigned or running than its cap.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rc.proto.model import Condition, JobState
from tests.helpers.inprocess import Lab
from tests.helpers.pgcluster import engine_settings

TERMINAL = {"succeeded", "failed", "killed", "lost"}
CONDITIONS = st.sampled_from(["ok", "notok", "any"])


class DependencyMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.lab = Lab()
        self.lab.register("h", {f"d{i}": (0, {"kind": "cpu"}) for i in range(3)})
        self.ids: list[int] = []

    def teardown(self) -> None:
        lab = getattr(self, "lab", None)
        if lab is not None:
            lab.close()

    @rule(
        data=st.data(),
        n_deps=st.integers(0, 3),
        array=st.sampled_from(["", "", "0-2", "0-3%1", "0-1%2"]),
    )
    def submit(self, data, n_deps, array):
        after = []
        if self.ids and n_deps:
            for _ in range(n_deps):
                target = data.draw(st.sampled_from(self.ids))
                after.append(f"{target}:{data.draw(CONDITIONS)}")
        first, _ = self.lab.submit("alice", after=tuple(after), array=array)
        size = {"": 1, "0-2": 3, "0-3%1": 4, "0-1%2": 2}[array]
        self.ids += range(first, first + size)
        self.lab.kick()

    def _in(self, *states: str) -> list[int]:
        return [i for i in self.ids if self.lab.job(i).state.value in states]

    @precondition(lambda self: bool(self._in("assigned", "running")))
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data, ok):
        job_id = data.draw(st.sampled_from(self._in("assigned", "running")))
        self.lab.finish(job_id, JobState.SUCCEEDED if ok else JobState.FAILED)
        self.lab.kick()

    @precondition(lambda self: bool(self._in("queued", "assigned", "running")))
    @rule(data=st.data())
    def kill(self, data):
        self.lab.kill(data.draw(st.sampled_from(self._in("queued", "assigned", "running"))))
        self.lab.kick()

    @rule()
    def tick(self):
        self.lab.now += 1
        self.lab.kick()

    def _snapshot(self):
        def read(tx):
            jobs = {r["id"]: r for r in tx.all("jobs_list", _ALL)}
            deps = {}
            for j in jobs:
                deps[j] = list(tx.all("deps_of", (j,)))
            arrays = {
                r["id"]: r["max_running"]
                for r in tx.conn.execute("SELECT * FROM arrays").fetchall()
            }
            return jobs, deps, arrays

        return self.lab.read(read)

    @invariant()
    def dependencies_hold(self):
        if not hasattr(self, "lab"):
            return
        jobs, deps, arrays = self._snapshot()
        for j, r in jobs.items():
            for d in deps[j]:
                dep = jobs[d["after_id"]]
                met = Condition(d["condition"]).met_by(JobState(dep["state"]))
                if r["assigned_at"] is not None:  # it got devices: every dependency was met
                    assert met, (j, d["after_id"])
                    assert dep["finished_at"] <= r["assigned_at"]
                if r["state"] == "queued" and dep["state"] in TERMINAL:
                    assert met, f"job {j} still waits for {d['after_id']}, which can never do"
            if r["state"] == "killed" and r["kill_reason_head"].startswith("dependency "):
                assert r["started_at"] is None and r["assigned_at"] is None
        active: dict[int, int] = {}
        for r in jobs.values():
            if r["array_id"] is not None and r["state"] in ("assigned", "running"):
                active[r["array_id"]] = active.get(r["array_id"], 0) + 1
        for a, n in active.items():
            assert not arrays[a] or n <= arrays[a], (a, n, arrays[a])
        # a waiting job holds back no one: a device is idle only when nothing eligible waits
        free = self.lab.read(
            lambda tx: tx.conn.execute(
                "SELECT count(*) FROM devices WHERE state = 'ready'"
            ).fetchone()[0]
        )
        if free:
            for j, r in jobs.items():
                if r["state"] != "queued":
                    continue
                unmet = any(
                    not Condition(d["condition"]).met_by(JobState(jobs[d["after_id"]]["state"]))
                    for d in deps[j]
                )
                capped = (
                    r["array_id"] is not None
                    and arrays[r["array_id"]]
                    and (active.get(r["array_id"], 0) >= arrays[r["array_id"]])
                )
                assert unmet or capped, f"job {j} is eligible beside a free device"


_ALL = {
    "device": "",
    "user": "",
    "owner": "",
    "states": "[]",
    "name": "",
    "since": 0,
    "array": 0,
    "before": 0,
    "limit": 100_000,
}

DEPENDENCY_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_dependency_machine(engine):
    """The machine on each store engine (the engine fixture, tests/conftest.py)."""
    run_state_machine_as_test(
        DependencyMachine, settings=engine_settings(engine, DEPENDENCY_SETTINGS)
    )
