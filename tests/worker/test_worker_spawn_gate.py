"""The spawn gate (rc.worker.supervise._spawn_gated): a job with a cgroup,
stdin /dev/null and no user switch starts behind /bin/sh waiting on a pipe
while the worker places it in its cgroup, so subprocess may vfork (no
preexec_fn) and nothing of the job runs outside its cgroup. Real processes
and, as root on a host with a writable hierarchy, a real cgroup; and when
a job's teardown may skip the /proc scan for escapees (job.needs_scan)."""

from __future__ import annotations

import dataclasses
import os
import uuid

import pytest

from rc.proto.model import JobKind
from rc.worker import account, cgroups, supervise
from rc.worker.job import needs_scan


@pytest.fixture
def cgroup():
    tracker = cgroups.Tracker.detect(f"gate-{uuid.uuid4().hex[:8]}")
    if tracker.mode == cgroups.SCAN:
        pytest.skip(f"no writable cgroup hierarchy here: {tracker.why}")
    cg = tracker.create("job-1")
    assert cg is not None
    yield cg
    cg.kill()
    cg.remove()
    tracker.close()


def _run(argv, tmp_path, cg, env=None):
    out = tmp_path / "out"
    with open(out, "wb") as f:
        group = supervise.spawn(
            argv, cwd=str(tmp_path), env=env or {"PATH": os.defpath}, stdout=f, stderr=f, cgroup=cg
        )
    outcome = group.wait(10)
    assert outcome is not None, "the job did not end within 10 s"
    return group, outcome, out.read_text()


def test_the_proc_scan_is_skipped_only_when_the_cgroup_answers_for_everything():
    user = dataclasses.replace(account.own(), uid=1000)
    root = dataclasses.replace(account.own(), uid=0)
    assert not needs_scan(JobKind.JOB, True, user, [])
    assert needs_scan(JobKind.JOB, True, user, [4242])  # its cgroup kill left survivors
    assert needs_scan(JobKind.JOB, False, user, [])  # not placed before it ran
    assert needs_scan(JobKind.JOB, True, root, [])  # root may leave the worker's subtree
    assert needs_scan(JobKind.HOLD, True, user, [])  # a session may run outside any cgroup
    assert needs_scan(JobKind.JOB, True, None, [])
