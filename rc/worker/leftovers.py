"""After a job: the device is empty, or it is out (docs/design.md#teardown-empty-or-out).

Once a job's process group is torn down, three places can still hold
something of it: its group (survivors of SIGKILL), the rest of the machine
(processes that left the group with setsid or a double fork but carry the
job's RC_JOB_ID; rc.worker.supervise.sweep_job ends those), and its GPU: where
nvidia-smi exists, no compute process may remain on the job's GPU. Whatever
remains is named, by pid and command, in the reason the device is quarantined
(`fault`) with. A GPU that cannot be checked (nvidia-smi gone or failing after
it once listed the GPU) counts as not empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rc.worker import nvidia, procfs

__all__ = ["GPU_SETTLE_S", "NAMED_MAX", "describe_pids", "gpu_leftovers"]

GPU_SETTLE_S = 5.0
"""How long a GPU may take to drop the contexts of processes that just died."""
GPU_POLL_S = 0.25
NAMED_MAX = 10
"""Survivors named in a fault reason, at most (the rest are counted)."""


def describe_pids(pids: list[int], command: Callable[[int], str] = procfs.cmdline) -> str:
    """ "pid 12 'sleep 300'; pid 13 'python x.py'" (at most NAMED_MAX, then a count)."""
    parts = [f"pid {p} {command(p)!r}" for p in pids[:NAMED_MAX]]
    if len(pids) > NAMED_MAX:
        parts.append(f"and {len(pids) - NAMED_MAX} more")
    return "; ".join(parts)


def gpu_leftovers(
    uuid: str,
    settle: float = GPU_SETTLE_S,
    query: Callable[[], list[nvidia.ComputeApp]] = nvidia.query_compute_apps,
) -> str:
    """ "" when no compute process remains on GPU `uuid` (waiting up to `settle`
    seconds for contexts to go), else why the GPU is not empty, in words."""
    deadline = time.monotonic() + settle
    while True:
        try:
            apps = [a for a in query() if a.gpu_uuid == uuid]
        except nvidia.NvidiaError as e:
            return f"cannot check that GPU {uuid} is empty: {e}"
        if not apps:
            return ""
        if time.monotonic() >= deadline:
            named = "; ".join(
                f"pid {a.pid} {a.name!r}" + (f" ({a.used_mib} MiB)" if a.used_mib else "")
                for a in apps[:NAMED_MAX]
            )
            more = f"; and {len(apps) - NAMED_MAX} more" if len(apps) > NAMED_MAX else ""
            return f"GPU {uuid} still has compute processes: {named}{more}"
        time.sleep(GPU_POLL_S)
