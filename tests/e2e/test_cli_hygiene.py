"""What a fresh user broke, kept broken-proof: escaping other users' text on
the terminal, path segments that stay segments, one-line errors, checked
input, and exit codes (each test names the report it comes from)."""

from __future__ import annotations

import os
import re
import subprocess
from subprocess import DEVNULL

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.proto.client import Client
from rc.proto.errors import ApiError
from tests.helpers.harness import PY, Cli, job, stop_process
from tests.helpers.wait import wait_until

EVIL = "multi\nline\x1b[31mred\x07\x9b2J"


@pytest.fixture(scope="module")
def box(tmp_path_factory, pyz):
    from tests.helpers.harness import Controller, Worker, base_env

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


def test_other_peoples_text_never_forges_a_line_of_a_message(box):
    """Found by a new user: the owner following `rc logs -f` saw `rc: job 82
    killed: killed by admin: adm<CR><LF>FORGED` with a real CR/LF; a repeated
    drain printed `already drained: a<CR>b<LF>c`. Such text is shown with
    escapes, and the end of a job or a hold reads as in the listings."""
    ctl, users, admin = box
    ann = users["ann"]
    job_id = int(ann.run("run", "--detach", "-d", "hy:cpu0", "--", "sleep", "60").stdout)
    wait_until(lambda: job(ctl.client(), job_id)["state"] == "running", 30, "the job to run")
    admin.run("kill", str(job_id), "--reason", "adm\r\nFORGED", check=True)
    res = ann.run("logs", "-f", str(job_id))
    assert res.returncode == 143, res
    assert res.stderr == (
        f"rc: job {job_id} killed by root (token admin), an admin: adm\\r\\nFORGED\n".encode()
    )
    admin.run("drain", "hy:cpu1", "--reason", "a\rb\nc", check=True)
    again = admin.run("drain", "hy:cpu1", check=True)
    assert re.fullmatch(rb"already drained: a\\rb\\nc, by admin, \d+s ago\n", again.stdout), again
    admin.run("undrain", "hy:cpu1", check=True)
    proc = ann.popen("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", "r", stdin=DEVNULL)
    try:
        granted = proc.stdout.readline()
        assert granted.startswith(b"hold "), granted
        hold = int(granted.split()[1])
        admin.run("kill", str(hold), "--reason", "x\r\nFORGED", check=True)
        _, err = proc.communicate(timeout=30)
    finally:
        stop_process(proc)
    assert proc.returncode == 0, err
    assert err.endswith(
        f"rc: hold {hold} ended: killed by root (token admin), an admin: x\\r\\nFORGED\n".encode()
    ), err
    assert b"\r" not in err


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
    # bytes that are not UTF-8 reached the controller as a bad_json 400
    for args in (
        ("run", "-e", os.fsdecode(b"X=\xff\xfe"), "--", "true"),
        ("run", "--", "echo", os.fsdecode(b"caf\xe9")),
    ):
        res = ann.run(*args)
        assert res.returncode == 2, (args, res)
        assert res.stderr.startswith(b"rc run: argument ") and b"is not valid UTF-8" in res.stderr
        assert b"'X=\\xff\\xfe'" in res.stderr or b"'caf\\xe9'" in res.stderr, res.stderr
        assert res.stderr.count(b"\n") == 1, res.stderr


def test_a_removed_current_directory_is_one_line_and_exit_2(box, tmp_path):
    """The trial: `rc run` from a directory that had been removed gave a
    Python traceback (job_cwd's os.getcwd). It says so in one line and
    submits nothing."""
    ctl, users, _admin = box
    ann = users["ann"]
    gone = tmp_path / "gone"
    gone.mkdir()
    before = len(ctl.client().get("/v1/jobs")["jobs"])
    for args, extra in [
        (("run", "--", "true"), ""),
        (("run", "--cwd", "sub", "--", "true"), " (so --cwd 'sub' names nothing)"),
        (("exec", "1", "--", "true"), ""),
    ]:
        script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
        res = subprocess.run(
            ["sh", "-c", script, "sh", str(gone), PY, "-m", "rc", *args],
            env=ann.env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        gone.mkdir()
        assert res.returncode == 2, (args, res)
        assert res.stderr.decode() == (
            f"rc {args[0]}: the current directory no longer exists{extra}; cd somewhere "
            f"and run again, or give --cwd /absolute/path (see rc {args[0]} --help)\n"
        ), res.stderr
    assert len(ctl.client().get("/v1/jobs")["jobs"]) == before


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


def test_a_verb_already_in_effect_exits_0_says_so_and_keeps_the_reason(box):
    """Reports: draining a drained device, or undraining a ready one, succeeded
    and added an event each time; then a second
    `rc drain` without --reason erased the first reason and `rc undrain`
    twice exited 1. A repeat exits 0, says since when and by whom the effect
    is in place, and changes nothing; only a new reason is a change."""
    _ctl, _users, admin = box
    events = lambda: len(admin.json("events", "-n", "1000"))
    drain_reason = lambda: next(
        d["device"]["drain_reason"] for d in admin.json("devices") if d["device"]["id"] == "hy:cpu1"
    )
    assert admin.run("drain", "hy:cpu1", "--reason", "maintenance").returncode == 0
    before = events()
    for extra in ((), ("--reason", "maintenance")):
        again = admin.run("drain", "hy:cpu1", *extra)
        assert again.returncode == 0, again.stderr
        assert re.fullmatch(rb"already drained: maintenance, by admin, \d+s ago\n", again.stdout), (
            again.stdout
        )
        assert drain_reason() == "maintenance"
    assert events() == before  # a no-op records nothing
    changed = admin.run("drain", "hy:cpu1", "--reason", "new cable")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout == b"hy:cpu1: drain reason is now 'new cable' (was 'maintenance')\n"
    assert drain_reason() == "new cable"
    assert admin.run("undrain", "hy:cpu1").returncode == 0
    undrain = admin.run("undrain", "hy:cpu1")
    assert undrain.returncode == 0, undrain.stderr
    assert undrain.stdout == b"already undrained: hy:cpu1 is not draining\n"
    assert events() == before + 2


def test_devices_leave_labels_out_only_when_asked(box):
    """The `rc devices` table asks for no labels (README "Performance": ≤ 150 ms)."""
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


def _with_env(cli: Cli, **extra: str) -> Cli:
    other = Cli(cli.env["RC_CONTROLLER"], cli.env["RC_TOKEN"], cli.env, cli.cwd)
    other.env.update(extra)
    return other


def _row(out: bytes, job_id: int) -> str:
    for line in out.decode().splitlines():
        if line.split(" ", 1)[0] == str(job_id):
            return line
    raise AssertionError(f"no row for job {job_id} in:\n{out.decode()}")


def test_cells_escape_carriage_returns(box):
    """Report 13: `\\r` in a hold reason or a command reached the terminal raw
    in rc ps, rc jobs and rc devices (a cell escaped only newline and tab)."""
    ctl, users, _admin = box
    ann, ben = users["ann"], users["ben"]
    hold = int(
        ann.run("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", "ok\rFORGED", "--detach").stdout
    )
    queued = int(ben.run("run", "--detach", "-d", "hy:cpu0", "--", "printf", "a\rb").stdout)
    for args in (("ps",), ("jobs",), ("devices",), ("describe", "hy:cpu0")):
        out = ben.run(*args, check=True).stdout
        assert b"\r" not in out, (args, out)
        assert b"\\r" in out, (args, out)
    ben.run("kill", str(queued), check=True)
    ann.run("release", str(hold), check=True)
    wait_until(lambda: job(ctl.client(), hold)["state"] == "killed", 20, "the hold to end")


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


def test_a_kill_reads_as_one_phrase(box):
    """Report 15: a cancelled job read `killed (killed by admin)`."""
    ctl, users, admin = box
    ann, ben = users["ann"], users["ben"]
    hold = int(ann.run("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", "r", "--detach").stdout)
    queued = int(ben.run("run", "--detach", "-d", "hy:cpu0", "--", "true").stdout)
    admin.run("kill", str(queued), check=True)
    ann.run("release", str(hold), check=True)
    wait_until(lambda: job(ctl.client(), hold)["state"] == "killed", 20, "the hold to end")
    listing = ben.run("jobs", check=True).stdout
    # the trial: the actor comes first, so the table's cut never hides who
    admin_label = "root (token admin), an admin"
    assert f"killed by {admin_label}: cancelled while queued" in _row(listing, queued)
    assert "killed by ann (token ann): released" in _row(listing, hold)
    assert b"killed (killed by" not in listing
    described = ben.run("describe", "hy:cpu0", check=True).stdout.decode()
    assert f"{queued}  killed by {admin_label}: cancelled while queued" in described


def test_human_times_are_local_and_json_times_utc(box):
    """Report 15: times were UTC for humans; `TZ` is honoured now."""
    ctl, users, _admin = box
    ann = users["ann"]
    job_id = int(ann.run("run", "--detach", "--", "true").stdout)
    wait_until(lambda: job(ctl.client(), job_id)["state"] == "succeeded", 20, "the job to end")
    started = job(ctl.client(), job_id)["started_at"]
    import time

    from rc.cli.output import iso_utc

    for tz, offset in (("UTC0", 0), ("XYZ-05:45", 5 * 3600 + 45 * 60), ("ABC+07", -7 * 3600)):
        out = _with_env(ann, TZ=tz).run("jobs", "--submitter", "ann", check=True).stdout
        local = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started + offset))
        assert local in _row(out, job_id), (tz, out)
    records = _with_env(ann, TZ="XYZ-05:45").json("jobs", "--submitter", "ann")
    mine = next(j for j in records if j["id"] == job_id)
    assert mine["started_at"] == iso_utc(started) and mine["started_at"].endswith("Z")


def test_cp_is_listed_as_rc_cp(box):
    """Report 15: rc cp's job was listed as `sh -c 'set -e...`."""
    ctl, users, _admin = box
    ann = users["ann"]
    (ann.cwd / "notes.txt").write_text("hello\n")
    into = ann.cwd / "cp-into"  # absolute: a job's HOME is its user's, not the test's
    into.mkdir()  # rc cp makes no directories
    res = ann.run("cp", "notes.txt", f"hy:cpu1:{into}/")
    assert res.returncode == 0, res.stderr
    assert (into / "notes.txt").read_text() == "hello\n"
    copies = [j for j in ctl.client().get("/v1/jobs")["jobs"] if j["stdio"] == "pipe"]
    assert copies and copies[0]["reason"] == f"rc cp notes.txt hy:cpu1:{into}/"
    row = _row(ann.run("jobs", check=True).stdout, copies[0]["id"])
    assert "  rc cp notes.txt hy:cpu1:/" in row and "sh -c" not in row  # cut to 60: a long path
    described = ann.run("describe", "hy:cpu1", check=True).stdout.decode()
    assert f"{copies[0]['id']}  succeeded" in described and "rc cp notes.txt" in described


def test_a_reason_goes_beside_the_command_and_only_rc_says_rc_cp(box):
    """The trial: any user could set `reason` on a plain job, and listings
    showed it instead of the command (`curl evil | sh` listed as `rc cp
    ...`). A job's reason is shown beside its command; the `rc cp` label is
    the controller's, given to a job whose command is rc cp's own, and a
    client's reason starting "rc cp" is dropped."""
    ctl, users, _admin = box
    ann = users["ann"]
    c = Client(ctl.url, ann.env["RC_TOKEN"])
    evil = c.post(
        "/v1/jobs",
        {
            "command": ["sh", "-c", "echo curl evil | cat"],
            "device_id": "hy:cpu0",
            "reason": "rc cp notes.txt hy:cpu0:/tmp/",
        },
    )["job"]
    assert evil["reason"] == ""
    noted = c.post(
        "/v1/jobs", {"command": ["echo", "train"], "device_id": "hy:cpu0", "reason": "ablation 3"}
    )["job"]
    assert noted["reason"] == "ablation 3"
    # a pipe job that only looks like a copy (not rc cp's own command) is no copy
    fake = c.post(
        "/v1/jobs",
        {
            "command": ["sh", "-c", "echo curl evil", "sh", "/tmp/", "x"],
            "device_id": "hy:cpu0",
            "stdio": "pipe",
            "reason": "rc cp x hy:cpu0:/tmp/",
        },
    )["job"]
    assert fake["reason"] == ""
    c.post(f"/v1/jobs/{fake['id']}/kill")
    for j in (evil, noted):
        wait_until(lambda: job(ctl.client(), j["id"])["state"] == "succeeded", 20, "the job")
    listing = ann.run("jobs", check=True).stdout
    assert "sh -c 'echo curl evil | cat'" in _row(listing, evil["id"])
    assert "rc cp" not in _row(listing, evil["id"]) and "rc cp" not in _row(listing, fake["id"])
    assert "echo train (ablation 3)" in _row(listing, noted["id"])


def test_whoami_prints_json(box):
    """Report 14: `rc whoami -o json` was refused."""
    _ctl, users, _admin = box
    assert users["ann"].json("whoami") == {
        "name": "ann",
        "role": "user",
        "host": "",
        "unix_user": "ann",
        "principal": users["ann"].json("whoami")["principal"],
        "label": "ann (token ann)",
    }
    assert users["ann"].json("whoami")["principal"].startswith("token:")


def _complete(cli: Cli, line: str, tmp) -> set[str]:
    out = tmp / "completions"
    env = {
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    res = _with_env(cli, **env).run(timeout=30)
    assert res.returncode == 0, res.stderr
    return {w.strip() for w in out.read_text().split("\n") if w.strip()}


def test_tab_completes_job_ids_device_ids_and_label_keys(box, tmp_path):
    """Report 14: argcomplete completed no job id, device id or label key."""
    ctl, users, _admin = box
    ann = users["ann"]
    hold = int(
        ann.run("hold", "-d", "hy:cpu0", "--ttl", "5m", "--reason", "tab", "--detach").stdout
    )
    running = int(ann.run("run", "--detach", "-d", "hy:cpu1", "--", "sleep", "60").stdout)
    try:
        wait_until(lambda: job(ctl.client(), running)["state"] == "running", 30, "the job")
        # options only after "-"
        assert _complete(ann, "rc kill ", tmp_path) == {str(hold), str(running)}
        # found by a new user: rc shell, exec and release offered plain jobs too
        for verb in ("shell", "exec", "release"):
            assert _complete(ann, f"rc {verb} ", tmp_path) == {str(hold)}, verb
        assert _complete(ann, "rc describe ", tmp_path) == {"hy:cpu0", "hy:cpu1"}
        keys = _complete(ann, "rc devices -s ", tmp_path)
        assert {"host", "device", "id"} <= keys
        assert _complete(ann, "rc run -s host=hy,dev", tmp_path) == {"host=hy,device"}
        # a controller that is not there: no completions, no error, no wait
        gone = _with_env(ann, RC_CONTROLLER="http://127.0.0.1:9")
        assert _complete(gone, "rc kill ", tmp_path) == set()
    finally:
        ann.run("kill", str(running), check=True)
        ann.run("release", str(hold), check=True)
        wait_until(lambda: job(ctl.client(), hold)["state"] == "killed", 20, "the hold to end")
        wait_until(lambda: job(ctl.client(), running)["state"] == "killed", 20, "the job to end")
