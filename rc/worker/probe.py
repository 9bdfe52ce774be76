"""What the worker knows about its host and devices (inventory §6.8).

Built-in host facts (`cpus`, `mem_total_bytes`, `disk_free_bytes`, `kernel`),
nvidia-smi rows for GPUs, and device discovery for `--devices auto|cpu:N`.
The nvidia-smi parser is a pure function over its CSV output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from rc.worker.config import DeviceConfig

__all__ = [
    "GPU",
    "Device",
    "host_facts",
    "parse_nvidia_smi",
    "query_gpus",
    "discover",
    "cuda_index",
    "NVIDIA_QUERY",
]

NVIDIA_QUERY = "index,name,memory.total,memory.free,driver_version,uuid"
NVIDIA_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class GPU:
    """One row of nvidia-smi --query-gpu."""

    index: int
    model: str
    vram_mib: str
    vram_free_mib: str
    driver: str
    uuid: str

    def labels(self) -> dict[str, str]:
        """The labels this GPU gives its device (inventory §6.8 plus uuid)."""
        return {
            "kind": "gpu",
            "vendor": "nvidia",
            "model": self.model,
            "vram": _mib(self.vram_mib),
            "vram_free": _mib(self.vram_free_mib),
            "driver": self.driver,
            "uuid": self.uuid,
        }


def _mib(value: str) -> str:
    v = value.strip()
    return f"{v}M" if v.isdigit() else v


@dataclass(frozen=True, slots=True)
class Device:
    """A device this worker offers, as configured plus what probes found."""

    config: DeviceConfig
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name


def parse_nvidia_smi(text: str) -> list[GPU]:
    """Parse `nvidia-smi --query-gpu=NVIDIA_QUERY --format=csv,noheader,nounits`.

    Malformed lines are skipped; values such as "[N/A]" are kept as they are
    (a selector never matches them numerically).
    """
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        out.append(GPU(int(parts[0]), parts[1], parts[2], parts[3], parts[4], parts[5]))
    return out


def query_gpus(timeout: float = NVIDIA_TIMEOUT_S) -> list[GPU] | None:
    """GPUs from nvidia-smi; None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return parse_nvidia_smi(res.stdout.decode("utf-8", "replace"))


def host_facts() -> dict[str, str]:
    """Built-in host-wide labels; a fact that cannot be read is left out."""
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
        st = os.statvfs("/")
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
            return [DeviceConfig(f"gpu{g.index}") for g in gpus]
        return [DeviceConfig("cpu0"), DeviceConfig("cpu1")]
    n = int(spec.partition(":")[2])
    return [DeviceConfig(f"cpu{i}") for i in range(n)]


def cuda_index(name: str) -> str | None:
    """CUDA_VISIBLE_DEVICES for a device: its trailing digits for GPU-style
    names, "" (no GPU) for CPU devices, None (leave unset) otherwise."""
    if name.startswith("cpu"):
        return ""
    m = re.search(r"(\d+)$", name)
    return m.group(1) if m else None


def device_labels(d: DeviceConfig, gpus: list[GPU] | None) -> dict[str, str]:
    """Detected labels of one device: nvidia-smi's for gpuN, kind=cpu for cpuN."""
    if d.name.startswith("cpu"):
        return {"kind": "cpu"}
    idx = cuda_index(d.name)
    if gpus and idx:
        for g in gpus:
            if str(g.index) == idx:
                return g.labels()
    return {}
