"""Leases: a job's hold on its devices, granted when it is assigned.

A job holds one lease per device it was granted; all of them are inserted in
the transaction that assigns it (rc.controller.store.jobs.assign) and
released together. A lease is live until released (released_at set); the
schema allows one live lease per device (a partial unique index). Releasing
happens where a job ends (rc.controller.store.jobs) and where the sweeper
writes one off (rc.controller.store.workers).
"""

from __future__ import annotations

from rc.controller.errors import GuardFailed
from rc.controller.store.db import Tx

__all__ = ["grant", "release", "usage"]


def grant(
    tx: Tx,
    job_id: int,
    device_ids: tuple[str, ...],
    holder: str,
    kind: str,
    reason: str,
    ttl: float,
) -> None:
    """One live lease per device for a job being assigned (jobs.assign),
    held by `holder` (its Unix user: the account that the per-user cap,
    fair share and the usage ledger count), lasting `ttl` seconds from now.
    GuardFailed when a device has a live lease already (the schema allows
    one)."""
    for d in device_ids:
        tx.change("lease_insert", (d, job_id, holder, kind, reason, tx.now, tx.now + ttl))


def release(tx: Tx, job_id: int, *, guarded: bool = True) -> list[str]:
    """Release every live lease of a job, together; returns their devices.

    `guarded`: the job is known to hold its leases (it is active), so
    releasing none is an error (GuardFailed); otherwise none may be left
    (the sweep released them first) and [] is returned.
    """
    released = [r["device_id"] for r in tx.all("lease_release_by_job", (tx.now, job_id))]
    if guarded and not released:
        raise GuardFailed(f"job {job_id} holds no live lease to release")
    return released


def usage(tx: Tx) -> dict[str, int]:
    """holder (a Unix user: the account) → how many devices it holds now (live leases)."""
    return {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")}
