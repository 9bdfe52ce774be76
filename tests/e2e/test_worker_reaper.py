"""The worker as a child subreaper and, as PID 1, the zombie reaper
(docs/design.md#teardown-empty-or-out), end to end with real workers from
dist/rc.pyz: an orphan of a job re-parents to the worker and is reaped when
it exits (never left a zombie); in a PID namespace of its own (`unshare
--pid --fork --mount-proc`, as root) the worker is PID 1 and reaps the
zombies of the container. The reaper never takes the status of a process
the worker waits for itself: every job here still ends with its own exit
code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from rc.worker import procfs
from tests.helpers.harness import Worker
from tests.helpers.wait import wait_until
from tests.helpers.worker_kit import Site, logs, quiet_config, read_pid, submit, wait_state


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("reaper")
    s = Site(root, pyz)
    s.reaping = s.worker("reaping", quiet_config(root))
    yield s
    s.close()


def test_a_double_fork_orphan_re_parents_to_the_worker_and_is_reaped(site, tmp_path):
    script = (
        f"(sh -c 'echo $$ > {tmp_path}/orphan; exec sleep 2' &); "
        f"while [ ! -e {tmp_path}/gone ]; do sleep 0.05; done; exit 3"
    )
    job_id = submit(site.admin, ["sh", "-c", script], cwd=str(tmp_path))
    orphan = read_pid(tmp_path / "orphan")
    worker = site.reaping.proc.pid
    # its parent subshell exited at once: the subreaper, not init, adopts it
    wait_until(
        lambda: (st := procfs.read_stat(orphan)) is not None and st.ppid == worker,
        10,
        "the orphan to re-parent to the worker",
    )
    # once it exits it is reaped, not left a zombie of the worker
    wait_until(lambda: procfs.read_stat(orphan) is None, 15, "the orphan to be reaped")
    (tmp_path / "gone").touch()
    j = wait_state(site.admin, job_id)
    assert (j["state"], j["exit_code"]) == ("failed", 3), j  # its own status, not stolen


PID1_PROBE = """
import os, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    orphan = os.fork()
    if orphan == 0:
        os._exit(0)  # exits at once: a zombie once orphaned, until PID 1 reaps it
    os.write(w, str(orphan).encode())
    os._exit(0)  # the middle child: its child is orphaned
os.close(w)
orphan = int(os.read(r, 32))
os.waitpid(pid, 0)
seen = ""
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        seen = open(f"/proc/{orphan}/stat").read().rpartition(")")[2].split()[:2]
    except OSError:
        print("reaped; pid", os.getpid(), "ppid", os.getppid(), "last seen", seen)
        sys.exit(0)
    time.sleep(0.05)
print("still there:", seen)
sys.exit(1)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="a PID namespace needs root"
)
def test_as_pid_1_in_a_pid_namespace_the_worker_reaps_zombies(site, tmp_path):
    token = site.ctl.token("worker-pid1", "worker")
    cfg = site.root / "pid1.toml"
    cfg.write_text(quiet_config(site.root))
    w = Worker(
        site.ctl.url,
        token,
        site.root / "workers",
        site.env,
        host="pid1",
        devices="",
        pyz=site.pyz,
        config=cfg,
        # unshare ignores SIGTERM: the worker (PID 1 inside) is stopped itself below
        launcher=["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"],
    ).start()
    try:
        _run_the_probe(site, w)
    finally:
        for pid in _children(w.proc.pid):  # SIGTERM reaches PID 1: it has a handler
            os.kill(pid, signal.SIGTERM)
        assert w.stop(timeout=30) == 0, w.log()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _run_the_probe(site, w) -> None:
    wait_until(
        lambda: any(
            v["device"]["host"] == "pid1" and v["device"]["state"] == "ready"
            for v in site.admin.get("/v1/devices")["devices"]
        ),
        30,
        f"the PID-1 worker to register:\n{w.log()}",
    )
    job_id = submit(site.admin, ["python3", "-c", PID1_PROBE], device_id="pid1:cpu0")
    j = wait_state(site.admin, job_id)
    out = logs(site.admin, job_id).decode()
    assert j["state"] == "succeeded", (j, out, w.log())
    assert out.startswith("reaped; pid ") and " ppid 1 " in out, out  # the worker is PID 1


TRACKED_PROBE = """
import os, sys, time
from rc.worker import procfs, reaper, supervise
group = supervise.spawn(["sh", "-c", "exit 7"], cwd=None, env=dict(os.environ))
stray = os.fork()
if stray == 0:
    os._exit(3)
def zombie(pid):
    st = procfs.read_stat(pid)
    return st is not None and st.state == "Z"
deadline = time.monotonic() + 10
while not (zombie(group.pid) and zombie(stray)) and time.monotonic() < deadline:
    time.sleep(0.01)
print(reaper.reap_orphans() == [stray], group.wait(5))
"""


def test_the_reaper_never_takes_the_status_of_a_tracked_child():
    out = subprocess.run(
        [sys.executable, "-c", TRACKED_PROBE],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.stdout.strip() == "True Outcome(exit_code=7, signal=0)", out
