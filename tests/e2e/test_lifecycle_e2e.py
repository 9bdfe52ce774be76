"""End to end through the CLI: a job's name, `rc show`, `rc jobs` filters and
paging, killing several jobs, `rc release` on a job, `rc logs --tail/--head`
(README "Names, details and listings")."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from tests.helpers.harness import Cli, job
from tests.helpers.wait import wait_until


@pytest.fixture
def fleet(controller, make_worker):
    return make_worker(controller, host="box", devices="cpu:2")


def _id(res) -> int:
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split()[0])


def test_a_name_reaches_the_job_and_every_listing(fleet, cli, controller):
    res = cli.run(
        "run", "--name", "sweep-1", "--", "python3", "-c",
        "import os; print(os.environ['RC_JOB_NAME'])",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"sweep-1\n"
    listed = cli.run("jobs", check=True).stdout.decode()
    assert "NAME" in listed.splitlines()[0] and "sweep-1" in listed
    jobs = cli.json("jobs", "--name", "sweep-*")
    assert [j["name"] for j in jobs] == ["sweep-1"]
    assert cli.json("jobs", "--name", "other-*") == []


def test_a_bad_name_is_a_usage_error_and_nothing_is_submitted(fleet, cli, controller):
    res = cli.run("run", "--name", "has space", "--", "true")
    assert res.returncode == 2 and b"not a job name" in res.stderr
    assert cli.json("jobs") == []
    c = controller.client(cli.env["RC_TOKEN"])
    from rc.proto.errors import ApiError

    with pytest.raises(ApiError, match="job name"):
        c.post("/v1/jobs", {"command": ["true"], "selector": "*", "name": "a*b"})


def test_show_tells_everything_about_a_finished_job(fleet, cli, controller):
    res = cli.run(
        "run", "--name", "eval", "--export", "NONE", "-e", "SECRET=v", "--max-runtime", "1h", "--",
        "sh", "-c", "echo hello; exit 3",
    )  # fmt: skip
    assert res.returncode == 3
    job_id = int(res.stderr.split(b"job ")[1].split()[0])
    out = cli.run("show", str(job_id), check=True).stdout.decode()
    for words in (
        f"job:          {job_id}",
        "name:         eval",
        "state:        failed",
        "submitter:    alice",
        "command:      sh -c 'echo hello; exit 3'",
        "env:          SECRET",
        "max runtime:  1h",
        "exit code:    3",
        "log:          6 bytes",
    ):
        assert words in out, out
    view = cli.json("show", str(job_id))
    assert view["job"]["env"] == {"SECRET": "v"}  # the owner sees values
    assert view["detail"]["log_bytes"] == 6 and view["detail"]["ran_seconds"] >= 0
    other = controller.client(controller.token("bob")).get(
        f"/v1/jobs/{job_id}", params={"detail": "1"}
    )
    assert other["job"]["env"] == {"SECRET": "(hidden)"}


def test_show_of_a_queued_job_says_why_it_waits(fleet, cli, controller):
    hold = _id(cli.run("hold", "-n", "2", "--ttl", "10m", "--reason", "r", "--detach"))
    queued = _id(cli.run("run", "--detach", "--", "true"))
    out = cli.run("show", str(queued), check=True).stdout.decode()
    assert "state:        queued (position 1 in the queue)" in out
    assert "waiting:      No matching device is free: box:cpu0: alice (token alice) holds it" in out
    cli.run("kill", str(queued), str(hold), check=True)


def test_jobs_filters_and_keyset_paging_reach_all_history(fleet, cli, controller):
    ids = [_id(cli.run("run", "--detach", "--name", f"n{i}", "--", "true")) for i in range(5)]
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(
        lambda: all(job(alice, i)["state"] == "succeeded" for i in ids),
        timeout=30,
    )
    bob = controller.client(controller.token("bob"))
    bob_job = bob.post("/v1/jobs", {"command": ["false"], "selector": "*"})["job"]["id"]
    wait_until(lambda: job(bob, bob_job)["state"] == "failed", timeout=30)
    seen, before = [], 0
    while True:
        args = ["jobs", "--mine", "-n", "2"] + (["--before", str(before)] if before else [])
        page = cli.run(*args, "-o", "json", check=True)
        got = [j["id"] for j in json.loads(page.stdout)]
        seen += got
        listed = cli.run(*args, check=True)
        if b"more: rc jobs --before" not in listed.stderr:
            break
        before = got[-1]
    assert seen == ids[::-1]
    # found by a new user: a full last page still said "more:"
    assert b"more:" not in cli.run("jobs", "--mine", "-n", "5", check=True).stderr
    assert b"more:" in cli.run("jobs", "--mine", "-n", "4", check=True).stderr
    assert [j["id"] for j in cli.json("jobs", "--state", "failed")] == [bob_job]
    assert [j["id"] for j in cli.json("jobs", "--user", "bob")] == [bob_job]
    assert cli.json("jobs", "--since", "1h") and cli.json("jobs", "--since", "2999-01-01") == []
    assert len(cli.json("jobs", "--state", "succeeded,failed", "--since", "1h")) == 6
    res = cli.run("jobs", "--state", "runing")
    assert res.returncode == 2 and b"not a job state" in res.stderr
    res = cli.run("jobs", "--since", "yesterday")
    assert res.returncode == 2 and b"neither a duration" in res.stderr


def test_kill_takes_several_ids_and_filters(fleet, cli, controller):
    a, b, c_ = (
        _id(cli.run("run", "--detach", "--name", f"k{i}", "--", "sleep", "300")) for i in range(3)
    )
    d = _id(cli.run("run", "--detach", "--name", "other", "--", "sleep", "300"))
    bob = controller.client(controller.token("bob"))
    bobs = bob.post("/v1/jobs", {"command": ["sleep", "300"], "selector": "*", "name": "k9"})
    res = cli.run("kill", str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().splitlines()[-1] == "2 jobs ended"
    res = cli.run("kill", "--name", "k*")  # alice's only: bob's k9 is not hers
    assert res.returncode == 0, res.stderr
    assert f"for job {c_}" in res.stdout.decode() and "1 job ended" in res.stdout.decode()
    assert job(bob, bobs["job"]["id"])["state"] in ("queued", "assigned", "running")
    res = cli.run("kill", "--user", "bob")
    assert res.returncode == 1 and b"not_job_owner" in res.stderr
    res = cli.run("kill")
    assert res.returncode == 2 and b"name the jobs to kill" in res.stderr
    res = cli.run("kill", "--mine", "--state", "queued,running,assigned")
    assert res.returncode == 0 and f"for job {d}" in res.stdout.decode()


def test_release_ends_only_holds(fleet, cli, controller):
    job_id = _id(cli.run("run", "--detach", "--", "sleep", "300"))
    res = cli.run("release", str(job_id))
    assert res.returncode == 1
    assert f"job {job_id} is not a hold; rc kill {job_id} ends it".encode() in res.stderr
    alice = controller.client(cli.env["RC_TOKEN"])
    assert job(alice, job_id)["state"] in ("queued", "assigned", "running")
    hold = _id(cli.run("hold", "--ttl", "10m", "--reason", "r", "--detach"))
    assert cli.run("release", str(hold), check=True).stdout == f"released {hold}\n".encode()
    cli.run("kill", str(job_id), check=True)


def test_logs_tail_and_head(fleet, cli):
    res = cli.run("run", "--", "python3", "-c", "for i in range(1, 101): print('line', i)")
    assert res.returncode == 0, res.stderr
    job_id = res.stderr.split(b"job ")[1].split()[0].decode()
    assert (
        cli.run("logs", job_id, "--tail", "3", check=True).stdout == b"line 98\nline 99\nline 100\n"
    )
    assert cli.run("logs", job_id, "--tail", "0", check=True).stdout == b""
    assert cli.run("logs", job_id, "--tail", "500", check=True).stdout == res.stdout
    assert cli.run("logs", job_id, "--head", "2", check=True).stdout == b"line 1\nline 2\n"
    res = cli.run("logs", job_id, "--head", "2", "--tail", "2")
    assert res.returncode == 2


def test_logs_follow_of_a_queued_job_says_it_waits(fleet, cli, controller):
    hold = _id(cli.run("hold", "-n", "2", "--ttl", "10m", "--reason", "r", "--detach"))
    queued = _id(cli.run("run", "--detach", "--", "sh", "-c", "echo done-here"))
    follower = cli.popen("logs", "-f", str(queued))
    try:
        line = follower.stderr.readline()
        assert f"job {queued} is queued (position 1 in the queue); waiting".encode() in line
        cli.run("release", str(hold), check=True)
        out, _err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    assert out == b"done-here\n" and follower.returncode == 0


def test_logs_of_a_queued_job_says_there_is_no_output_yet(fleet, cli):
    hold = _id(cli.run("hold", "-n", "2", "--ttl", "10m", "--reason", "r", "--detach"))
    queued = _id(cli.run("run", "--detach", "--", "true"))
    try:
        for flags in ((), ("--tail", "5"), ("--head", "5")):
            res = cli.run("logs", str(queued), *flags)
            assert res.returncode == 0 and res.stdout == b""
            assert (
                f"job {queued} is queued (position 1 in the queue): no output yet "
                f"(rc logs -f {queued} waits for it)".encode()
                in res.stderr
            ), flags
    finally:
        cli.run("release", str(hold), check=True)


def test_extend_gives_a_hold_more_time_up_to_its_ceiling(
    make_controller, make_worker, env, tmp_path
):
    ctl = make_controller("--heartbeat-interval", "0.5s")
    config = tmp_path / "worker.toml"
    config.write_text('devices = [{ name = "cpu0", max_runtime = "1h" }]\n')
    make_worker(ctl, host="box", devices="", config=config)
    cli = Cli(ctl.url, ctl.token("alice"), env, tmp_path)
    # a first ttl the extension surely reaches in time on a loaded machine (with
    # 3 s, a slow `rc extend` came after the hold had ended)
    hold = _id(cli.run("hold", "--ttl", "8s", "--reason", "r", "--detach"))
    res = cli.run("extend", str(hold), "10m")
    assert res.returncode == 0, res.stderr
    assert b"(ttl 10m8s)" in res.stdout
    alice = ctl.client(cli.env["RC_TOKEN"])
    started = job(alice, hold)["started_at"]
    # past its first ttl (and the heartbeats that carried the new one) it lives on
    wait_until(
        lambda: job(alice, hold)["state"] != "running" or time.time() > started + 10, timeout=30
    )
    got = job(alice, hold)
    assert got["state"] == "running", (
        got["kill_reason"],
        got["max_runtime_seconds"],
        got["started_at"],
        got["finished_at"],
    )
    res = cli.run("extend", str(hold), "1h")
    assert res.returncode == 1
    assert b"runtime_above_ceiling" in res.stderr and b"at most 1h" in res.stderr
    other = Cli(ctl.url, ctl.token("bob"), env, tmp_path)
    res = other.run("extend", str(hold), "1m")
    assert res.returncode == 1 and b"not_job_owner" in res.stderr
    cli.run("release", str(hold), check=True)
    job_id = _id(cli.run("run", "--detach", "--", "true"))
    res = cli.run("extend", str(job_id), "1m")
    assert res.returncode == 1 and b"not a hold" in res.stderr
    res = cli.run("extend", str(hold), "0")
    assert res.returncode == 2


def test_rerun_submits_a_copy_with_a_new_id(fleet, cli, controller):
    res = cli.run(
        "run", "--name", "seed-3", "-e", "SEED=3", "--priority", "-2", "--",
        "sh", "-c", 'echo "seed $SEED $RC_JOB_NAME"; exit 4',
    )  # fmt: skip
    assert res.returncode == 4
    first = int(res.stderr.split(b"job ")[1].split()[0])
    res = cli.run("rerun", str(first))
    assert res.returncode == 0, res.stderr
    second = int(res.stdout)
    assert second != first and f"copy of job {first}".encode() in res.stderr
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: job(alice, second)["state"] == "failed", timeout=30)
    a, b = job(alice, first), job(alice, second)
    for key in ("command", "env", "name", "priority", "selector", "count", "exit_code"):
        assert a[key] == b[key], key
    assert a["idempotency_key"] != b["idempotency_key"]
    assert cli.run("logs", str(second), check=True).stdout == b"seed 3 seed-3\n"
    res = cli.run("rerun", "999")
    assert res.returncode == 1 and b"not_found" in res.stderr
    bob = Cli(controller.url, controller.token("bob"), cli.env, cli.cwd)
    res = bob.run("rerun", str(first))  # bob sees SEED's name, not its value
    assert res.returncode == 1 and b"only its owner or an admin can rerun it" in res.stderr


def test_an_array_runs_every_element_with_its_index_under_its_cap(fleet, cli, controller, tmp_path):
    script = (
        "import os; print(os.environ['RC_ARRAY_ID'], os.environ['RC_ARRAY_INDEX'], "
        "os.environ.get('RC_ARRAY_ITEM', '-'))"
    )
    res = cli.run("run", "--array", "0-4,7%1", "--name", "seeds", "--", "python3", "-c", script)
    assert res.returncode == 0, res.stderr
    array_id = int(res.stdout)
    assert b"6/6 done, 0 running, 0 queued, 0 failed" in res.stderr
    jobs = cli.json("jobs", "--array", str(array_id))
    assert sorted(j["array_index"] for j in jobs) == [0, 1, 2, 3, 4, 7]
    assert {j["name"] for j in jobs} == {"seeds"} and array_id == min(j["id"] for j in jobs)
    for j in jobs:
        out = cli.run("logs", str(j["id"]), check=True).stdout
        assert out == f"{array_id} {j['array_index']} -\n".encode()
    # %1: no two elements ran at once
    spans = sorted((j["started_at"], j["finished_at"]) for j in jobs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    shown = cli.run("show", str(array_id), check=True).stdout.decode()
    assert f"array:        {array_id}: 6 elements (0-4,7%1), at most 1 at once" in shown
    assert "elements:     6 succeeded" in shown
    listed = cli.run("jobs", "--array", str(array_id), check=True).stdout.decode()
    assert "not ok:       -" in listed
    # found by a new user: the listing of an array did not say which element is which
    head, *rows = listed.splitlines()[:7]
    assert head.split()[:4] == ["JOB", "NAME", "INDEX", "DEVICE"]
    assert sorted(int(r.split()[2]) for r in rows[:6]) == [0, 1, 2, 3, 4, 7]


def test_an_array_file_gives_each_line_and_failures_fail_the_run(fleet, cli, controller, tmp_path):
    params = tmp_path / "params.txt"
    params.write_text("lr=0.1\n\n  \nlr=0.01\nlr=bad\n")
    script = "import os, sys; v = os.environ['RC_ARRAY_ITEM']; print(v); sys.exit(v == 'lr=bad')"
    res = cli.run("run", "--array-file", str(params), "--", "python3", "-c", script)
    assert res.returncode == 1
    array_id = int(res.stdout)
    assert b"1 did not succeed (indices 2)" in res.stderr
    jobs = {j["array_index"]: j for j in cli.json("jobs", "--array", str(array_id))}
    assert {i: j["array_item"] for i, j in jobs.items()} == {0: "lr=0.1", 1: "lr=0.01", 2: "lr=bad"}
    res = cli.run("rerun", "--failed", str(array_id))
    assert res.returncode == 0, res.stderr
    again = int(res.stdout)
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: alice.get(f"/v1/arrays/{again}")["done"], timeout=30)
    rerun = cli.json("jobs", "--array", str(again))
    assert [(j["array_index"], j["array_item"]) for j in rerun] == [(2, "lr=bad")]


@pytest.mark.parametrize(
    "args,words",
    [
        (["--array", "5-1"], b"ends before it starts"),
        (["--array", "1-"], b"is not N, N-M or N-M:S"),
        (["--array", "a-b"], b"is not N, N-M or N-M:S"),
        (["--array", "%0"], b"must be from %1"),
        (["--array", "0-10000"], b"more than 10000 elements"),
    ],
)
def test_a_bad_array_is_a_usage_error_and_submits_nothing(fleet, cli, args, words):
    res = cli.run("run", *args, "--", "true")
    assert res.returncode == 2 and words in res.stderr, res.stderr
    assert cli.json("jobs") == []


def test_an_empty_array_file_or_an_oversized_array_submits_nothing(
    fleet, cli, controller, tmp_path
):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    res = cli.run("run", "--array-file", str(empty), "--", "true")
    assert res.returncode == 2 and b"has no non-empty line" in res.stderr
    alice = controller.client(cli.env["RC_TOKEN"])
    from rc.proto.errors import ApiError

    with pytest.raises(ApiError, match="at most 10000") as e:
        alice.post("/v1/jobs", {"command": ["true"], "selector": "*", "array_items": ["x"] * 10001})
    assert e.value.status == 400
    with pytest.raises(ApiError, match="ends before it starts"):
        alice.post("/v1/jobs", {"command": ["true"], "selector": "*", "array": "3-2"})
    assert cli.json("jobs") == []


def test_kill_array_ends_every_element(fleet, cli, controller):
    res = cli.run("run", "--array", "0-9%1", "--detach", "--", "sleep", "300")
    array_id = _id(res)
    res = cli.run("kill", "--array", str(array_id))
    assert res.returncode == 0, res.stderr
    assert "10 jobs ended" in res.stdout.decode()
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: alice.get(f"/v1/arrays/{array_id}")["done"], timeout=30)
    assert alice.get(f"/v1/arrays/{array_id}")["counts"] == {"killed": 10}


def test_many_jobs_are_killed_in_one_request_each_with_its_outcome(fleet, cli, controller):
    """Found by a new user: rc kill --array of 10,000 elements sent one request
    per element (0.45 s each with the queue full) and took tens of minutes."""
    res = cli.run("run", "--array", "0-999%1", "--detach", "--", "sleep", "300")
    array_id = _id(res)
    res = cli.run("kill", "--array", str(array_id), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().splitlines()[-1] == "1000 jobs ended"
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: alice.get(f"/v1/arrays/{array_id}")["done"], timeout=60)
    assert alice.get(f"/v1/arrays/{array_id}")["counts"] == {"killed": 1000}
    # the API: each id's outcome, a refusal of one is not the call's
    bob = controller.client(controller.token("bob"))
    bobs = bob.post("/v1/jobs", {"command": ["sleep", "300"], "selector": "*"})["job"]["id"]
    mine = _id(cli.run("run", "--detach", "--", "sleep", "300"))
    got = alice.post("/v1/jobs/kill", {"ids": [mine, bobs, 10**9, mine], "reason": "r"})
    out = {o["job_id"]: o for o in got["results"]}
    assert list(out) == [mine, bobs, 10**9]  # in the order given, each once
    assert out[mine]["ok"] and out[mine]["message"].endswith(f"for job {mine}")
    assert (out[bobs]["ok"], out[bobs]["code"]) == (False, "not_job_owner")
    assert (out[10**9]["ok"], out[10**9]["code"]) == (False, "not_found")
    assert job(bob, bobs)["state"] in ("queued", "assigned", "running")
    from rc.proto.errors import ApiError

    with pytest.raises(ApiError) as e:
        alice.post("/v1/jobs/kill", {"ids": list(range(1, 10_002))})
    assert e.value.code == "limit_exceeded" and "the limit is 10000" in e.value.message
    bob.post(f"/v1/jobs/{bobs}/kill", {})
    # rc kill --array of an id that is no array says so (it said "0 jobs ended")
    res = cli.run("kill", "--array", str(mine))
    assert res.returncode == 1 and f"no array {mine}".encode() in res.stderr, res


def test_a_sweep_then_an_evaluation_after_it(fleet, cli, controller):
    res = cli.run("run", "--array", "0-2", "--detach", "--", "sh", "-c", "sleep 0.5")
    array_id = _id(res)
    res = cli.run("run", "--after", str(array_id), "--detach", "--", "echo", "evaluated")
    evaluation = _id(res)
    alice = controller.client(cli.env["RC_TOKEN"])
    shown = cli.run("show", str(evaluation), check=True).stdout.decode()
    if job(alice, evaluation)["state"] == "queued":
        assert "waiting:      Waiting for job" in shown, shown
    assert f"after:        job {array_id}:ok" in shown
    res = cli.run("logs", "-f", str(evaluation))
    assert res.returncode == 0 and res.stdout == b"evaluated\n"
    # found by a new user: an attached dependent's queued line did not say it waits
    blocker = _id(cli.run("run", "--detach", "--", "sleep", "300"))
    follower = cli.popen(
        "run", "--after", str(blocker), "--after", f"{evaluation}:any", "--", "true"
    )
    try:
        line = follower.stderr.readline().decode()
        assert f"once job {blocker} has succeeded and job {evaluation} has ended (job " in line
    finally:
        cli.run("kill", str(blocker), check=True)
        follower.communicate(timeout=60)
    ev = job(alice, evaluation)
    elements = alice.get("/v1/jobs", params={"array": array_id})["jobs"]
    assert len(elements) == 3
    assert all(e["finished_at"] <= ev["started_at"] for e in elements)


def test_a_dependency_that_cannot_be_met_ends_the_dependent_at_once(fleet, cli, controller):
    failing = _id(cli.run("run", "--detach", "--", "sh", "-c", "exit 3"))
    after_ok = _id(cli.run("run", "--detach", "--after", str(failing), "--", "true"))
    after_notok = _id(cli.run("run", "--detach", "--after", f"{failing}:notok", "--", "true"))
    chained = _id(cli.run("run", "--detach", "--after", str(after_ok), "--", "true"))
    alice = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: job(alice, chained)["state"] != "queued", timeout=30)
    ended = job(alice, after_ok)
    assert ended["state"] == "killed" and ended["started_at"] is None
    assert ended["kill_reason"] == f"dependency {failing} failed (exit 3)"
    assert job(alice, chained)["kill_reason"] == f"dependency {after_ok} killed"
    wait_until(lambda: job(alice, after_notok)["state"] == "succeeded", timeout=30)


def test_bad_dependencies_are_refused_and_nothing_is_submitted(fleet, cli, controller):
    res = cli.run("run", "--after", "12:maybe", "--", "true")
    assert res.returncode == 2 and b"unknown condition 'maybe' (ok, notok or any)" in res.stderr
    res = cli.run("run", "--after", "999", "--", "true")
    assert res.returncode == 1 and b"there is no job 999" in res.stderr
    alice = controller.client(cli.env["RC_TOKEN"])
    from rc.proto.errors import ApiError

    with pytest.raises(ApiError, match="at most 64") as e:
        alice.post(
            "/v1/jobs",
            {"command": ["true"], "selector": "*", "after": [str(i) for i in range(1, 66)]},
        )
    assert e.value.status == 400
    # a cycle cannot be made: only jobs that exist already can be named
    with pytest.raises(ApiError, match="no job 1"):
        alice.post("/v1/jobs", {"command": ["true"], "selector": "*", "after": ["1"]})
    assert cli.json("jobs") == []
