"""What a fresh user broke, kept broken-proof: escaping other users' text on
the terminal, path segments that stay segments, one-line errors, checked
input, and exit codes (each test names the report it comes from)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.harness import Cli, job, wait_until

pytestmark = pytest.mark.e2e

EVIL = "multi\nline\x1b[31mred\x07\x9b2J"


@pytest.fixture(scope="module")
def box(tmp_path_factory, pyz):
    from tests.harness import Controller, Worker, base_env

    tmp = tmp_path_factory.mktemp("hygiene")
    env = base_env(tmp / "home")
    ctl = Controller(tmp / "data", env).start()
    w = Worker(
        ctl.url, ctl.token("w", "worker"), tmp / "w", env, host="hy", devices="cpu:2", pyz=pyz
    ).start()
    admin = ctl.client()
    wait_until(lambda: len(admin.get("/v1/devices")["devices"]) == 2, 30, "the worker")
    users = {n: Cli(ctl.url, ctl.token(n), env, tmp) for n in ("ann", "ben")}
    yield ctl, users, Cli(ctl.url, ctl.admin_token, env, tmp)
    admin.close_all()
    w.stop()
    ctl.stop()


def _no_raw_controls(out: bytes) -> None:
    for ch in (b"\x1b", b"\x07", "\x9b".encode()):
        assert ch not in out, out


def test_other_users_text_never_drives_the_terminal(box):
    """Report 4: a hold reason with ESC, BEL and newlines went to terminals raw."""
    _ctl, users, admin = box
    hold = int(
        users["ann"]
        .run("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", EVIL, "--detach")
        .stdout
    )
    waiting = int(users["ben"].run("run", "--detach", "-d", "hy:cpu0", "--", "true").stdout)
    admin.run("drain", "hy:cpu1", "--reason", EVIL, check=True)
    for args in (
        ("devices",),
        ("ps",),
        ("describe", "hy:cpu0"),
        ("describe", "hy:cpu1"),
        ("jobs",),
        ("events",),
        ("explain", str(waiting)),
        ("explain", "-s", "*"),
    ):
        res = users["ben"].run(*args)
        assert res.returncode == 0, (args, res.stderr)
        _no_raw_controls(res.stdout + res.stderr)
        # a reason is never a line of its own (it could forge one: a device row, an event)
        assert not any(ln.lstrip().startswith(b"line") for ln in res.stdout.splitlines()), (
            args,
            res.stdout,
        )
    assert b"\\x1b[31m" in users["ben"].run("ps").stdout
    users["ben"].run("kill", str(waiting), check=True)
    users["ann"].run("release", str(hold), check=True)
    admin.run("undrain", "hy:cpu1", check=True)


def test_a_device_id_is_one_path_segment(box):
    """Report 5: `rc clear 'hy:cpu1/drain?'` drained hy:cpu1."""
    ctl, users, admin = box
    res = admin.run("clear", "hy:cpu1/drain?")
    assert res.returncode == 2 and b"is not a device id" in res.stderr
    devices = {v["device"]["id"]: v["device"] for v in ctl.client().get("/v1/devices")["devices"]}
    assert not devices["hy:cpu1"]["draining"]
    for odd in ("ü:ç", "hy:cpu0 ", "hy:cpu0?x=1", "hy"):
        res = users["ann"].run("describe", odd)
        assert res.returncode == 2 and b"is not a device id" in res.stderr, (odd, res.stderr)
        assert b"Traceback" not in res.stderr
    # and the API, given a percent-encoded id, keeps it one segment
    from rc.proto.client import segment

    with pytest.raises(ApiError) as e:
        ctl.client().post(f"/v1/devices/{segment('hy:cpu1?drain')}/clear")
    assert e.value.code == "device_not_found"


def test_bad_arguments_are_usage_errors(box):
    _ctl, users, _admin = box
    ann = users["ann"]
    for args, words in [
        (("run", "--priority", "99999999999999999999", "--", "true"), b"outside -10..10"),
        (("run", "-s", "", "--", "true"), b"-s needs a selector"),
        (("explain", "-s", ""), b"-s needs a selector"),
        (("hold", "-s", "", "--ttl", "5m", "--reason", "r"), b"-s needs a selector"),
        (("run", "--max-runtime", "5m5m", "--", "true"), b"bad duration"),
        (("run", "-e", "FOO", "--", "true"), b"rc run: -e 'FOO'"),
    ]:
        res = ann.run(*args)
        assert res.returncode == 2, (args, res)
        assert words in res.stderr, (args, res.stderr)
        assert res.stderr.count(b"\n") == 1, res.stderr  # one line, no usage block


def test_the_api_checks_names_and_durations(box):
    ctl, _users, _admin = box
    c = ctl.client()
    for body, code in [
        ({"command": ["true"], "selector": "*", "as_user": "x y"}, "bad_request"),
        ({"command": ["true"], "selector": "*", "max_runtime_seconds": 2**62}, "limit_exceeded"),
        # README limits table: a selector is free text of at most 4096 characters
        ({"command": ["true"], "selector": "a=b," * 1100}, "limit_exceeded"),
    ]:
        with pytest.raises(ApiError) as e:
            c.post("/v1/jobs", body)
        assert e.value.code == code
    worker = Client(ctl.url, ctl.token("w2", "worker"))
    with pytest.raises(ApiError) as e:
        worker.post(
            "/v1/workers/register",
            {"host": "lb", "devices": [{"name": "d0"}], "labels": {"d0": {"weird label": "x"}}},
        )
    assert e.value.code == "bad_request" and "label name" in e.value.message


def test_logs_follow_exits_as_the_job_did(box):
    """Report: after detaching, `rc logs -f` always exited 0."""
    ctl, users, _admin = box
    ann = users["ann"]
    job_id = int(ann.run("run", "--detach", "--", "sh", "-c", "echo bye; exit 5").stdout)
    res = ann.run("logs", "-f", str(job_id))
    assert res.stdout == b"bye\n" and res.returncode == 5
    wait_until(lambda: job(ctl.client(), job_id)["state"] == "failed", 10, "the job to end")
    assert ann.run("logs", str(job_id)).returncode == 0  # a snapshot is just the bytes


def test_a_drain_that_changes_nothing_is_refused(box):
    """Report: draining a drained device, or undraining a ready one, succeeded
    and added an event each time."""
    _ctl, _users, admin = box
    events = lambda: len(admin.json("events", "-o", "json"))
    assert admin.run("drain", "hy:cpu1", "--reason", "cable swap").returncode == 0
    before = events()
    again = admin.run("drain", "hy:cpu1", "--reason", "cable swap")
    assert again.returncode == 1 and b"hy:cpu1 is already draining" in again.stderr
    assert admin.run("drain", "hy:cpu1", "--reason", "new cable").returncode == 0  # a new reason
    assert admin.run("undrain", "hy:cpu1").returncode == 0
    undrain = admin.run("undrain", "hy:cpu1")
    assert undrain.returncode == 1 and b"hy:cpu1 is not draining" in undrain.stderr
    assert events() == before + 2


def test_devices_leave_labels_out_only_when_asked(box):
    """The `rc devices` table asks for no labels (DESIGN.md §8: ≤ 150 ms)."""
    ctl, _users, admin = box
    c = ctl.client()
    full = c.get("/v1/devices")["devices"]
    assert all(v["device"]["labels"] for v in full)
    bare = c.get("/v1/devices", params={"labels": "false"})["devices"]
    assert [v["device"]["id"] for v in bare] == [v["device"]["id"] for v in full]
    assert all(v["device"]["labels"] == [] for v in bare)
    with pytest.raises(ApiError) as e:
        c.get("/v1/devices", params={"labels": "maybe"})
    assert e.value.status == 400 and "labels must be true or false" in e.value.message
    res = admin.run("devices", "-o", "json")
    assert '"kind"' in res.stdout.decode()


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_escaping_leaves_no_control_character_and_keeps_plain_text(text):
    from rc.cli.output import escape_controls

    out = escape_controls(text)
    assert all(c.isprintable() or c in "\n\t\r" for c in out)
    if all(c.isprintable() or c in "\n\t\r" for c in text):
        assert out == text


def test_a_refused_no_wait_leaves_no_row(box):
    """Report 15: a refused `rc run --no-wait` stayed in rc jobs as killed."""
    ctl, users, admin = box
    ann, ben = users["ann"], users["ben"]
    hold = int(ann.run("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", "r", "--detach").stdout)
    refused = ben.run("run", "--no-wait", "-d", "hy:cpu0", "--", "echo", "nowait-marker")
    assert refused.returncode == 1 and b"no_device_available" in refused.stderr
    assert b"nothing was queued" in refused.stderr
    everything = ctl.client().get("/v1/jobs", params={"limit": 1000})["jobs"]
    assert not [j for j in everything if "nowait-marker" in j["command"]]
    assert b"nowait-marker" not in admin.run("jobs", "-n", "1000").stdout
    assert b"nowait-marker" not in admin.run("describe", "hy:cpu0").stdout
    ann.run("release", str(hold), check=True)
    wait_until(lambda: job(ctl.client(), hold)["state"] == "killed", 20, "the hold to end")
