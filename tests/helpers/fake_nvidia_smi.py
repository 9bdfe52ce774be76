"""A fake `nvidia-smi` for tests (docs/design.md#testing: no GPUs here), put
first on a worker's PATH. It answers the two queries rc makes, in nvidia-smi's
CSV, and `topo -m` with a matrix as nvidia-smi prints it.

`FakeNvidiaSmi(dir, gpus=2, topo=...)` writes DIR/nvidia-smi. It answers any
`--query-gpu=FIELDS` list from a per-GPU table (healthy defaults; `set_gpu(i,
field=value)` changes one; a field it does not know is "[N/A]"; `refuse(f)`
makes it reject a field as an older driver does). `kmsg_xid(...)` writes a
/dev/kmsg record of an Xid for a fake kernel log file. `mode(...)`
switches it: "healthy", "na" (memory reads "[N/A]"), "broken" (exits 9 like
a driver that is gone), "hang" (never answers), "gone" (the executable
disappears). `add_app(...)`
makes it report a compute process left on a GPU; `utilization(...)` sets
each GPU's utilization.gpu. `topo` is what `topo -m`
prints: `topo_matrix(n, link)` builds one (the default: every pair PHB, all
on NUMA node 0), `QUADS` is 8 GPUs as two NVLink quads; `set_topo(text)`
changes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers.harness import BARE_PY

SCRIPT = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
def read(name, default=""):
    try:
        with open(os.path.join(here, name)) as f:
            return f.read()
    except OSError:
        return default
mode = read("mode", "healthy").strip()
if mode == "hang":  # a driver that never answers: the caller's timeout must end it
    import time
    time.sleep(3600)
if mode == "broken":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
args = " ".join(sys.argv[1:])
table = json.loads(read("table.json", "{{}}"))
def row(i):
    total, free = ("[N/A]", "[N/A]") if mode == "na" else ("81920", str(81000 - i))
    r = {{
        "index": str(i), "name": "NVIDIA A100-SXM4-80GB", "memory.total": total,
        "memory.free": free, "driver_version": "535.104.05", "uuid": f"GPU-fake-{{i}}",
        "pci.bus_id": f"00000000:{{0x10 + i:02X}}:00.0",
        "ecc.errors.uncorrected.volatile.total": "0",
        "ecc.errors.uncorrected.aggregate.total": "0",
        "remapped_rows.pending": "No", "remapped_rows.failure": "No",
        "retired_pages.pending": "[N/A]",
        "clocks_throttle_reasons.hw_slowdown": "Not Active",
        "clocks_throttle_reasons.hw_thermal_slowdown": "Not Active",
        "clocks_throttle_reasons.hw_power_brake_slowdown": "Not Active",
        "pcie.link.gen.current": "4", "pcie.link.gen.max": "4",
        "pcie.link.width.current": "16", "pcie.link.width.max": "16",
        "temperature.gpu": "41", "power.draw": "63.21", "utilization.gpu": "0",
    }}
    r.update(table.get(str(i), {{}}))
    return r
for a in sys.argv[1:]:
    if a.startswith("--query-gpu="):
        fields = a.partition("=")[2].split(",")
        refused = [f for f in fields if f in table.get("refuse", [])]
        if refused:
            print(f'Field "{{refused[0]}}" is not a valid field to query.')
            print("Run 'nvidia-smi --help-query-gpu' for more information.")
            sys.exit(2)
        for i in range({gpus}):
            r = row(i)
            print(", ".join(r.get(f, "[N/A]") for f in fields))
        break
else:
    if "--query-compute-apps=" in args:
        sys.stdout.write(read("apps"))
    elif args == "topo -m":
        sys.stdout.write(read("topo"))
    else:
        print("usage: nvidia-smi (fake)")
"""


def topo_matrix(n: int, link=lambda i, j: "PHB", numa=lambda i: "0") -> str:
    """`nvidia-smi topo -m` for `n` GPUs: link(i, j) names each pair's link
    (NV12, PIX, SYS, ...), numa(i) each GPU's NUMA node; tab-separated, the
    header underlined with terminal escapes, a NIC column and the legend, as
    the real one prints them."""
    head = "".join(f"\tGPU{i}" for i in range(n))
    lines = [f"\x1b[4m{head}\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"]
    for i in range(n):
        cells = "".join("\t X " if i == j else f"\t{link(i, j)}" for j in range(n))
        lines.append(f"GPU{i}{cells}\tPXB\t0-15\t{numa(i)}\t\tN/A")
    lines.append("NIC0" + "\tPXB" * n + "\t X ")
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set"]
    return "\n".join(lines) + "\n"


QUADS = topo_matrix(
    8, lambda i, j: "NV12" if (i < 4) == (j < 4) else "SYS", lambda i: "0" if i < 4 else "1"
)
"""8 GPUs: NVLink within gpu0-3 and within gpu4-7, SYS between the two quads."""


class FakeNvidiaSmi:
    """A fake nvidia-smi in `directory` (put that directory first on PATH)."""

    def __init__(self, directory: Path, gpus: int = 2, topo: str | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "nvidia-smi"
        self.gpus = gpus
        self._write()
        self.set_topo(topo if topo is not None else topo_matrix(gpus))

    def set_topo(self, text: str) -> None:
        """What `nvidia-smi topo -m` prints from now on."""
        (self.dir / "topo").write_text(text)

    def _write(self) -> None:
        self.path.write_text(SCRIPT.format(python=BARE_PY, gpus=self.gpus))
        self.path.chmod(0o755)

    def path_env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with this fake first on PATH."""
        return {**env, "PATH": f"{self.dir}{os.pathsep}{env.get('PATH', '')}"}

    def mode(self, mode: str) -> None:
        if mode == "gone":
            self.path.unlink(missing_ok=True)
            return
        if not self.path.exists():
            self._write()
        (self.dir / "mode").write_text(mode)

    def add_app(self, gpu: int, pid: int, name: str, mib: int = 512) -> None:
        with open(self.dir / "apps", "a") as f:
            f.write(f"GPU-fake-{gpu}, {pid}, {name}, {mib}\n")

    def utilization(self, *percent: int) -> None:
        """What `--query-gpu=...,utilization.gpu` reports per GPU from now on
        (percent, GPU 0 first; the rest 0)."""
        table = self._table()
        for i in range(self.gpus):
            value = str(percent[i]) if i < len(percent) else "0"
            table.setdefault(str(i), {})["utilization.gpu"] = value
        (self.dir / "table.json").write_text(json.dumps(table))

    def clear_apps(self) -> None:
        (self.dir / "apps").unlink(missing_ok=True)

    def _table(self) -> dict:
        path = self.dir / "table.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def set_gpu(self, gpu: int, **fields: str) -> None:
        """What --query-gpu answers for GPU `gpu` from now on: each keyword is
        a field with "." spelled "__" (pcie__link__width__current="8");
        the value is printed as given ("[N/A]", "Active", "3")."""
        table = self._table()
        table.setdefault(str(gpu), {}).update({k.replace("__", "."): v for k, v in fields.items()})
        (self.dir / "table.json").write_text(json.dumps(table))

    def refuse(self, *fields: str) -> None:
        """Answer a --query-gpu naming any of `fields` as an older nvidia-smi
        does: 'Field "F" is not a valid field to query.', exit 2."""
        table = self._table()
        table["refuse"] = list(fields)
        (self.dir / "table.json").write_text(json.dumps(table))


def kmsg_xid(seq: int, usec: int, gpu: int, xid: int, text: str = "") -> str:
    """A /dev/kmsg record of an NVRM Xid on fake GPU `gpu` (its PCI address
    as the fake's pci.bus_id gives it)."""
    what = text or "GPU has fallen off the bus."
    return f"3,{seq},{usec},-;NVRM: Xid (PCI:0000:{0x10 + gpu:02x}:00): {xid}, pid=1234, {what}\n"
