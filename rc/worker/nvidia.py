"""What nvidia-smi says: the GPUs of this host and the compute processes on
them (labels, and the check that a job left nothing on its GPU:
docs/design.md#teardown-empty-or-out).

The parsers are pure functions over nvidia-smi's CSV output
(`--format=csv,noheader,nounits`). The queries run nvidia-smi from PATH with a
timeout and raise NvidiaError when it is missing, fails or hangs.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from rc.proto.errors import RcError

__all__ = [
    "APPS_QUERY",
    "GPU",
    "GPU_QUERY",
    "TIMEOUT_S",
    "ComputeApp",
    "NvidiaError",
    "available",
    "parse_compute_apps",
    "parse_gpus",
    "query_compute_apps",
    "query_gpus",
]

GPU_QUERY = "index,name,memory.total,memory.free,driver_version,uuid"
APPS_QUERY = "gpu_uuid,pid,process_name,used_memory"
TIMEOUT_S = 5.0
"""The longest one nvidia-smi call may take (a wedged driver hangs it)."""
UNAVAILABLE = {
    "",
    "n/a",
    "[n/a]",
    "[not supported]",
    "[unknown error]",
    "[insufficient permissions]",
    "[gpu is lost]",
    "unknown",
}
"""Values nvidia-smi prints for a fact it cannot read: never made into a label."""


class NvidiaError(RcError):
    """nvidia-smi is not on PATH, failed, timed out, or printed nothing usable."""


def _value(text: str) -> str:
    v = text.strip()
    return "" if v.lower() in UNAVAILABLE else v


@dataclass(frozen=True, slots=True)
class GPU:
    """One row of `nvidia-smi --query-gpu=GPU_QUERY`; unavailable facts are ""."""

    index: int
    model: str
    vram_mib: str
    vram_free_mib: str
    driver: str
    uuid: str

    def labels(self) -> dict[str, str]:
        """The labels this GPU gives its device (kind, vendor, model, vram,
        vram_free, driver, uuid); a fact nvidia-smi could not read is left out."""
        out = {
            "kind": "gpu",
            "vendor": "nvidia",
            "model": self.model,
            "vram": _mib(self.vram_mib),
            "vram_free": _mib(self.vram_free_mib),
            "driver": self.driver,
            "uuid": self.uuid,
        }
        return {k: v for k, v in out.items() if v}


def _mib(value: str) -> str:
    return f"{value}M" if value.isdigit() else ""


@dataclass(frozen=True, slots=True)
class ComputeApp:
    """A process holding a compute context on a GPU."""

    gpu_uuid: str
    pid: int
    name: str
    used_mib: str


def parse_gpus(text: str) -> list[GPU]:
    """Parse the --query-gpu CSV. Lines that do not parse are skipped; a model
    name holding commas is kept whole."""
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 6 or not parts[0].strip().isdigit():
            continue
        total, free, driver, uuid = (_value(p) for p in parts[-4:])
        model = _value(",".join(parts[1:-4]))
        out.append(GPU(int(parts[0].strip()), model, total, free, driver, uuid))
    return out


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Parse the --query-compute-apps CSV (a name holding commas is kept
    whole). "No running processes found" and other prose is skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) < 4 or not parts[1].strip().isdigit():
            continue
        out.append(
            ComputeApp(
                parts[0].strip(),
                int(parts[1].strip()),
                ",".join(parts[2:-1]).strip(),
                _value(parts[-1]),
            )
        )
    return out


def available() -> bool:
    """Whether nvidia-smi is on PATH now."""
    return shutil.which("nvidia-smi") is not None


def _run(query: str, timeout: float) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NvidiaError("nvidia-smi is not on PATH")
    try:
        res = subprocess.run(
            [exe, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise NvidiaError(f"nvidia-smi did not answer within {timeout:g}s") from None
    except OSError as e:
        raise NvidiaError(f"cannot run nvidia-smi: {e.strerror or e}") from None
    if res.returncode != 0:
        detail = (res.stderr or res.stdout).decode("utf-8", "replace").strip()[-200:]
        raise NvidiaError(f"nvidia-smi exited {res.returncode}" + (f": {detail}" if detail else ""))
    return res.stdout.decode("utf-8", "replace")


def query_gpus(timeout: float = TIMEOUT_S) -> list[GPU]:
    """Every GPU nvidia-smi lists. Raises NvidiaError."""
    return parse_gpus(_run(f"--query-gpu={GPU_QUERY}", timeout))


def query_compute_apps(timeout: float = TIMEOUT_S) -> list[ComputeApp]:
    """Every compute process on every GPU. Raises NvidiaError."""
    return parse_compute_apps(_run(f"--query-compute-apps={APPS_QUERY}", timeout))
