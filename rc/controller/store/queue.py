"""The queue as the planner sees it: queued jobs, device slots, a snapshot.

Reads only (and `request_pass`, which asks for a scheduling pass at the end
of the batch). Rows become rc.controller.planning's records here (by
rc.controller.store.rows), so the planner never sees the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson

from rc.controller.planning import Policy, QueuedJob, Slot, Snapshot, plan
from rc.controller.planning.placement import pair
from rc.controller.store import leases, rows
from rc.controller.store.db import Tx
from rc.proto.model import Link

__all__ = [
    "adjust_param",
    "adjustments",
    "anything_to_place",
    "arrays_active",
    "in_order",
    "links",
    "queued",
    "request_pass",
    "slots",
    "snapshot",
]


def queued(tx: Tx) -> list[QueuedJob]:
    """Every queued job, in id order."""
    return [rows.queued_job(r) for r in tx.all("queued_jobs", {"now": tx.now})]


def adjustments(tx: Tx, policy: Policy) -> dict[str, int]:
    """Fair share's adjustments now (user → priority steps above 0); {}
    when fair share is off."""
    return policy.shares.adjustments(tx) if policy.shares is not None else {}


def adjust_param(adjust: dict[str, int]) -> str:
    """The adjustments as the queries' :adjust: a JSON object user → steps,
    joined to each queued job by SQLite's json_each ('{}' for none)."""
    return orjson.dumps(adjust, option=orjson.OPT_SORT_KEYS).decode() if adjust else "{}"


def in_order(tx: Tx, aging: float, adjust: dict[str, int] | None = None) -> Iterator[QueuedJob]:
    """The queued jobs in scheduling order (effective priority with the
    fair-share `adjust`ments, then id), read lazily: a pass that stops early
    fetches only what it looked at."""
    params = {"now": tx.now, "aging": aging, "adjust": adjust_param(adjust or {})}
    return map(rows.queued_job, tx.iter("queued_jobs_ordered", params))


def slots(tx: Tx) -> dict[str, Slot]:
    """Every device as a planner Slot, by device id. A device a job holds is
    expected free at the job's start plus the runtime it was given; whom
    its worker runs jobs as rides along (rows.device_slot)."""
    return {r["id"]: rows.device_slot(r) for r in tx.all("device_slots")}


def links(tx: Tx) -> dict[str, dict[tuple[str, str], int]]:
    """Every host's topology as the planner takes it: host → {pair of device
    ids (placement.pair) → rank of their link}."""
    out: dict[str, dict[tuple[str, str], int]] = {}
    for r in tx.all("device_links_all"):
        h = r["host"]
        out.setdefault(h, {})[pair(f"{h}:{r['a']}", f"{h}:{r['b']}")] = Link(r["link"]).rank
    return out


def arrays_active(tx: Tx) -> dict[int, int]:
    """Each capped array's id → its elements assigned or running now."""
    return {r["array_id"]: r["n"] for r in tx.all("arrays_active")}


def anything_to_place(tx: Tx) -> bool:
    """Whether a pass could assign anything: a job is queued and a device is
    schedulable (ready, not draining)."""
    return bool(tx.scalar("any_schedulable")) and bool(tx.scalar("any_queued"))


def snapshot(tx: Tx, matching: Callable[[str], frozenset[str]], policy: Policy) -> Snapshot:
    """Load the queue and the fleet in `tx` and plan them.

    `matching(selector)` gives the device ids a normalised selector matches
    (readers match fresh labels: rc.controller.store.labels.effective).
    """
    queue = queued(tx)
    fleet_slots = slots(tx)
    matches = {sel: matching(sel) for sel in {j.selector for j in queue if j.selector}}
    usage = leases.usage(tx)
    adjust = adjustments(tx, policy)
    p = plan(
        queue,
        fleet_slots,
        matches,
        tx.now,
        aging=policy.aging,
        cap=policy.cap,
        usage=usage,
        links=links(tx),
        arrays_active=arrays_active(tx),
        adjust=adjust,
    )
    return Snapshot(queue, fleet_slots, usage, p, tx.now, adjust)


def request_pass(tx: Tx) -> None:
    """Ask for a scheduling pass at the end of this write batch (changes nothing)."""
    tx.schedule = True
