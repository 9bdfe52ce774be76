"""After a job: the device is empty, or it is out (docs/design.md#teardown-empty-or-out).

Once a job's process group is torn down, four places can still hold
something of it: its group (survivors of SIGKILL), its cgroup where the host
has one (rc.worker.cgroups: members whatever they did), the rest of the
machine (processes that left the group with setsid or a double fork but
carry the job's RC_JOB_ID; rc.worker.supervise.sweep_job ends those), and its GPUs:
where nvidia-smi exists, no compute process may remain on any of them. Whatever
remains is named, by pid and command, in the reason the device is quarantined
(`fault`) with. A GPU that cannot be checked (nvidia-smi gone or failing after
it once listed the GPU) counts as not empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from rc.worker import nvidia, procfs

__all__ = [
    "GPU_SETTLE_S",
    "NAMED_MAX",
    "describe_pids",
    "device_faults",
    "gpu_leftovers",
    "gpus_leftovers",
]

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


def device_faults(
    device_ids: tuple[str, ...] | list[str], survivors: str, on_gpu: Mapping[str, str]
) -> dict[str, str]:
    """Which of a job's devices its leftovers quarantine, and why (device id →
    reason), in the job's order. `survivors` names processes of the job found
    alive after teardown in its group or by its RC_JOB_ID ("" for none):
    they are on no device in particular, so they fault every device.
    `on_gpu` maps a device to the compute processes left on its GPU: they
    fault that device alone."""
    out = {}
    for d in device_ids:
        problems = [survivors] if survivors else []
        if on_gpu.get(d):
            problems.append(on_gpu[d])
        if problems:
            out[d] = "; ".join(problems)
    return out


def gpu_leftovers(
    uuid: str,
    settle: float = GPU_SETTLE_S,
    query: Callable[[], list[nvidia.ComputeApp]] = nvidia.query_compute_apps,
) -> str:
    """ "" when no compute process remains on GPU `uuid` (waiting up to `settle`
    seconds for contexts to go), else why the GPU is not empty, in words."""
    return gpus_leftovers([uuid], settle, query).get(uuid, "")


def gpus_leftovers(
    uuids: list[str],
    settle: float = GPU_SETTLE_S,
    query: Callable[[], list[nvidia.ComputeApp]] = nvidia.query_compute_apps,
) -> dict[str, str]:
    """The GPUs among `uuids` that still have a compute process, each with
    why in words, after waiting up to `settle` seconds (one wait for all)
    for contexts to go; {} when every one is empty. A GPU that cannot be
    checked is not empty."""
    deadline = time.monotonic() + settle
    while True:
        try:
            found = query()
        except nvidia.NvidiaError as e:
            return {u: f"cannot check that GPU {u} is empty: {e}" for u in uuids}
        busy = {u: [a for a in found if a.gpu_uuid == u] for u in uuids}
        busy = {u: left for u, left in busy.items() if left}
        if not busy:
            return {}
        if time.monotonic() >= deadline:
            out = {}
            for u, left in busy.items():
                named = "; ".join(
                    f"pid {a.pid} {a.name!r}" + (f" ({a.used_mib} MiB)" if a.used_mib else "")
                    for a in left[:NAMED_MAX]
                )
                more = f"; and {len(left) - NAMED_MAX} more" if len(left) > NAMED_MAX else ""
                out[u] = f"GPU {u} still has compute processes: {named}{more}"
            return out
        time.sleep(GPU_POLL_S)
