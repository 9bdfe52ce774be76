"""What nvidia-smi says: the GPUs of this host, the compute processes on
them (labels, and the check that a job left nothing on its GPUs:
docs/design.md#teardown-empty-or-out), and how they are connected
(`nvidia-smi topo -m`, for placement: README "Several devices for one job").

The parsers are pure functions over nvidia-smi's output: CSV
(`--format=csv,noheader,nounits`) for the queries, the matrix of `topo -m`
for the topology. The queries run nvidia-smi from PATH with a timeout and
raise NvidiaError when it is missing, fails or hangs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from rc.proto.errors import RcError
from rc.proto.model import Link
from rc.worker import reaper

__all__ = [
    "APPS_QUERY",
    "GPU",
    "GPU_QUERY",
    "TIMEOUT_S",
    "ComputeApp",
    "NvidiaError",
    "NvidiaTimeout",
    "Topology",
    "available",
    "link_class",
    "parse_compute_apps",
    "parse_gpus",
    "parse_topology",
    "query_compute_apps",
    "query_gpus",
    "query_topology",
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


class NvidiaTimeout(NvidiaError):
    """nvidia-smi did not answer in time (a hung driver): the worker keeps
    its GPUs out of the pool until it answers again (README "GPU health")."""


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


@dataclass(frozen=True, slots=True)
class Topology:
    """What `nvidia-smi topo -m` says: links[(i, j)] (GPU indices, i < j) is
    the Link between GPU i and GPU j; numa[i] is GPU i's NUMA node ("" when
    the output does not say). Empty when the output could not be read."""

    links: dict[tuple[int, int], Link] = field(default_factory=dict)
    numa: dict[int, str] = field(default_factory=dict)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU = re.compile(r"GPU(\d+)")
_NV = re.compile(r"NV\d+")
_WORDS = {("CPU", "Affinity"): "CPU Affinity", ("NUMA", "Affinity"): "NUMA Affinity"}


def link_class(cell: str) -> Link:
    """The Link a cell of the matrix names: NV# (any number of NVLinks) is NV;
    PIX, PXB, PHB, NODE and SYS are themselves; SOC (older drivers' name for
    SYS) is SYS; anything else is UNKNOWN."""
    cell = cell.strip().upper()
    if _NV.fullmatch(cell):
        return Link.NV
    if cell == "SOC":
        return Link.SYS
    if cell in ("PIX", "PXB", "PHB", "NODE", "SYS"):
        return Link(cell)
    return Link.UNKNOWN


def _header(tokens: list[str]) -> list[str]:
    """Column names from the header's words: "CPU Affinity", "NUMA
    Affinity" and "GPU NUMA ID" are one column each."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i : i + 3] == ["GPU", "NUMA", "ID"]:
            out.append("GPU NUMA ID")
            i += 3
        elif tuple(tokens[i : i + 2]) in _WORDS:
            out.append(_WORDS[tuple(tokens[i : i + 2])])
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def parse_topology(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`: the header names the columns (GPU0...,
    NIC0..., CPU Affinity, NUMA Affinity, GPU NUMA ID), each GPUn row gives
    its link to every column. Terminal escapes, NIC rows and the legend are
    ignored; a pair the two rows disagree on gets the worse link. Output that
    does not parse gives an empty Topology, never an error."""
    columns: list[str] | None = None
    links: dict[tuple[int, int], Link] = {}
    numa: dict[int, str] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        tokens = line.split()
        if not tokens:
            continue
        if columns is None:
            if _GPU.fullmatch(tokens[0]) and "X" not in tokens:  # not a row: it has no self
                columns = _header(tokens)  # the header: GPU0 GPU1 ... NIC0 ... CPU Affinity ...
            continue
        row = _GPU.fullmatch(tokens[0])
        if row is None:
            if tokens[0].startswith("Legend"):
                break
            continue
        i = int(row.group(1))
        cells = tokens[1:]
        me = cells.index("X") if "X" in cells else len(columns)
        if me >= len(columns) or columns[me] != f"GPU{i}":
            continue  # its self is not in its own column: the cells do not line up
        for name, cell in zip(columns, cells, strict=False):
            col = _GPU.fullmatch(name)
            if col is not None:
                j = int(col.group(1))
                if j == i:
                    continue
                key = (min(i, j), max(i, j))
                link = link_class(cell)
                old = links.get(key)
                links[key] = link if old is None or link.rank > old.rank else old
            elif name == "NUMA Affinity" and cell.isdigit():
                numa[i] = cell
    return Topology(links, numa)


def available() -> bool:
    """Whether nvidia-smi is on PATH now."""
    return shutil.which("nvidia-smi") is not None


def _run(query: str, timeout: float) -> str:
    return _nvidia_smi([query, "--format=csv,noheader,nounits"], timeout)


def _nvidia_smi(args: list[str], timeout: float) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NvidiaError("nvidia-smi is not on PATH")
    try:
        with reaper.spawning():  # its status is ours: the orphan reaper never takes it
            proc = subprocess.Popen(
                [exe, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            reaper.track(proc.pid)
    except OSError as e:
        raise NvidiaError(f"cannot run nvidia-smi: {e.strerror or e}") from None
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise NvidiaTimeout(f"nvidia-smi did not answer within {timeout:g}s") from None
    finally:
        reaper.untrack(proc.pid)
    if proc.returncode != 0:
        detail = (err or out).decode("utf-8", "replace").strip()[-200:]
        raise NvidiaError(
            f"nvidia-smi exited {proc.returncode}" + (f": {detail}" if detail else "")
        )
    return out.decode("utf-8", "replace")


def query_gpus(timeout: float = TIMEOUT_S) -> list[GPU]:
    """Every GPU nvidia-smi lists. Raises NvidiaError."""
    return parse_gpus(_run(f"--query-gpu={GPU_QUERY}", timeout))


def query_compute_apps(timeout: float = TIMEOUT_S) -> list[ComputeApp]:
    """Every compute process on every GPU. Raises NvidiaError."""
    return parse_compute_apps(_run(f"--query-compute-apps={APPS_QUERY}", timeout))


def query_topology(timeout: float = TIMEOUT_S) -> Topology:
    """How this host's GPUs are connected (`nvidia-smi topo -m`). Raises
    NvidiaError when nvidia-smi is missing, fails or hangs; output it cannot
    read is an empty Topology."""
    return parse_topology(_nvidia_smi(["topo", "-m"], timeout))
