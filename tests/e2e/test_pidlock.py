"""The pid-file lock (rc.proto.pidlock) that keeps one worker per host and one
controller per data dir: exclusive, and its file removed on a clean release
without ever letting two holders in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers.harness import REPO

CONTENDER = textwrap.dedent("""
    import os, sys, time
    from rc.proto import pidlock
    path, inside, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    held = 0
    deadline = time.monotonic() + 60
    while held < rounds and time.monotonic() < deadline:
        try:
            fd = pidlock.take(path)
        except pidlock.LockBusy:
            continue
        # nobody else may be inside: the marker must not exist yet
        marker = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(marker)
        os.unlink(inside)
        pidlock.release(fd, path, remove=True)
        held += 1
    print(held)
""")


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
