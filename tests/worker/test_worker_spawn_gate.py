"""The spawn gate (rc.worker.supervise._spawn_gated): a job with a cgroup,
stdin /dev/null and no user switch starts behind /bin/sh waiting on a pipe
while the worker places it in its cgroup, so subprocess may vfork (no
preexec_fn) and nothing of the job runs outside its cgroup. Real processes
and, as root on a host with a writable hierarchy, a real cgroup; and when
a job's teardown may skip the /proc scan for escapees (job.needs_scan)."""

from __future__ import annotations

import dataclasses

from rc.proto.model import JobKind
from rc.worker import account
from rc.worker.job import needs_scan


def test_the_proc_scan_is_skipped_only_when_the_cgroup_answers_for_everything():
    user = dataclasses.replace(account.own(), uid=1000)
    root = dataclasses.replace(account.own(), uid=0)
    assert not needs_scan(JobKind.JOB, True, user, [])
    assert needs_scan(JobKind.JOB, True, user, [4242])  # its cgroup kill left survivors
    assert needs_scan(JobKind.JOB, False, user, [])  # not placed before it ran
    assert needs_scan(JobKind.JOB, True, root, [])  # root may leave the worker's subtree
    assert needs_scan(JobKind.HOLD, True, user, [])  # a session may run outside any cgroup
    assert needs_scan(JobKind.JOB, True, None, [])
