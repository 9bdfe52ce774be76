"""Leases: a job's hold on its devices, granted when it is assigned.

A job holds one lease per device it was granted; all of them are inserted in
the transaction that assigns it and released together. A lease is live
until released (released_at set); the schema allows one live lease per
device (a partial unique index). Releasing happens where a job ends
(rc.controller.store.jobs) and where the sweeper writes one off
(rc.controller.store.workers).
"""

from __future__ import annotations

from rc.controller.errors import GuardFailed
from rc.controller.planning import Policy, runtime_on
from rc.controller.store.db import Tx, dumps

__all__ = ["assign", "release", "usage"]


def assign(tx: Tx, job_id: int, device_ids: tuple[str, ...], policy: Policy) -> bool:
    """Give a queued job its devices (one host's, ready), all at once: job
    assigned to them (in this order: its RC_DEVICES), each device busy, one
    lease per device, held by its Unix user (the account that the per-user
    cap, fair share and the usage ledger count).

    A job with no runtime of its own inherits the lowest ceiling among its
    devices (README "Runtime ceilings"); its leases last that runtime plus
    `policy.lease_grace` seconds, or `policy.lease_default` seconds when
    there is none (heartbeats renew them). Returns False, changing nothing,
    when the job is no longer queued, a device is no longer ready, or the
    devices are not all of one worker.
    """
    devs = [tx.one("device_for_assign", (d,)) for d in device_ids]
    if not devs or any(d is None or d["state"] != "ready" or d["draining"] for d in devs):
        return False
    workers = {d["worker_id"] for d in devs}
    if len(workers) != 1:
        return False
    job = tx.one("job_for_assign", (job_id,))
    if job is None or job["state"] != "queued":
        return False
    runtime = runtime_on(job["max_runtime"], (d["max_runtime"] for d in devs))
    ttl = runtime + policy.lease_grace if runtime else policy.lease_default
    (worker,) = workers
    for d in device_ids:
        tx.change("device_set_busy", (d,))
    tx.change("job_assign", (dumps(list(device_ids)), worker, runtime, tx.now, job_id))
    for d in device_ids:
        tx.change(
            "lease_insert",
            (d, job_id, job["unix_user"], job["kind"], job["reason"], tx.now, tx.now + ttl),
        )
    tx.notify(f"worker:{worker}", f"job:{job_id}", "jobs", "devices")
    return True


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
