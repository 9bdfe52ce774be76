"""What tests/e2e/test_run_options.py and its fast-lane half
tests/unit/test_run_options.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers.fleet_users import read_line, start_fleet
from tests.helpers.harness import PY, Cli


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz):
    tmp = tmp_path_factory.mktemp("runopts")
    ctl, w, env = start_fleet(tmp, pyz, [])
    yield (
        ctl,
        {name: Cli(ctl.url, ctl.token(name), env, tmp) for name in ("alice", "bob")},
        w.proc.pid,
    )
    w.stop()
    ctl.stop()


LOOP = ["--", "sh", "-c", "echo started; while :; do echo tick; sleep 0.1; done"]


def _running(cli: Cli, *flags: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """`rc run FLAGS -- a loop`, once its first output line came (rc is then
    following the log, its handlers set); returns the process and the job id."""
    proc = subprocess.Popen(
        [PY, "-m", "rc", "run", *flags, *LOOP],
        env={**cli.env, **(env or {})},
        cwd=cli.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    started = read_line(proc, 30, "the job's first line")
    assert started == "started\n", started
    m = re.fullmatch(r"rc: job (\d+) on box:cpu\d\n", read_line(proc, 10, "the job line", "stderr"))
    assert m
    return proc, int(m[1])
