"""A fake `nvidia-smi` for tests (docs/design.md#testing: no GPUs here), put first on a
worker's PATH. It answers the two queries rc makes, in nvidia-smi's CSV.

`FakeNvidiaSmi(dir, gpus=2)` writes DIR/nvidia-smi; `mode(...)` switches it:
"healthy", "na" (memory reads "[N/A]"), "broken" (exits 9 like a driver that
is gone), "gone" (the executable disappears). `add_app(...)` makes it report a
compute process left on a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness import BARE_PY

SCRIPT = """#!{python}
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
def read(name, default=""):
    try:
        with open(os.path.join(here, name)) as f:
            return f.read()
    except OSError:
        return default
mode = read("mode", "healthy").strip()
if mode == "broken":
    print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    sys.exit(9)
args = " ".join(sys.argv[1:])
if "--query-gpu=" in args:
    for i in range({gpus}):
        total, free = ("[N/A]", "[N/A]") if mode == "na" else ("81920", str(81000 - i))
        print(f"{{i}}, NVIDIA A100-SXM4-80GB, {{total}}, {{free}}, 535.104.05, GPU-fake-{{i}}")
elif "--query-compute-apps=" in args:
    sys.stdout.write(read("apps"))
else:
    print("usage: nvidia-smi (fake)")
"""


class FakeNvidiaSmi:
    """A fake nvidia-smi in `directory` (put that directory first on PATH)."""

    def __init__(self, directory: Path, gpus: int = 2) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "nvidia-smi"
        self.gpus = gpus
        self._write()

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

    def clear_apps(self) -> None:
        (self.dir / "apps").unlink(missing_ok=True)
