"""History that ends through a real controller, worker and CLI (README
"History that ends"): `rc serve --retain 1s` deletes finished jobs, their
logs and events while `rc usage` keeps its totals; `--log-quota` deletes a
user's oldest finished logs and never a running job's."""

from __future__ import annotations

import json

from rc.proto.errors import ApiError
from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until


def _gone(c, job_id: int) -> bool:
    try:
        c.get(f"/v1/jobs/{job_id}")
    except ApiError as e:
        return e.status == 404
    return False


def _usage(cli: Cli, *args: str) -> dict:
    return json.loads(cli.run("usage", "-o", "json", *args, check=True).stdout)


def _totals(rep: dict) -> dict:
    t = rep["total"]
    return {
        "jobs": t["jobs"],
        "holds": t["holds"],
        "waits": t["waits"],
        "rows": {r["key"]: (r["jobs"], round(r["device_seconds"], 1)) for r in rep["rows"]},
        "seconds": round(t["device_seconds"], 1),
    }


def test_retain_1s_deletes_old_jobs_and_usage_stays(make_controller, make_worker, env, tmp_path):
    ctl = make_controller()
    make_worker(ctl, host="box", devices="cpu:2")
    alice = Cli(ctl.url, ctl.token("alice"), env, tmp_path)
    admin = Cli(ctl.url, ctl.admin_token, env, tmp_path)
    ids = []
    for argv in (
        ("run", "--", "sh", "-c", "echo one; sleep 0.3"),
        ("run", "-n", "2", "--", "sh", "-c", "echo two; sleep 0.5"),
        ("run", "--", "sh", "-c", "exit 3"),
    ):
        res = alice.run(*argv)
        assert res.returncode in (0, 3), res.stderr
    ids = sorted(j["id"] for j in ctl.client().get("/v1/jobs")["jobs"])
    assert len(ids) == 3
    assert all((ctl.data / "logs" / f"{i}.log").exists() for i in ids[:2])
    before = {by: _usage(admin, "--by", by) for by in ("user", "host", "day")}
    assert before["user"]["total"]["jobs"] == {"failed": 1, "succeeded": 2}

    ctl.stop()  # the same data, now with --retain 1s
    ctl.extra = ["--retain", "1s", "--retain-interval", "1s"]
    ctl.start()
    c = ctl.client()
    wait_until(lambda: all(_gone(c, i) for i in ids), 30, "the finished jobs to be deleted")
    assert not any((ctl.data / "logs" / f"{i}.log").exists() for i in ids)
    assert not [e for e in c.get("/v1/events")["events"] if e.get("job_id") in ids]
    admin = Cli(ctl.url, ctl.admin_token, env, tmp_path)
    for by, rep in before.items():
        after = _usage(admin, "--by", by)
        assert _totals(after) == _totals(rep), by
    shown = json.loads(admin.run("jobs", "-o", "json", check=True).stdout)
    assert shown == [] or not [j for j in shown if j["id"] in ids]


def test_the_log_quota_deletes_the_oldest_finished_log_first(
    make_controller, make_worker, env, tmp_path
):
    ctl = make_controller("--log-quota", "1M", "--retain-interval", "1s")
    make_worker(ctl, host="box", devices="cpu:2")
    alice = Cli(ctl.url, ctl.token("alice"), env, tmp_path)
    big = "head -c 700000 /dev/zero | tr '\\0' x"
    old = int(alice.run("run", "--detach", "--", "sh", "-c", big, check=True).stdout)
    wait_until(lambda: job(ctl.client(), old)["state"] == "succeeded", 30, "the first job")
    logs = ctl.data / "logs"
    wait_until(lambda: (logs / f"{old}.log").stat().st_size >= 700000, 30, "its log")
    on = int(
        alice.run("run", "--detach", "--", "sh", "-c", f"{big}; echo; sleep 120", check=True).stdout
    )
    wait_until(lambda: (logs / f"{on}.log").exists(), 30, "the running job's log")
    wait_until(
        lambda: (logs / f"{on}.log").stat().st_size >= 700000, 30, "the running job's output"
    )
    wait_until(lambda: not (logs / f"{old}.log").exists(), 30, "the oldest log to go")
    assert job(ctl.client(), on)["state"] == "running"
    assert (logs / f"{on}.log").exists()  # over the quota alone: a running job's log stays
    show = alice.run("show", str(on), check=True).stdout.decode()
    assert "1,048,576 bytes per user" in show and "kept:" in show and "90d after it ends" in show
    assert alice.run("kill", str(on)).returncode == 0
    wait_until(lambda: job(ctl.client(), on)["state"] == "killed", 30, "the kill")
