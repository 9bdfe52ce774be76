"""What tests/e2e/test_worker_spawn_gate.py and its fast-lane half
tests/worker/test_worker_spawn_gate.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import os
import uuid

import pytest

from rc.worker import cgroups, supervise


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
