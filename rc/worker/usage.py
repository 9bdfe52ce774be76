"""Whether each running hold was in use since the last heartbeat (the idle
rule of holds: README "Holds: the idle rule").

Between two samples, a hold is busy when

- a GPU of the hold shows `utilization.gpu` above `GPU_BUSY_PCT` percent
  (`nvidia-smi --query-gpu=index,utilization.gpu`), read at the sample;
- on CPU devices, its processes (those carrying its RC_JOB_ID and this
  worker's marker) used more than `CPU_BUSY_PCT` percent of one core on
  average since the previous sample (utime + stime from /proc/PID/stat).

Kept apart from rc.worker.nvidia (one query of its own) so each can change
alone. Pure parsing (`parse_utilization`, `cpu_ticks`) is tested on text.
"""

from __future__ import annotations

import logging
import os

from rc.proto.wire import HoldUse
from rc.worker import nvidia, procfs
from rc.worker.probe import cuda_index, is_cpu_device

__all__ = [
    "CPU_BUSY_PCT",
    "GPU_BUSY_PCT",
    "UTIL_QUERY",
    "Sampler",
    "cpu_ticks",
    "parse_utilization",
]

log = logging.getLogger("rc.worker.usage")

GPU_BUSY_PCT = 5
"""utilization.gpu above this (percent) is use of the GPU."""
CPU_BUSY_PCT = 10
"""A hold's processes above this share of one core (percent) are use."""
UTIL_QUERY = "index,utilization.gpu"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_utilization(text: str) -> dict[str, int]:
    """`nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits`
    → {index: percent}; a line that does not read ("[N/A]") is left out."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def cpu_ticks(stat: str) -> int | None:
    """utime + stime (clock ticks) from one /proc/PID/stat line; None if it
    does not parse (fields 14 and 15, counted after the last ")")."""
    try:
        rest = stat[stat.rindex(")") + 1 :].split()
        return int(rest[11]) + int(rest[12])
    except (ValueError, IndexError):
        return None


class Sampler:
    """Samples the use of this worker's running holds, one heartbeat apart.

    `scope` is the worker's marker (RC_HOST, RC_WORKER_INSTANCE values) a
    process must carry besides RC_JOB_ID. `sample(holds, now)` takes
    {hold id: device names} and the monotonic time, returns one HoldUse per
    hold. It never raises: nvidia-smi failing leaves the GPU unread (not
    busy), an unreadable process is skipped.
    """

    def __init__(self, scope: dict[bytes, bytes]) -> None:
        self.scope = scope
        self._ticks: dict[int, tuple[int, int]] = {}  # pid -> (hold id, ticks)
        self._at: float | None = None

    def sample(self, holds: dict[int, list[str]], now: float) -> tuple[HoldUse, ...]:
        if not holds:
            self._ticks, self._at = {}, None
            return ()
        gpu = self._gpu(holds)
        cpu = self._cpu(set(holds), now)
        out = []
        for hold_id, names in sorted(holds.items()):
            gpus = [cuda_index(n) for n in names if not is_cpu_device(n)]
            if gpus:
                seen = [gpu[i] for i in gpus if i is not None and i in gpu]
                pct = max(seen) if seen else None
                out.append(HoldUse(hold_id, pct is not None and pct > GPU_BUSY_PCT, gpu_pct=pct))
            else:
                pct = cpu.get(hold_id)
                out.append(HoldUse(hold_id, pct is not None and pct > CPU_BUSY_PCT, cpu_pct=pct))
        return tuple(out)

    def _gpu(self, holds: dict[int, list[str]]) -> dict[str, int]:
        if all(is_cpu_device(n) for names in holds.values() for n in names):
            return {}
        try:
            # one query of its own, through rc.worker.nvidia's runner
            return parse_utilization(nvidia._run(f"--query-gpu={UTIL_QUERY}", nvidia.TIMEOUT_S))
        except nvidia.NvidiaError as e:
            log.debug("utilization not read: %s", e)
            return {}

    def _cpu(self, holds: set[int], now: float) -> dict[int, int]:
        """{hold id: percent of one core since the previous sample}; holds
        seen for the first time have none yet."""
        ticks: dict[int, tuple[int, int]] = {}
        skip = procfs.ancestors()
        try:
            pids = [int(p) for p in os.listdir(procfs.PROC) if p.isdigit()]
        except OSError:
            return {}
        for pid in pids:
            if pid in skip:
                continue
            try:
                env = procfs.read_file(f"{procfs.PROC}/{pid}/environ")
                if b"RC_JOB_ID=" not in env:
                    continue
                value = procfs.parse_environ_value(env, b"RC_JOB_ID")
                if not value or not value.isdigit() or int(value) not in holds:
                    continue
                if any(procfs.parse_environ_value(env, k) != v for k, v in self.scope.items()):
                    continue
                t = cpu_ticks(
                    procfs.read_file(f"{procfs.PROC}/{pid}/stat").decode("ascii", "replace")
                )
            except OSError:
                continue
            if t is not None:
                ticks[pid] = (int(value), t)
        prev, at = self._ticks, self._at
        self._ticks, self._at = ticks, now
        if at is None or now <= at:
            return {}
        used: dict[int, int] = dict.fromkeys(holds, 0)
        for pid, (hold, t) in ticks.items():
            before = prev.get(pid)
            used[hold] += t - before[1] if before is not None and before[0] == hold else t
        elapsed = now - at
        return {h: round(100 * u / CLK_TCK / elapsed) for h, u in used.items()}
