"""Leases: a job's hold on a device, granted when it is assigned.

A lease is live until released (released_at set); the schema allows one live
lease per device (a partial unique index). Releasing happens where a job
ends (rc.controller.store.jobs) and where the sweeper writes one off
(rc.controller.store.workers).
"""

from __future__ import annotations

from rc.controller.planner import Policy
from rc.controller.store.db import Tx, dumps

__all__ = ["assign", "usage"]


def assign(tx: Tx, job_id: int, device_id: str, policy: Policy) -> bool:
    """Give a queued job a ready device: job assigned, device busy, lease taken.

    A selector job with no runtime of its own inherits the device's ceiling
    (inventory §4.5); the lease lasts that runtime plus `policy.lease_grace`
    seconds, or `policy.lease_default` seconds when there is none (heartbeats
    renew it). Returns False, changing nothing, when the job is no longer
    queued or the device no longer ready.
    """
    dev = tx.one("device_for_assign", (device_id,))
    if dev is None or dev["state"] != "ready" or dev["draining"]:
        return False
    job = tx.one("job_for_assign", (job_id,))
    if job is None or job["state"] != "queued":
        return False
    runtime = job["max_runtime"] or dev["max_runtime"]
    ttl = runtime + policy.lease_grace if runtime else policy.lease_default
    tx.change("device_set_busy", (device_id,))
    tx.change("job_assign", (dumps([device_id]), dev["worker_id"], runtime, tx.now, job_id))
    tx.change(
        "lease_insert",
        (device_id, job_id, job["submitter"], job["kind"], job["reason"], tx.now, tx.now + ttl),
    )
    tx.notify(f"worker:{dev['worker_id']}", f"job:{job_id}", "jobs", "devices")
    return True


def usage(tx: Tx) -> dict[str, int]:
    """holder (a submitter) → how many devices they hold now (live leases)."""
    return {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")}
