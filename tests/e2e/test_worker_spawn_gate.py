"""The spawn gate (rc.worker.supervise._spawn_gated): a job with a cgroup,
stdin /dev/null and no user switch starts behind /bin/sh waiting on a pipe
while the worker places it in its cgroup, so subprocess may vfork (no
preexec_fn) and nothing of the job runs outside its cgroup. Real processes
and, as root on a host with a writable hierarchy, a real cgroup; and when
a job's teardown may skip the /proc scan for escapees (job.needs_scan)."""

from __future__ import annotations

import os
import subprocess

import pytest

from rc.worker import supervise
from tests.helpers.spawn_gate import (
    _run,
    cgroup,  # noqa: F401 (fixtures)
)


def test_a_gated_job_is_in_its_cgroup_when_its_program_starts(tmp_path, cgroup):
    group, outcome, text = _run(["cat", "/proc/self/cgroup"], tmp_path, cgroup)
    assert outcome.exit_code == 0, text
    assert group.joined
    rel = "/".join(cgroup.path.split("/")[-2:])  # rc-worker-.../job-1
    assert any(line.endswith(rel) for line in text.splitlines()), (rel, text)


def test_a_gated_job_gets_exactly_its_environment_and_dev_null_stdin(tmp_path, cgroup):
    env = {"PATH": os.defpath, "RC_JOB_ID": "1", "A": "b c"}
    _, outcome, text = _run(["env"], tmp_path, cgroup, env)
    assert outcome.exit_code == 0, text
    assert sorted(text.splitlines()) == sorted(f"{k}={v}" for k, v in env.items())
    _, outcome, text = _run(["readlink", "/proc/self/fd/0"], tmp_path, cgroup)
    assert text.strip() == "/dev/null"


def test_a_gated_job_refuses_to_start_as_exec_would(tmp_path, cgroup):
    with pytest.raises(FileNotFoundError):
        supervise.spawn(
            ["no-such-program-rc"], cwd=str(tmp_path), env={"PATH": "/x"}, cgroup=cgroup
        )
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        supervise.spawn(["./plain"], cwd=str(tmp_path), env={}, cgroup=cgroup)
    with pytest.raises(PermissionError):
        supervise.spawn([str(tmp_path)], cwd=str(tmp_path), env={}, cgroup=cgroup)
    assert cgroup.pids() == []


def test_a_gate_that_is_never_opened_runs_nothing(tmp_path):
    """The worker gave up before placing the job (end of file on the pipe):
    the gate exits 125 and the job's program never ran."""
    r, w = os.pipe()
    os.close(w)
    marker = tmp_path / "ran"
    done = subprocess.run(
        [supervise.SH, "-c", supervise.GATE, "rc-gate", "touch", str(marker)],
        stdin=r,
        timeout=10,
        check=False,
    )
    os.close(r)
    assert done.returncode == 125
    assert not marker.exists()
