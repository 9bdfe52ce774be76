"""A throwaway controller + worker for benchmarks (loopback, temporary dirs).

Not a test helper: benchmarks print figures and assert nothing about speed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rc.proto.client import Client

BARE_PY = getattr(sys, "_base_executable", None) or sys.executable


def _wait_line(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    buf = b""
    deadline = time.monotonic() + timeout
    os.set_blocking(fd, False)
    while b"\n" not in buf:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("controller did not start")
        try:
            buf += os.read(fd, 1024)
        except BlockingIOError:
            time.sleep(0.02)
    return buf.decode().strip()


@contextlib.contextmanager
def fleet(devices: int = 4, serve_args: tuple[str, ...] = (), worker_config: str = ""):
    """Yield (url, admin Client, user token, tmpdir) for a controller and one
    worker (from a freshly built rc.pyz, under python3 -I) with `devices` CPU
    devices."""
    tmp = Path(tempfile.mkdtemp(prefix="rc-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env["PYTHONPATH"] = str(ROOT)
    pyz = tmp / "rc.pyz"
    subprocess.run(
        [sys.executable, str(ROOT / "zipapp"), "--output", str(pyz)],
        check=True,
        capture_output=True,
    )
    r, w = os.pipe()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rc",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(tmp / "data"),
            "--ready-fd",
            str(w),
            "--socket",
            "",  # no local socket: as root its default, /run/rc/rc.sock, may be a one-box's
            *serve_args,
        ],
        pass_fds=(w,),
        env=env,
        stdout=open(tmp / "serve.log", "wb"),  # noqa: SIM115 - the child keeps it
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    os.close(w)
    worker = None
    try:
        url = _wait_line(r, serve, 30)
        admin = Client(url, (tmp / "data" / "admin.token").read_text().strip())
        wtok = admin.post("/v1/tokens", {"name": "bench-worker", "role": "worker"})["secret"]
        utok = admin.post("/v1/tokens", {"name": "bench", "role": "user"})["secret"]
        (tmp / "worker.token").write_text(wtok)
        args = [
            BARE_PY,
            "-I",
            str(pyz),
            "worker",
            "--controller",
            url,
            "--token-file",
            str(tmp / "worker.token"),
            "--host",
            "bench",
            "--devices",
            f"cpu:{devices}",
        ]
        # every job as this worker's own user: the bench's token names a Unix
        # user ("bench") this machine need not have (README "Security model")
        (tmp / "worker.toml").write_text("shared_account = true\n" + worker_config)
        args += ["--config", str(tmp / "worker.toml")]
        worker = subprocess.Popen(
            args,
            # its host lock (and so its cgroup subtree) in its own TMPDIR: two
            # benches at once each have their worker `bench`
            env={**env, "TMPDIR": str(tmp)},
            stdout=open(tmp / "worker.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
        deadline = time.monotonic() + 30
        while len(admin.get("/v1/devices")["devices"]) < devices:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("worker did not register; see " + str(tmp / "worker.log"))
            time.sleep(0.05)
        yield url, admin, utok, tmp, serve, worker
    finally:
        for proc in (worker, serve):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        os.close(r)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]
