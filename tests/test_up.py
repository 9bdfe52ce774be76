"""`rc up` / `rc down`, the one-box deployment, as a user runs them."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.harness import Cli, pid_alive, wait_until

pytestmark = pytest.mark.e2e

HELLO = ("run", "--", "python3", "-c", 'import os; print("hello from", os.environ["RC_DEVICE"])')


@pytest.fixture
def user(env, tmp_path):
    """The CLI as a new user: no RC_* variables, config written by rc up."""
    cli = Cli("", "", env, tmp_path)
    del cli.env["RC_CONTROLLER"], cli.env["RC_TOKEN"]
    yield cli
    cli.run("down", timeout=120)


def _state(env) -> dict:
    path = os.path.join(env["XDG_DATA_HOME"], "rc", "up.json")
    with open(path) as f:
        return json.load(f)


def test_up_run_down_up_run_again(user):
    """Found by a new user: the second `rc up -d && rc run` lost its job to the
    registration of the new worker."""
    for round_ in range(2):
        up = user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "2", timeout=120)
        assert up.returncode == 0, up.stderr
        res = user.run(*HELLO)
        assert res.returncode == 0, (round_, res.stderr)
        assert res.stdout.startswith(b"hello from ")
        assert user.run("down", timeout=120).returncode == 0


def test_up_after_the_controller_was_killed_restarts_only_it(user, env):
    assert user.run("up", "-d", "--listen", "127.0.0.1:0", "--devices", "1",
                    timeout=120).returncode == 0
    job = int(user.run("run", "--detach", "--", "sh", "-c",
                       "for i in 1 2 3 4 5 6; do echo L$i; sleep 0.5; done; exit 3").stdout)
    before = _state(env)
    os.kill(before["serve_pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(before["serve_pid"]), 10, "the controller to die")
    up = user.run("up", "-d", "--devices", "1", timeout=120)
    assert up.returncode == 0, up.stderr
    after = _state(env)
    assert after["worker_pid"] == before["worker_pid"]  # not a second worker
    assert after["url"] == before["url"]
    res = user.run("logs", "-f", str(job))
    assert res.stdout.split() == [f"L{i}".encode() for i in range(1, 7)]
    info = json.loads(user.run("jobs", "-o", "json").stdout)
    assert [(j["id"], j["state"], j["exit_code"]) for j in info] == [(job, "failed", 3)]


def test_up_twice_says_already_up(user):
    assert user.run("up", "-d", "--listen", "127.0.0.1:0", timeout=120).returncode == 0
    again = user.run("up", "-d", "--listen", "127.0.0.1:0", timeout=120)
    assert again.returncode == 1 and b"already up" in again.stderr
