"""The pid-file lock (rc.proto.pidlock) that keeps one worker per host and one
controller per data dir: exclusive, and its file removed on a clean release
without ever letting two holders in."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.harness import REPO
from tests.helpers.pidlock_contender import CONTENDER


def test_contenders_removing_the_file_never_hold_the_lock_together(tmp_path):
    path, inside = str(tmp_path / "h.lock"), str(tmp_path / "inside")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, path, inside, "300"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate(timeout=10)
        results.append((p.returncode, out, err))
    for code, out, err in results:
        assert code == 0, err.decode()  # FileExistsError: two holders at once
        assert out.strip() == b"300"
    assert not os.path.exists(path)
