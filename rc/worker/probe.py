"""What the worker knows about its host and devices.

Built-in host facts (`cpus`, `mem_total_bytes`, `disk_free_bytes`, `kernel`),
device discovery for `devices = "auto" | "cpu:N"`, and the CUDA index of a
device. The probe passes themselves (nvidia-smi, drop-ins, the preservation
rule) are in rc.worker.labels.
"""

from __future__ import annotations

import os
import re

from rc.worker.config import DeviceConfig
from rc.worker.nvidia import GPU

__all__ = [
    "cuda_index",
    "cuda_visible",
    "device_env",
    "discover",
    "host_facts",
    "is_cpu_device",
]

_TRAILING_DIGITS = re.compile(r"(\d+)$")


def host_facts(root: str = "/") -> dict[str, str]:
    """Built-in host-wide labels; a fact that cannot be read is left out.
    disk_free_bytes is the space available to unprivileged users on `root`."""
    facts = {"cpus": str(os.cpu_count() or 0)}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    facts["mem_total_bytes"] = str(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        st = os.statvfs(root)
        facts["disk_free_bytes"] = str(st.f_bavail * st.f_frsize)
    except OSError:
        pass
    try:
        with open("/proc/sys/kernel/osrelease", encoding="ascii") as f:
            facts["kernel"] = f.read().strip()
    except OSError:
        pass
    return facts


def discover(spec: tuple[DeviceConfig, ...] | str, gpus: list[GPU] | None) -> list[DeviceConfig]:
    """The devices to offer: `auto` → one per GPU nvidia-smi lists (gpu0...),
    else 2 CPU devices; `cpu:N` → cpu0..cpuN-1; a tuple → as configured."""
    if isinstance(spec, tuple):
        return list(spec)
    if spec == "auto":
        if gpus:
            return [DeviceConfig(f"gpu{g.index}") for g in sorted(gpus, key=lambda g: g.index)]
        return [DeviceConfig("cpu0"), DeviceConfig("cpu1")]
    n = int(spec.partition(":")[2])
    return [DeviceConfig(f"cpu{i}") for i in range(n)]


def is_cpu_device(name: str) -> bool:
    """cpu0, cpu1, ...: the CPU "devices" of a host without GPUs."""
    return re.fullmatch(r"cpu\d+", name) is not None


def cuda_index(name: str) -> str | None:
    """A device's GPU index, as nvidia-smi numbers GPUs: the trailing digits
    of its name ("gpu3" → "3"); None for CPU devices and names without digits."""
    if is_cpu_device(name):
        return None
    m = _TRAILING_DIGITS.search(name)
    return str(int(m.group(1))) if m else None


def device_env(name: str) -> dict[str, str | None]:
    """CUDA variables for anything run for a device (job, hook, verify):
    CUDA_VISIBLE_DEVICES is the device's GPU index with CUDA_DEVICE_ORDER=
    PCI_BUS_ID, so CUDA numbers GPUs as nvidia-smi does; a CPU device gets
    CUDA_VISIBLE_DEVICES="" (no GPU); a name without an index removes both
    (value None)."""
    if is_cpu_device(name):
        return {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": None}
    idx = cuda_index(name)
    if idx is None:
        return {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
    return {"CUDA_VISIBLE_DEVICES": idx, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def cuda_visible(names: list[str] | tuple[str, ...]) -> str | None:
    """CUDA_VISIBLE_DEVICES for a job on these devices, in their order: their
    GPU indices joined by commas ("3,1"); "" when none is a GPU (CPU devices);
    None (remove the variable) when a device that is no CPU device has no
    index in its name."""
    indices = []
    for name in names:
        if is_cpu_device(name):
            continue
        idx = cuda_index(name)
        if idx is None:
            return None
        indices.append(idx)
    return ",".join(indices)
