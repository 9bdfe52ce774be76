"""The Python API (rc.api, README "A Python API") against a real `rc serve` and a
real worker from the zipapp: submit, wait, logs, kill, jobs, devices, the
CLI's credential discovery (environment, local socket), rc's errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rc.api
from rc.proto.errors import ApiError, RcError
from rc.proto.model import Device, DeviceState, JobState
from rc.proto.model import Job as JobRecord
from tests.helpers.harness import Controller, short_socket_path


@pytest.fixture
def box(controller, make_worker):
    make_worker(controller, host="box", devices="cpu:2")
    return controller


@pytest.fixture
def alice(box):
    conn = rc.api.connect(controller=box.url, token=box.token("alice"))
    yield conn
    conn.close()


def test_submit_wait_logs(alice, tmp_path):
    job = alice.submit(
        ["sh", "-c", 'echo "hello from $RC_DEVICE $GREETING"; echo err >&2; exit 3'],
        env={"GREETING": "hi"},
        name="api-one",
        cwd=str(tmp_path),
    )
    assert isinstance(job.record, JobRecord) and job.id > 0 and job.name == "api-one"
    done = job.wait(timeout=60)
    assert done.state is JobState.FAILED and done.exit_code == 3
    assert job.done and job.exit_code == 3
    out = job.logs()
    assert out.startswith("hello from box:cpu") and out.rstrip().endswith("hi\nerr")
    assert job.logs(tail_bytes=4) == "err\n"
    assert job.logs(encoding=None, offset=6) == out.encode()[6:]
    assert job.logs(follow=True) == out  # ended: follow returns at once, whole


def test_follow_streams_until_the_end(alice):
    job = alice.submit(
        ["python3", "-c", "import time\nfor i in range(3): print(i); time.sleep(0.2)"]
    )
    assert job.logs(follow=True) == "0\n1\n2\n"
    assert job.refresh().state is JobState.SUCCEEDED


def test_kill_and_wait_timeout(alice):
    job = alice.submit(["sleep", "60"])
    with pytest.raises(rc.api.WaitTimeout) as got:
        job.wait(timeout=1)
    assert got.value.job.id == job.id and got.value.job.state not in rc.api.TERMINAL
    assert "still" in str(got.value)
    assert job.kill("enough") != ""
    done = job.wait(timeout=30)
    assert done.state is JobState.KILLED and "enough" in done.kill_reason
    with pytest.raises(ApiError) as refused:
        job.kill()
    assert refused.value.code == "not_cancellable"


def test_queued_job_is_cancelled_and_explained(alice):
    blockers = [alice.submit(["sleep", "60"]) for _ in range(2)]
    queued = alice.submit(["true"], selector="*")
    assert queued.state is JobState.QUEUED and queued.queue_position >= 1
    assert queued.explain().reasons  # sentences saying why it waits
    assert queued.kill() and queued.wait(timeout=30).state is JobState.KILLED
    assert queued.record.started_at is None
    for j in blockers:
        j.kill()
        j.wait(timeout=30)


def _client_requests(box) -> float:
    text = box.client().request("GET", "/metrics").body.decode()
    line = next(
        x for x in text.splitlines() if x.startswith('rc_http_requests_total{side="client"}')
    )
    return float(line.split()[-1])


def test_waiting_on_a_queued_job_is_a_long_poll_not_a_loop(alice, box):
    """Job.wait sends the queue position it knows: a job that stays at its
    place in the queue costs one request per long poll, not one per
    round trip."""
    blockers = [alice.submit(["sleep", "60"]) for _ in range(2)]
    queued = alice.submit(["true"])
    assert queued.state is JobState.QUEUED
    before = _client_requests(box)
    with pytest.raises(rc.api.WaitTimeout):
        queued.wait(timeout=3)
    assert _client_requests(box) - before <= 6  # 3 polls of 1 s at most, and the scrapes
    for j in (queued, *blockers):
        j.kill()
        j.wait(timeout=30)


def test_jobs_devices_explain_usage(alice, box):
    a = alice.submit(["true"], name="listed-a")
    a.wait(timeout=60)
    bob = rc.api.connect(controller=box.url, token=box.token("bob"))
    b = bob.submit(["true"], name="listed-b")
    b.wait(timeout=60)
    mine = alice.jobs()
    assert [j.id for j in mine] == [a.id]  # the caller's own by default
    everyone = {j.id for j in alice.jobs(mine=False)}
    assert {a.id, b.id} <= everyone
    assert [j.id for j in alice.jobs(mine=False, name="listed-*", limit=1)] == [b.id]
    assert alice.jobs(state=["running", "queued"]) == []
    assert [j.id for j in alice.jobs(state="succeeded")] == [a.id]
    devs = alice.devices()
    assert sorted(d.device.id for d in devs) == ["box:cpu0", "box:cpu1"]
    assert all(isinstance(d.device, Device) and d.device.state is DeviceState.READY for d in devs)
    ex = alice.explain("*")
    assert sorted(ex.matching) == ["box:cpu0", "box:cpu1"]
    assert alice.usage(since="1d").rows  # the two jobs' leases
    assert alice.whoami().name == "alice"
    assert alice.job(a.id).record.command == ("true",)
    bob.close()


def test_refusals_are_rcs_errors(alice):
    with pytest.raises(ApiError) as bad:
        alice.submit(["true"], selector="kind=")
    assert bad.value.code == "bad_selector" and bad.value.status == 400
    with pytest.raises(ApiError) as none:
        alice.submit(["true"], selector="kind=tpu")
    assert none.value.code == "no_matching_device"
    with pytest.raises(ApiError) as missing:
        alice.job(999_999)
    assert missing.value.code == "not_found"
    for call, why in [
        (lambda: alice.submit("echo hi"), "list of strings"),
        (lambda: alice.submit([]), "non-empty"),
        (lambda: alice.submit(["true"], device="nohost"), "device id"),
        (lambda: alice.submit(["true"], device="b:c", selector="*"), "not both"),
        (lambda: alice.submit(["true"], env={"1BAD": "x"}), "variable name"),
        (lambda: alice.submit(["true"], name="bad name"), "job name"),
        (lambda: alice.submit(["true"], max_runtime=1.5), "whole number"),
        (lambda: alice.jobs(state="runing"), "not a job state"),
        (lambda: alice.jobs(limit=0), "limit"),
        (lambda: alice.job(0), "job id"),
    ]:
        with pytest.raises(rc.api.BadArgument, match=why):
            call()
    assert issubclass(rc.api.BadArgument, RcError)


def test_someone_elses_logs_and_kill_are_refused(alice, box):
    mallory = rc.api.connect(controller=box.url, token=box.token("mallory"))
    job = alice.submit(["sleep", "30"])
    theirs = mallory.job(job.id)  # seeing it is allowed (rc ps shows everyone's)
    with pytest.raises(ApiError) as no_logs:
        theirs.logs()
    assert no_logs.value.code == "not_job_owner"
    with pytest.raises(ApiError) as no_kill:
        theirs.kill()
    assert no_kill.value.code == "not_job_owner"
    job.kill()
    job.wait(timeout=30)
    mallory.close()


def test_the_default_connection_takes_the_clis_environment(box, env, tmp_path):
    """`import rc.api; rc.api.submit(...)` in a fresh process finds the
    controller and token where the CLI does (RC_CONTROLLER, RC_TOKEN)."""
    code = (
        "import rc.api\n"
        "j = rc.api.submit(['echo', 'from-env'])\n"
        "print(j.wait(timeout=60).state.value, rc.api.whoami().name, j.logs().strip())\n"
    )
    run_env = {**env, "RC_CONTROLLER": box.url, "RC_TOKEN": box.token("carol")}
    got = subprocess.run(
        [sys.executable, "-c", code],
        env=run_env,
        check=False,
        capture_output=True,
        timeout=90,
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode().split() == ["succeeded", "carol", "from-env"]


def test_no_credentials_is_a_clear_rc_error(env, tmp_path):
    code = "import rc.api\ntry:\n    rc.api.devices()\nexcept rc.api.RcError as e:\n    print(e)\n"
    run_env = {**env, "RC_CONTROLLER": "http://127.0.0.1:9", "RC_SOCKET": "/nonexistent/x.sock"}
    run_env.pop("RC_TOKEN", None)
    got = subprocess.run(
        [sys.executable, "-c", code],
        env=run_env,
        check=False,
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode().startswith("no token:")


def test_a_one_box_user_needs_no_token(tmp_path, env, make_worker):
    """On the controller's own box the local socket says who the caller is
    (SO_PEERCRED), as for the CLI: connect() with unix:// and no token."""
    sock = short_socket_path(tmp_path)
    ctl = Controller(tmp_path / "sockdata", env, socket=sock).start()
    try:
        make_worker(ctl, host="onebox", devices="cpu:1")
        conn = rc.api.connect(controller=f"unix://{sock}")
        assert conn.whoami().principal.startswith("uid:")
        job = conn.submit(["echo", "via-socket"])
        assert job.wait(timeout=60).state is JobState.SUCCEEDED
        assert job.logs() == "via-socket\n"
        conn.close()
    finally:
        ctl.stop()


def test_the_zipapp_imports_the_api(pyz, box):
    code = (
        f"import sys; sys.path.insert(0, {str(pyz)!r}); import rc.api; "
        f"c = rc.api.connect(controller={box.url!r}, token={box.token('dave')!r}); "
        "print(sorted(d.device.id for d in c.devices()))"
    )
    got = subprocess.run(
        [sys.executable, "-I", "-c", code], check=False, capture_output=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.decode().strip() == "['box:cpu0', 'box:cpu1']"


def test_a_program_that_names_itself_puts_each_write_in_the_feed(box):
    """Rc-Via (rc.proto.VIA_HEADER): a submit and a kill sent with it are
    in the feed, under the caller's own label; without it an owner's own
    submit and kill are not; a malformed value is refused."""
    from rc.proto import VIA_HEADER, calls

    token = box.token("erin")
    agent = rc.api.connect(controller=box.url, token=token, headers={VIA_HEADER: "mcp"})
    plain = rc.api.connect(controller=box.url, token=token)
    quiet = plain.submit(["sleep", "30"])
    quiet.kill()
    job = agent.submit(["sleep", "30"], name="agent-job")
    agent.job(job.id).kill("agent says stop")
    job.wait(timeout=30)
    quiet.wait(timeout=30)
    feed = box.client().call(calls.EVENTS, params={"limit": 1000})["events"]
    mine = [(e["kind"], e["job_id"], e["actor"], e["text"]) for e in feed if e["job_id"]]
    assert mine == [
        (
            "job_submitted",
            job.id,
            "erin (token erin)",
            f"erin (token erin) submitted job {job.id} via mcp",
        ),
        (
            "job_killed",
            job.id,
            "erin (token erin)",
            f"erin (token erin) killed their own job {job.id} via mcp",
        ),
    ]
    bad = rc.api.connect(controller=box.url, token=token, headers={VIA_HEADER: "MCP server"})
    with pytest.raises(ApiError) as refused:
        bad.submit(["true"])
    assert refused.value.code == "bad_request" and VIA_HEADER in refused.value.message
    for c in (agent, plain, bad):
        c.close()
