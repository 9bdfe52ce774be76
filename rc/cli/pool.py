"""Which devices of an rc up's host take no job now, why, and how each
comes back, in words: what `rc up` says once its worker has settled, and
again when rc is already up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rc.cli.context import stderr

__all__ = ["REBOOT_CLEARABLE", "out_of_pool", "say_out_of_pool"]

REBOOT_CLEARABLE = ("registration", "worker_lost", "lease_expired")
"""Quarantine reasons a worker registering with a recovery proof clears."""


def out_of_pool(d: dict, as_admin: str, restart: str) -> str | None:
    """One line on a device that takes no job now and how it comes back, or
    None for a device in the pool. `as_admin` is the environment to put in
    front of an admin command ("RC_TOKEN=$(cat .../admin.token) "), `restart`
    says how to restart rc.

    A device quarantined for a reboot-clearable reason returns when a worker
    registers with a recovery proof (the controller's rule; a fresh worker
    scans /proc for processes of interrupted jobs), or by rc clear."""
    dev = d["id"]
    clear = f"{as_admin}rc clear {dev}"
    if d["state"] == "unhealthy":
        reason = d.get("quarantine_reason") or ""
        detail = d.get("quarantine_detail") or ""
        why = f"{reason or 'quarantined'}: {detail}" if detail else (reason or "quarantined")
        if reason in REBOOT_CLEARABLE:
            how = (
                "a process of the interrupted job may still be running. Once it has ended, "
                f"`{clear}` returns the device, and so does a restart ({restart}: the new "
                "worker finds nothing of the job left)"
            )
        else:
            how = f"once you have seen to it, `{clear}` returns the device"
        return f"{dev} is out of the pool ({why}): {how}"
    if d.get("draining"):
        reason = d.get("drain_reason") or ""
        return (
            f"{dev} is draining{f' ({reason})' if reason else ''}: it takes no new job "
            f"until `{as_admin}rc undrain {dev}`"
        )
    return None


def say_out_of_pool(
    mine: list[dict],
    host: str,
    data: Path,
    args: argparse.Namespace,
    url: str,
    points_here: bool,
    foreground: bool,
) -> None:
    """Name on stderr each of `mine` (this host's devices) that takes no job
    now, why, and how it returns. `foreground`: this process runs rc (so
    Ctrl-C stops it, not rc down)."""
    as_admin = f"RC_TOKEN=$(cat {data / 'admin.token'}) "
    if not points_here:  # rc would ask another controller
        as_admin += f"RC_CONTROLLER={url} "
    if foreground:
        restart = "Ctrl-C, then `rc up` as before"
    else:
        restart = f"`rc down{f' --data {data}' if args.data else ''}`, then `rc up -d` as before"
    notes = [line for line in (out_of_pool(d, as_admin, restart) for d in mine) if line]
    for line in notes:
        stderr(line)
    if notes and len(notes) == len(mine):
        stderr(f"no device of {host} takes jobs now: rc run waits in the queue until one returns")
