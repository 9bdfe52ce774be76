"""Boot id and the recovery proof a worker presents at registration
(docs/design.md#quarantine-and-proof).

The proof is observed, never configured: isolation means this worker is PID 1
alone in its PID namespace; a survivor check is a /proc scan for processes
carrying any RC_JOB_ID that could read every process. `require_manual_clear`
means no claim at all. Nothing here can make a worker less cautious.
"""

from __future__ import annotations

import os

from rc.proto.model import RecoveryProof
from rc.worker import procfs

__all__ = ["boot_id", "recovery_proof"]


def boot_id() -> str:
    """The kernel's boot id, else "btime-<n>" from /proc/stat, else ""."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            value = f.read().strip()
            if value:
                return value
    except OSError:
        pass
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return "btime-" + line.split()[1]
    except (OSError, IndexError):
        pass
    return ""


def recovery_proof(require_manual_clear: bool, host: str) -> RecoveryProof:
    """What this worker can prove about processes of interrupted jobs of
    `host` (those carrying RC_JOB_ID and RC_HOST=host).

    Computed only while the worker supervises nothing.
    """
    if require_manual_clear:
        return RecoveryProof()
    me = os.getpid()
    if me == 1:
        try:
            others = [p for p in procfs.processes() if p.pid != me and p.live]
        except OSError:
            others = None
        if others is not None and not others:
            return RecoveryProof(isolated=True)
    scan = procfs.find_job_processes(None, require={b"RC_HOST": host.encode()})
    if not scan.complete:
        return RecoveryProof()
    return RecoveryProof(survivors_checked=True, survivors_found=bool(scan.pids))
