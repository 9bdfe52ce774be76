"""`rc doctor` and `rc serve` on a state directory that a reboot empties:
a tmpfs mounted in a private mount namespace the test creates (unshare -m),
so this machine's own mounts are never touched."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers.harness import REPO, base_env

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux")


def _in_tmpfs(tmp_path, script: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run `script` (sh) with $D a fresh tmpfs, in a mount namespace of its own."""
    d = tmp_path / "volatile"
    d.mkdir()
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size=8m rc-test "$D" && {script}'],
        env={**base_env(tmp_path / "home"), "D": str(d), "PY": sys.executable},
        cwd=REPO,
        capture_output=True,
        timeout=timeout,
        check=False,
    )  # fmt: skip


def test_doctor_fails_a_state_directory_on_tmpfs(tmp_path):
    res = _in_tmpfs(tmp_path, '"$PY" -m rc doctor --local --data "$D" --socket ""')
    out = res.stdout.decode()
    assert res.returncode == 1, out + res.stderr.decode()
    assert "FAIL state directory: " in out and " is on tmpfs " in out, out
    assert "a reboot empties it" in out


def test_doctor_passes_a_state_directory_on_disk(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "rc", "doctor", "--local", "--data", str(data), "-o", "json"],
        env=base_env(tmp_path / "home"),
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    import json

    checks = {c["what"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["state directory"]["status"] == "ok"
    assert {"cgroups", "nvidia-smi", "clock", "open files", "local socket"} <= set(checks)


def test_serve_warns_at_start_when_its_state_is_on_tmpfs(tmp_path):
    # rc serve prints its warning after it listens; --ready-fd is not needed:
    # it is stopped by timeout(1) once it has had time to start and say it
    res = _in_tmpfs(
        tmp_path,
        'timeout -s INT 20 "$PY" -m rc serve --listen 127.0.0.1:0 --data "$D" --socket "" '
        '2>"$D/err" & pid=$!; '
        'i=0; while [ $i -lt 400 ] && ! grep -q "warning" "$D/err"; do sleep 0.05; i=$((i+1)); done; '
        'kill -INT $pid; wait $pid; cat "$D/err" >&2',
    )
    err = res.stderr.decode()
    assert "rc serve: warning: the state directory " in err, err
    assert " is on tmpfs " in err and "put it on a disk" in err
