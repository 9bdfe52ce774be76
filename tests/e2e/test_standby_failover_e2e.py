"""A failover end to end: two `rc serve` on one throwaway PostgreSQL
database, one worker and the clients given both URLs; kill -9 of the active
in the middle of 200 jobs. Every job runs exactly once (each appends its
RC_JOB_ID to a file), none is lost, `rc logs -f` of a job running across
the failover ends with its exit code; the failover time (kill -9 → the
first job dispatched by the new active) is printed; bench/failover.py
measures it (a bound asserted here would fail on a loaded machine)."""

from __future__ import annotations

import collections
import time

import pytest

from rc.proto.client import Client
from tests.helpers.harness import Cli, Worker
from tests.helpers.standby import _instance, _is_active, _leader_row, _pair
from tests.helpers.wait import wait_until

psycopg = pytest.importorskip("psycopg")

JOBS = 200


def _done(c: Client) -> int:
    return sum(
        1 for j in c.get("/v1/jobs", params={"limit": 1000})["jobs"] if j["state"] == "succeeded"
    )


def test_kill_9_of_the_active_in_the_middle_of_200_jobs_loses_none_and_runs_none_twice(
    pg_dsn, make_controller, env, pyz, tmp_path
):
    a, b, token = _pair(make_controller, pg_dsn, tmp_path)
    wait_until(lambda: "standby: the active controller" in b.log(), 10, "b standby")
    urls = f"{a.url},{b.url}"
    admin = Client(urls, token, timeout=60)
    runs, go = tmp_path / "runs", tmp_path / "go"
    w = Worker(
        urls,
        admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"],
        tmp_path / "w",
        env,
        host="box",
        devices="cpu:4",
        pyz=pyz,
    )
    try:
        w.start()
        wait_until(lambda: "registered box " in w.log(), 30, "the worker to register")
        cli = Cli(urls, token, env, tmp_path)
        # one job runs across the failover, followed by rc logs -f
        long_script = (
            f'echo "$RC_JOB_ID" >> {runs}; echo before; '
            f"while [ ! -e {go} ]; do sleep 0.05; done; echo after; exit 5"
        )
        long_id = admin.post("/v1/jobs", {"command": ["sh", "-c", long_script], "selector": "*"})[
            "job"
        ]["id"]
        wait_until(
            lambda: runs.exists() and runs.read_text().strip() == str(long_id),
            30,
            "the long job to start",
        )
        logs = cli.popen("logs", "-f", str(long_id))
        script = f'echo "$RC_JOB_ID" >> {runs}; sleep 0.05'
        ids = [
            admin.post("/v1/jobs", {"command": ["sh", "-c", script], "selector": "*"})["job"]["id"]
            for _ in range(JOBS)
        ]
        wait_until(lambda: len(runs.read_text().split()) >= 1 + JOBS // 3, 60, "a third to run")
        killed_at = time.time()
        a.kill9()
        wait_until(lambda: _is_active(b, token), 20, "b to take over")
        go.touch()
        wait_until(lambda: _done(admin) >= JOBS, 60, "every job to succeed")
        # rc logs -f of the job that ran across the failover ends with its exit code
        out, err = logs.communicate(timeout=60)
        assert out == b"before\nafter\n", err.decode(errors="replace")
        assert logs.returncode == 5, err.decode(errors="replace")
        # every job ran exactly once, none lost
        counted = collections.Counter(int(x) for x in runs.read_text().split())
        assert set(counted) == {long_id, *ids}
        assert [i for i, n in counted.items() if n != 1] == []
        states = {
            j["id"]: j["state"] for j in admin.get("/v1/jobs", params={"limit": 1000})["jobs"]
        }
        assert all(states[i] == "succeeded" for i in ids), collections.Counter(states.values())
        assert states[long_id] == "failed"  # exit 5
        assert _leader_row(pg_dsn)[:2] == (_instance(b), b.url)
        # the failover time: kill -9 → the first job the new active dispatched
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            first = c.execute(
                "SELECT min(assigned_at) FROM jobs WHERE assigned_at > %s", (killed_at,)
            ).fetchone()[0]
        failover = first - killed_at
        print(
            f"\nfailover: kill -9 of the active -> first job dispatched by the new: {failover:.2f} s"
        )
    finally:
        w.stop()
