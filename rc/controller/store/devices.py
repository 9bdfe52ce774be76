"""Transactions on devices: quarantine, fault, clear, retire, drain.

The governing rule: never hand out a device that cannot be proven free. A
device leaves quarantine only by a reboot, a recovery proof (both in
rc.controller.store.workers), a returning worker in retention mode, or an
admin (`clear`).
"""

from __future__ import annotations

from rc.controller.errors import Refused
from rc.controller.store import events, jobs, labels
from rc.controller.store.db import Tx
from rc.controller.store.labels import MatchCache
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, QuarantineReason

__all__ = [
    "SCAN_JOBS",
    "SURVIVOR_FAULTS",
    "clear",
    "clearable",
    "drain",
    "drain_degraded",
    "fault",
    "health_drain",
    "health_fault",
    "health_rule",
    "quarantine",
    "remove",
    "retire",
    "survivor_fault",
]

SCAN_JOBS = 20
"""A clear's survivor scan looks for what is left of the device's newest
jobs, at most this many (and for any job process naming the device)."""


def quarantine(tx: Tx, device_id: str, reason: QuarantineReason, detail: str) -> bool:
    """Take a device out of the pool. Returns True if it was not quarantined before.

    An existing quarantine keeps its reason when another cause hits it, so a
    `fault` is never relabelled into something a reboot clears; a `fault`
    overrides a reboot-clearable reason (the stricter one wins), and a fault
    that is not survivors overrides a fault for survivors (which a clean
    re-check may return: SURVIVOR_FAULTS).
    """
    row = tx.one("device_state", (device_id,))
    if row is None:
        return False
    if row["state"] == "unhealthy":
        stricter = row["quarantine_reason"] != "fault" or (
            survivor_fault(row["quarantine_detail"]) and not survivor_fault(detail)
        )
        if reason is QuarantineReason.FAULT and stricter:
            tx.change("device_quarantine", (reason.value, detail, tx.now, device_id))
            tx.notify("devices")
        return False
    tx.change("device_quarantine", (reason.value, detail, tx.now, device_id))
    tx.notify("devices")
    return True


SURVIVOR_FAULTS = (
    ("processes of job ", " survived teardown: "),
    ("GPU ", " still has compute processes: "),
)
"""The fault details of processes left after a job's teardown (rc.worker.job,
rc.worker.leftovers), as (start, then): the query
devices_survivor_faulted_on_worker matches the same two."""


def survivor_fault(detail: str) -> bool:
    """Whether a fault's detail is processes that survived a job's teardown."""
    return any(detail.startswith(a) and b in detail for a, b in SURVIVOR_FAULTS)


def fault(tx: Tx, device_id: str, reason: str, job_id: int | None, actor: str) -> None:
    """A worker (or admin) reports a device unfit: quarantine it as `fault`.

    404 device_not_found for an unknown device. The event is verify_failed
    when the reason starts with "verify failed: ", else device_unhealthy. A
    GPU health fault the device is quarantined for already, word for word
    (the worker sends a standing fault on every pass: rc.worker.health),
    changes nothing and records no event.
    """
    row = tx.one("device_state", (device_id,))
    if row is None:
        raise Refused(ErrorCode.DEVICE_NOT_FOUND, f"no device {device_id!r}")
    if (
        reason.startswith(HEALTH_PREFIX)
        and row["state"] == "unhealthy"
        and row["quarantine_reason"] == "fault"
        and row["quarantine_detail"] == reason
    ):
        return
    quarantine(tx, device_id, QuarantineReason.FAULT, reason)
    kind = (
        EventKind.VERIFY_FAILED
        if reason.startswith("verify failed: ")
        else EventKind.DEVICE_UNHEALTHY
    )
    events.record(tx, kind, device_id=device_id, job_id=job_id, actor=actor, text=reason)


HEALTH_PREFIX = "health: "
"""The start of a quarantine detail a GPU health rule gave (rc.worker.health)."""


def health_rule(detail: str) -> str:
    """The GPU health rule a quarantine detail or drain reason names
    ("row-remap-failed" of "health: row-remap-failed on HOST:gpu1: ...",
    "pcie-width" of "health: degraded:pcie-width (rc serve
    --drain-degraded)"); "" when no health rule gave it."""
    if not detail.startswith(HEALTH_PREFIX):
        return ""
    rest = detail[len(HEALTH_PREFIX) :]
    if rest.startswith("degraded:"):
        return rest[len("degraded:") :].split(" ", 1)[0]
    return rest.split(" on ", 1)[0]


def health_fault(tx: Tx, device_id: str) -> str:
    """The GPU health rule the device is quarantined as `fault` for
    ("row-remap-failed", "xid-79"); "" when it is not."""
    row = tx.one("device_state", (device_id,))
    if row is None or row["state"] != "unhealthy" or row["quarantine_reason"] != "fault":
        return ""
    return health_rule(row["quarantine_detail"])


def health_drain(tx: Tx, device_id: str) -> str:
    """The GPU health rule(s) the device is drained for ("row-remap-pending",
    "pcie-width+thermal"); "" when it is not drained by one."""
    row = tx.one("device_drain_state", (device_id,))
    if row is None or not row["draining"]:
        return ""
    return health_rule(row["drain_reason"])


def clearable(tx: Tx, device_id: str) -> tuple[int, ...]:
    """Refuse a clear that cannot be (as `clear` does), before its survivor
    scan; the ids of the device's newest jobs (SCAN_JOBS), for the scan."""
    _clear_checks(tx, device_id)
    return tuple(r["id"] for r in tx.all("jobs_recent_on_device", (device_id, SCAN_JOBS)))


def _clear_checks(tx: Tx, device_id: str):
    row = tx.one("device_state", (device_id,))
    if row is None:
        raise Refused(ErrorCode.DEVICE_NOT_FOUND, f"no device {device_id!r}")
    if row["state"] != "unhealthy":
        raise Refused(
            ErrorCode.DEVICE_NOT_CLEARED,
            f"{device_id} is not quarantined (it is {row['state']}); nothing to clear",
        )
    if tx.scalar("device_has_live_lease", (device_id,)):
        raise Refused(
            ErrorCode.DEVICE_NOT_CLEARED,
            f"{device_id} still has a live lease; kill or release its job first",
        )
    return row


def clear(
    tx: Tx,
    device_id: str,
    actor: str,
    proof: str = "",
    health: str = "",
    match_cache: MatchCache | None = None,
) -> None:
    """An admin returns a quarantined device to the pool; `proof` says on
    what ("a survivor scan found nothing", "forced: no survivor scan"),
    in the event. `health` (with `match_cache`): the GPU's `health` label
    as its re-probe just read it, set now (labels.set_health).

    409 device_not_cleared while a lease is live on it or when it is not
    quarantined (a no-op is never reported as success); 404 for no device.
    """
    row = _clear_checks(tx, device_id)
    was = row["quarantine_reason"] or "an unknown cause"
    tx.change("device_unquarantine", (device_id,))
    on = f"{proof}; " if proof else ""
    events.record(
        tx,
        EventKind.DEVICE_CLEARED,
        device_id=device_id,
        actor=actor,
        text=f"cleared by {actor} ({on}was quarantined for {was})",
    )
    if health and match_cache is not None:
        labels.set_health(tx, device_id, health, match_cache)
    tx.schedule = True
    tx.notify("devices")


def retire(tx: Tx, device_id: str, actor: str, match_cache: MatchCache) -> None:
    """An admin removes a device: its labels, sheet and row go, job history stays.

    Queued jobs that pin it (among other devices or alone) are cancelled.
    404 device_not_found; 409
    device_busy while a lease is live on it.
    """
    if tx.one("device_state", (device_id,)) is None:
        raise Refused(ErrorCode.DEVICE_NOT_FOUND, f"no device {device_id!r}")
    if tx.scalar("device_has_live_lease", (device_id,)):
        raise Refused(
            ErrorCode.DEVICE_BUSY, f"{device_id} has a live lease; kill or release its job first"
        )
    for j in tx.all("jobs_queued_pinned_to", (device_id,)):
        # a pass follows: the other devices it had reserved go to others
        jobs.cancel_queued(tx, j["id"], f"device {device_id} was retired")
    remove(tx, device_id)
    events.record(
        tx, EventKind.DEVICE_RETIRED, device_id=device_id, actor=actor, text=f"retired by {actor}"
    )
    match_cache.invalidate()
    tx.notify("devices", "jobs")


def remove(tx: Tx, device_id: str) -> None:
    host, _, name = device_id.rpartition(":")
    tx.exec("labels_delete_all", (device_id,))  # all of its labels: any number
    tx.exec("sheet_delete", (host, name))  # its own sheet, when it has one
    tx.exec("device_links_delete_device", (host, name))  # its links, maybe none
    tx.change("device_delete", (device_id,))


def drain(tx: Tx, device_id: str, on: bool, reason: str, actor: str) -> tuple[str, bool]:
    """Drain (no new job starts; the current one finishes) or undrain a device.

    Returns (what happened in words, already). A verb whose effect is in
    place already changes nothing and records no event (`already` True): a
    drain of a draining device keeps its reason, and says it, who drained it
    and how long ago ("already drained: cable swap, by admin, 5m ago"); an
    undrain of a device that is not draining says so. The one change a
    second drain makes is a new, different, non-empty reason, which replaces
    the old one (a `device_drained` event names both). An undrain's
    `reason` is a note for its event (what proved the GPU clean, or that it
    was forced). 404 for an unknown device.
    """
    row = tx.one("device_drain_state", (device_id,))
    if row is None:
        raise Refused(ErrorCode.DEVICE_NOT_FOUND, f"no device {device_id!r}")
    old = row["drain_reason"]
    if on and row["draining"] and (not reason or reason == old):
        return "already drained: " + _drained_since(tx, device_id, old), True
    if not on and not row["draining"]:
        return f"already undrained: {device_id} is not draining", True
    tx.change("device_drain", (1 if on else 0, reason if on else "", device_id))
    if on:
        text = f"drained by {actor}" + (f": {reason}" if reason else "")
        if row["draining"]:
            text += f" (was: {old})" if old else " (it had no reason)"
        events.record(tx, EventKind.DEVICE_DRAINED, device_id=device_id, actor=actor, text=text)
    else:
        events.record(
            tx,
            EventKind.DEVICE_UNDRAINED,
            device_id=device_id,
            actor=actor,
            text=f"undrained by {actor}" + (f" ({reason})" if reason else ""),
        )
        tx.schedule = True
    tx.notify("devices")
    if not on:
        return f"{device_id} is back in the pool", False
    if row["draining"]:
        return f"{device_id}: drain reason is now {reason!r} (was {old!r})", False
    return f"draining {device_id}", False


def drain_degraded(tx: Tx, host: str, degraded: dict[str, str], actor: str) -> list[str]:
    """rc serve --drain-degraded: drain each device of `host` named in
    `degraded` (device name → its `health` label, "degraded:<why>") that is
    not draining yet, with the label as the reason. A device it does not know
    is skipped. Returns the ids it drained."""
    out = []
    for name, health in sorted(degraded.items()):
        device_id = f"{host}:{name}"
        row = tx.one("device_drain_state", (device_id,))
        if row is None or row["draining"]:
            continue
        drain(tx, device_id, True, f"health: {health} (rc serve --drain-degraded)", actor)
        out.append(device_id)
    return out


def _drained_since(tx: Tx, device_id: str, reason: str) -> str:
    """ "REASON, by ACTOR, 5m ago" for a draining device, from its newest
    device_drained event (the parts it cannot know are left out)."""
    parts = [reason or "no reason given"]
    ev = tx.one("event_last_drained", (device_id,))
    if ev is not None:
        if ev["actor"]:
            parts.append(f"by {ev['actor']}")
        parts.append(f"{_coarse(tx.now - ev['at'])} ago")
    return ", ".join(parts)


def _coarse(seconds: float) -> str:
    """An age in its largest whole unit: 45s, 12m, 3h, 5d."""
    for size in (86400, 3600, 60):
        if seconds >= size:
            return format_duration(seconds // size * size)
    return format_duration(max(0, int(seconds)))
