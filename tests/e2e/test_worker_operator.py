"""What an operator runs into starting `rc worker` (README "Operating a
worker"): one worker per host on a machine, devices the controller would
refuse, --print-config for a config the worker cannot start with, and the
example config listing every key."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers.harness import BARE_PY, Worker
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import submit, wait_state


def unique_host(prefix: str) -> str:
    """A host name no other test run on this machine uses (the lock is per host)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_worker(
    ctl, tmp_path, env, pyz, host: str, devices: str = "cpu:1", timeout: float = 30
) -> subprocess.CompletedProcess:
    """A worker run to its end (it is expected to refuse to start)."""
    w = Worker(
        ctl.url,
        ctl.token(f"w-{uuid.uuid4().hex[:6]}", "worker"),
        tmp_path / "second",
        env,
        host=host,
        devices=devices,
        pyz=pyz,
    )
    (tmp_path / "second").mkdir(exist_ok=True)
    return subprocess.run(
        w.command(),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
        timeout=timeout,
        cwd=tmp_path,
    )


# -- 1. one worker per host on a machine ------------------------------------------


def test_a_second_worker_for_the_same_host_is_refused_and_the_first_keeps_its_job(
    controller, make_worker, tmp_path, env, pyz
):
    host = unique_host("dup")
    first = make_worker(controller, host=host, devices="cpu:1")
    admin = controller.client()
    job_id = submit(admin, ["sleep", "120"], device_id=f"{host}:cpu0")
    wait_state(admin, job_id, ("running",))

    res = run_worker(controller, tmp_path, env, pyz, host)
    err = res.stderr.decode()
    assert res.returncode != 0
    assert err == (
        f"rc worker: another rc worker for host {host} is running here "
        f"(pid {first.proc.pid}); stop it first, or give this one another host name "
        "with --host NAME (a second rc up on this machine needs its own)\n"
    )
    # Nothing reached the controller: the job runs on, the device is not quarantined.
    assert admin.get(f"/v1/jobs/{job_id}")["job"]["state"] == "running"
    dev = admin.get(f"/v1/devices/{host}:cpu0/describe")["view"]["device"]
    assert dev["state"] == "busy", dev
    assert first.proc.poll() is None

    # Another host on the same machine is not affected by the lock.
    make_worker(controller, host=unique_host("other"), devices="cpu:1")

    admin.post(f"/v1/jobs/{job_id}/kill", {})
    wait_state(admin, job_id)


def test_a_worker_restarts_after_the_first_was_killed_with_sigkill(
    controller, make_worker, tmp_path, env, pyz
):
    host = unique_host("restart")
    lock_file = Path(env["TMPDIR"]) / f"rc-worker-{os.getuid()}" / f"{host}.lock"
    first = make_worker(controller, host=host, devices="cpu:1")
    first.kill9()  # the kernel drops the lock with the process
    assert lock_file.exists()  # (the file stays; the next worker reuses it)
    second = make_worker(controller, host=host, devices="cpu:1")
    assert second.proc.poll() is None
    admin = controller.client()
    job_id = submit(admin, ["true"], device_id=f"{host}:cpu0")
    assert wait_state(admin, job_id)["state"] == "succeeded"
    # And after a clean stop too, which removes the lock file (found by a new
    # user: one file per host name ever run piled up in the temp dir).
    assert second.stop() == 0
    assert not lock_file.exists()
    make_worker(controller, host=host, devices="cpu:1")
    assert lock_file.exists()


def test_the_lock_file_is_never_inherited_by_jobs(controller, make_worker, tmp_path):
    from rc.worker.hostlock import lock_path

    host = unique_host("inherit")
    w = make_worker(controller, host=host, devices="cpu:1")
    admin = controller.client()
    out = tmp_path / "fds"
    job_id = submit(admin, ["sh", "-c", f"ls -l /proc/self/fd/ > {out}"], device_id=f"{host}:cpu0")
    assert wait_state(admin, job_id)["state"] == "succeeded"
    assert lock_path(host) not in out.read_text()
    assert w.proc.poll() is None


# -- 2. devices the controller would refuse; refusals for good end the worker -----


def test_max_devices_is_the_controllers_limit():
    from rc.controller.config import Limits
    from rc.worker.config import MAX_DEVICES

    assert MAX_DEVICES == Limits().devices_per_worker == 1024


@pytest.mark.parametrize(
    "text",
    [
        'devices = "cpu:1025"',
        'devices = "cpu:99999"',
        "devices = [" + ", ".join(f'"d{i}"' for i in range(1025)) + "]",
        'devices = "' + ",".join(f"d{i}" for i in range(1025)) + '"',
        "\n".join(f'[[devices]]\nname = "d{i}"' for i in range(1025)),
    ],
)
def test_more_devices_than_the_controller_takes_is_a_config_error(tmp_path, text):
    from rc.worker import config as wc

    path = tmp_path / "worker.toml"
    path.write_text(text + "\n")
    with pytest.raises(wc.ConfigError) as e:
        wc.load(str(path), env={})
    msg = str(e.value)
    assert msg.startswith(f"{path}: devices ") and ("1025" in msg or "99999" in msg)
    assert "a worker may declare at most 1024" in msg
    path.write_text('devices = "cpu:1024"\n')
    assert wc.load(str(path), env={}).devices == "cpu:1024"


def test_print_config_names_the_flag_for_too_many_devices(pyz, tmp_path):
    res = subprocess.run(
        [
            BARE_PY,
            "-I",
            str(pyz),
            "worker",
            "--controller",
            "http://127.0.0.1:9",
            "--devices",
            "cpu:99999",
            "--print-config",
        ],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 2 and res.stdout == b""
    assert res.stderr.decode() == (
        "rc worker: command line: devices 'cpu:99999': 99999 devices; a worker may declare "
        "at most 1024 (the controller's limit)\n"
    )


def _refusals(log: str) -> list[str]:
    return [line for line in log.splitlines() if "refused to register" in line]


def test_a_registration_refused_for_good_ends_the_worker(controller, tmp_path, env, pyz):
    host = unique_host("refused")
    # A user token is not a worker token: 403, for good.
    w = Worker(
        controller.url,
        controller.token("alice"),
        tmp_path / "w",
        env,
        host=host,
        devices="cpu:1",
        pyz=pyz,
    ).start()
    try:
        assert w.proc.wait(30) == 1
    finally:
        w.stop(timeout=10)  # never left behind, whatever the test found
    log = w.log()
    assert len(_refusals(log)) == 1 and "HTTP 403" in log and "retrying quietly" not in log, log
    # A worker token bound to another host at its first registration: 403 wrong_host.
    token = controller.token(f"bound-{host}", "worker")
    first = Worker(
        controller.url, token, tmp_path / "w", env, host=host + "-a", devices="cpu:1", pyz=pyz
    ).start()
    wait_until(lambda: f"registered {host}-a " in first.log(), 30, "the first worker")
    assert first.stop() == 0
    other = Worker(
        controller.url, token, tmp_path / "w", env, host=host + "-b", devices="cpu:1", pyz=pyz
    ).start()
    try:
        assert other.proc.wait(30) == 1
    finally:
        other.stop(timeout=10)
    assert len(_refusals(other.log())) == 1 and "wrong_host" in other.log()


def test_an_unknown_token_is_retried(controller, tmp_path, env, pyz):
    """401: the token may be being (re-)created; the worker goes on trying."""
    w = Worker(
        controller.url,
        "rc_not_a_token",
        tmp_path / "w",
        env,
        host=unique_host("unknown"),
        devices="cpu:1",
        pyz=pyz,
    ).start()
    try:
        wait_until(lambda: "retrying quietly" in w.log(), 30, "the first failed attempt")
        assert w.proc.poll() is None and not _refusals(w.log())
    finally:
        assert w.stop() == 0


# -- 3. --print-config says what the worker still lacks ------------------------


def _print_config(pyz, tmp_path, *args: str, env: dict | None = None):
    return subprocess.run(
        [BARE_PY, "-I", str(pyz), "worker", "--print-config", *args],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
        check=False,
    )


def test_print_config_without_controller_or_token_prints_it_and_exits_2(pyz, tmp_path, env):
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    res = _print_config(pyz, tmp_path, "--config", str(empty), env=env)
    assert res.returncode == 2
    assert 'controller_url = ""' in res.stdout.decode()  # the effective config, still
    assert res.stderr.decode() == (
        "rc worker: cannot start: no controller: give --controller URL or controller_url in "
        "the config\n"
        "rc worker: cannot start: no token: give --token-file, token_file in the config, or "
        "RC_TOKEN\n"
    )
    res = _print_config(
        pyz,
        tmp_path,
        "--config",
        str(empty),
        "--controller",
        "http://127.0.0.1:9",
        env={**env, "RC_TOKEN": "rc_x"},
    )
    assert res.returncode == 0 and res.stderr == b"", res.stderr
    res = _print_config(
        pyz, tmp_path, "--config", str(empty), "--controller", "http://127.0.0.1:9", env=env
    )
    assert res.returncode == 2 and res.stderr.decode().count("\n") == 1
    assert "no token" in res.stderr.decode() and "http://127.0.0.1:9" in res.stdout.decode()
