"""End to end on PostgreSQL: a real `rc serve --database postgresql://...`
(a throwaway cluster, tests/helpers/pgcluster.py), a real worker, real `rc`: jobs run,
their logs stay files under --data, and the state outlives the controller."""

from __future__ import annotations

import json

import pytest

from tests.helpers.harness import Cli


def test_rc_serve_on_postgresql_runs_jobs_and_keeps_them_across_a_restart(
    pg_cluster, make_controller, make_worker, env, tmp_path
):
    dsn, drop = pg_cluster.rc_database()
    try:
        data = tmp_path / "data"
        ctl = make_controller("--database", dsn, data=data)
        assert "database postgresql://" in ctl.log_path.read_text()
        assert not (data / "rc.db").exists()  # nothing in SQLite
        make_worker(ctl, host="box", devices="cpu:1")
        alice = ctl.token("alice")
        cli = Cli(ctl.url, alice, env, tmp_path)
        res = cli.run("run", "--name", "on-pg-1", "--", "sh", "-c", "echo on-postgres; exit 3")
        assert res.returncode == 3, res.stderr
        assert b"on-postgres\n" in res.stdout
        (job,) = json.loads(cli.run("jobs", "-o", "json", check=True).stdout)
        job_id = job["id"]
        assert any(
            p.name == str(job_id) or p.stem == str(job_id) for p in (data / "logs").rglob("*")
        )
        ctl.stop()
        ctl.start()  # the same database: the token, the job and its log are still there
        cli = Cli(ctl.url, alice, env, tmp_path)
        logs = cli.run("logs", str(job_id), check=True)
        assert logs.stdout == b"on-postgres\n"
        # the listing's PostgreSQL forms of a GLOB, a state list and a device among a job's
        found = cli.run(
            "jobs",
            "--name",
            "on-pg-?",
            "--state",
            "failed,lost",
            "--device",
            "box:cpu0",
            "-o",
            "json",
            check=True,
        )
        assert [j["id"] for j in json.loads(found.stdout)] == [job_id]
        none = cli.run("jobs", "--name", "on-pg-[^1]", "-o", "json", check=True)
        assert json.loads(none.stdout) == []
    finally:
        drop()


def test_rc_serve_refuses_a_database_that_is_not_postgresql(make_controller):
    with pytest.raises(AssertionError, match="must be a postgresql:// URL"):
        make_controller("--database", "mysql://x/y")
