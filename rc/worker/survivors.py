"""The survivor scan: what is left of jobs on this host (docs/design.md#teardown-empty-or-out).

One scan serves `rc clear` (is this device empty?), `rc kill` of a lost job
(what is left of it?) and the quarantine re-check. It looks in four places:

- the cgroups of the jobs asked about (`job-<id>`, `session-<id>-*` under
  the worker's subtree, rc.worker.cgroups), which outlive a worker process
  that was killed;
- every process carrying RC_HOST=<this host> and an RC_JOB_ID among the
  jobs asked about, or RC_DEVICES naming a device asked about;
- nvidia-smi's compute processes on the devices' GPUs.

Processes of jobs this worker process runs right now are never counted.
`end()` ends what a scan found: SIGTERM, up to `grace`, SIGKILL (cgroups
by their own kill). Every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rc.proto.wire import Survivor
from rc.worker import cgroups, nvidia, procfs

__all__ = ["Scan", "end", "scan"]


@dataclass
class Scan:
    """What a scan found: survivors (pid → Survivor), whether it could read
    every process (`complete`), and the cgroups it looked in."""

    found: dict[int, Survivor] = field(default_factory=dict)
    complete: bool = True
    groups: list[cgroups.Cgroup] = field(default_factory=list)

    @property
    def survivors(self) -> tuple[Survivor, ...]:
        """The survivors, by pid."""
        return tuple(self.found[p] for p in sorted(self.found))

    def add(self, pid: int, where: str) -> None:
        if pid not in self.found:
            self.found[pid] = Survivor(pid, procfs.cmdline(pid), where)


def _job_of(name: str) -> int | None:
    """The job id of a cgroup name: job-17 → 17, session-17-2 → 17."""
    parts = name.split("-")
    if len(parts) >= 2 and parts[0] in ("job", "session") and parts[1].isdigit():
        return int(parts[1])
    return None


def scan(
    tracker: cgroups.Tracker,
    host: str,
    device_ids: Iterable[str] = (),
    job_ids: Iterable[int] = (),
    running: set[int] | frozenset[int] = frozenset(),
    gpu_uuid: Callable[[str], str] = lambda name: "",
    query: Callable[[], list[nvidia.ComputeApp]] = nvidia.query_compute_apps,
    every_job: bool = False,
) -> Scan:
    """Look for what is left of `job_ids` (`every_job`: of any job), or of
    any job on `device_ids`, on this host; jobs in `running` (this
    worker's, now) are skipped. `gpu_uuid(device name)` names a device's
    GPU ("" for none)."""
    devices = set(device_ids)
    jobs = {int(j) for j in job_ids} - set(running)
    out = Scan()
    me = procfs.ancestors()
    _scan_cgroups(out, tracker, jobs, running, every_job, me)
    if not _scan_processes(out, host, jobs, devices, running, every_job, me):
        return Scan(out.found, False, out.groups)
    _scan_gpus(out, devices, gpu_uuid, query, me)
    return out


def _scan_cgroups(out: Scan, tracker, jobs: set[int], running, every_job: bool, me) -> None:
    """Add to `out` the cgroups of `jobs` (`every_job`: of any job but those
    `running`) and their live processes, none of `me` (this process and its
    ancestors); a cgroup that cannot be read makes the scan incomplete."""
    for cg in tracker.children():
        owner = _job_of(cg.name)
        if owner is None or owner in running:
            continue
        if owner in jobs or every_job:
            out.groups.append(cg)
            try:
                for pid in cg.live_pids():
                    if pid not in me:
                        out.add(pid, f"cgroup {cg.name}")
            except OSError:
                out.complete = False


def _scan_processes(
    out: Scan, host: str, jobs: set[int], devices: set[str], running, every_job: bool, me
) -> bool:
    """Add to `out` every live process whose environment has RC_HOST=`host`
    and an RC_JOB_ID among `jobs` (`every_job`: any but those `running`), or
    RC_DEVICES naming one of `devices`; none of `me`. A live process whose
    environment cannot be read makes the scan incomplete. Returns False
    when /proc itself cannot be listed."""
    want_host = host.encode()
    want_jobs = {str(j).encode() for j in jobs}
    want_devices = {d.encode() for d in devices}
    try:
        pids = [int(n) for n in os.listdir(procfs.PROC) if n.isdigit()]
    except OSError:
        return False
    for pid in pids:
        if pid in me:
            continue
        try:
            env = procfs.read_file(f"{procfs.PROC}/{pid}/environ")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            st = procfs.read_stat(pid)
            if st is not None and st.live:
                out.complete = False
            continue
        if b"RC_JOB_ID=" not in env:
            continue
        job = procfs.parse_environ_value(env, b"RC_JOB_ID") or b""
        if not job or procfs.parse_environ_value(env, b"RC_HOST") != want_host:
            continue
        if job.isdigit() and int(job) in running:
            continue
        named = set((procfs.parse_environ_value(env, b"RC_DEVICES") or b"").split(b","))
        if every_job or job in want_jobs or named & want_devices:
            st = procfs.read_stat(pid)
            if st is not None and st.live:
                out.add(pid, f"RC_JOB_ID={job.decode('ascii', 'replace')}")
    return True


def _scan_gpus(
    out: Scan,
    devices: set[str],
    gpu_uuid: Callable[[str], str],
    query: Callable[[], list[nvidia.ComputeApp]],
    me,
) -> None:
    """Add to `out` nvidia-smi's compute processes (`query`) on the GPUs of
    `devices` (`gpu_uuid(device name)`), none of `me`; nvidia-smi failing
    makes the scan incomplete."""
    uuids = {gpu_uuid(d.rpartition(":")[2]): d for d in devices}
    uuids.pop("", None)
    if uuids:
        try:
            for app in query():
                if app.gpu_uuid in uuids and app.pid not in me:
                    out.add(app.pid, f"GPU {app.gpu_uuid}")
        except nvidia.NvidiaError:
            out.complete = False


def _alive(pids: Iterable[int]) -> list[int]:
    out = []
    for pid in pids:
        st = procfs.read_stat(pid)
        if st is not None and st.live:
            out.append(pid)
    return out


def end(found: Scan, grace: float) -> None:
    """End what `found` holds: SIGTERM to each, up to `grace` seconds, then
    SIGKILL (each cgroup by its own kill, rc.worker.cgroups)."""
    pids = list(found.found)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for cg in found.groups:
        try:
            cg.kill()
        except OSError:
            pass
    for pid in _alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + cgroups.KILL_WAIT_S
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
