"""Transactions on workers and devices (inventory §7, DESIGN.md §7).

The governing rule: never hand out a device that cannot be proven free, and
silence never promotes a device. A device leaves quarantine only by a reboot
(a changed boot id), a recovery proof (for reboot-clearable reasons, flap
limited), a returning worker in retention mode, or an admin.
"""

from __future__ import annotations

from dataclasses import dataclass

from rc.controller import feed
from rc.controller.errors import Refused
from rc.controller.scheduler import MatchCache
from rc.controller.store.db import Tx, dumps
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, LabelSource, QuarantineReason, RecoveryProof
from rc.proto.wire import RegisterRequest

__all__ = [
    "Thresholds",
    "clear",
    "drain",
    "fault",
    "heartbeat",
    "leave",
    "lose_job",
    "quarantine",
    "register",
    "retire",
    "set_labels",
    "sweep",
]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The sweeper's and recovery's knobs (seconds), from ControllerConfig."""

    unknown_after: float = 30.0
    lost_after: float = 300.0
    startup_grace: float = 30.0
    lease_renewal: float = 900.0
    flap_limit: int = 3
    flap_window: float = 3600.0
    retain: bool = False


def quarantine(tx: Tx, device_id: str, reason: QuarantineReason, detail: str) -> bool:
    """Take a device out of the pool. Returns True if it was not quarantined before.

    An existing quarantine keeps its reason when another cause hits it, so a
    `fault` is never relabelled into something a reboot clears; a `fault`
    overrides a reboot-clearable reason (the stricter one wins).
    """
    row = tx.one("device_state", (device_id,))
    if row is None:
        return False
    if row["state"] == "unhealthy":
        if reason is QuarantineReason.FAULT and row["quarantine_reason"] != "fault":
            tx.exec("device_quarantine", (reason.value, detail, tx.now, device_id))
            tx.notify("devices")
        return False
    tx.exec("device_quarantine", (reason.value, detail, tx.now, device_id))
    tx.notify("devices")
    return True


def lose_job(tx: Tx, job_id: int, device_id: str, why: str) -> None:
    """An active job → lost, its lease released, and a job_lost event."""
    if tx.exec("job_lose", (why, tx.now, job_id)):
        tx.exec("lease_release_by_job", (tx.now, job_id))
        feed.record(tx, EventKind.JOB_LOST, job_id=job_id, device_id=device_id, text=why)
        tx.notify(f"job:{job_id}", f"log:{job_id}", "jobs")


def register(tx: Tx, req: RegisterRequest, match_cache: MatchCache, th: Thresholds) -> bool:
    """A worker (re)registers: reconcile, upsert devices, maybe recover, store labels.

    Inventory §7.4: every job the controller believes runs on this worker is
    lost ("host rebooted" when the boot id changed, else "worker re-registered")
    and its device goes ready after a reboot, else is quarantined
    `registration`. Except when the same worker process registers again
    (same `instance`, no reboot): the jobs it names go on, and assigned jobs
    it never started are handed out to it again (a controller restart forgot
    what it had handed out; the worker never starts a job id twice). A reboot also returns devices quarantined for a
    reboot-clearable reason. Devices no longer declared are removed (when no
    lease is live on them). Then a recovery proof may return reboot-clearable
    devices (flap-limited). Returns whether the host rebooted.
    """
    host = req.host
    prev = tx.one("worker_get", (host,))
    prev_boot = prev["boot_id"] if prev is not None else ""
    rebooted = bool(prev_boot and req.boot_id and prev_boot != req.boot_id)
    same_process = bool(
        prev is not None and req.instance and not rebooted and prev["instance"] == req.instance
    )
    tx.exec("worker_upsert", (host, host, req.boot_id, req.instance, req.version, tx.now, tx.now))
    why = "host rebooted" if rebooted else "worker re-registered"
    named = set(req.running_job_ids)
    for j in tx.all("jobs_active_on_worker", (host,)):
        if same_process and (j["id"] in named or j["state"] == "assigned"):
            continue
        lose_job(tx, j["id"], j["device_id"], why)
        if rebooted:
            tx.exec("device_ready_if_busy_or_unknown", (j["device_id"],))
        elif quarantine(
            tx,
            j["device_id"],
            QuarantineReason.REGISTRATION,
            f"job {j['id']} was running when the worker re-registered",
        ):
            feed.record(
                tx,
                EventKind.DEVICE_UNHEALTHY,
                device_id=j["device_id"],
                job_id=j["id"],
                text=f"quarantined: job {j['id']} was in flight when the worker "
                "re-registered, and nothing proves it is gone",
            )
    if rebooted:
        for d in tx.all("devices_recoverable_on_worker", (host,)):
            tx.exec("device_unquarantine", (d["id"],))
            feed.record(
                tx,
                EventKind.DEVICE_RECOVERED,
                device_id=d["id"],
                text=f"was quarantined for {d['quarantine_reason']}; the host rebooted "
                "(boot id changed)",
            )
    existing = {r["name"]: r for r in tx.all("devices_of_worker", (host,))}
    declared = {d.name: d for d in req.devices}
    for name, decl in declared.items():
        device_id = f"{host}:{name}"
        if name in existing:
            tx.exec("device_reregister", (decl.max_runtime_seconds, tx.now, device_id))
        else:
            tx.exec(
                "device_insert",
                (device_id, host, name, host, decl.max_runtime_seconds, tx.now, tx.now),
            )
    for name, r in existing.items():
        if name not in declared and tx.scalar("device_has_live_lease", (r["id"],)) == 0:
            _remove_device(tx, r["id"])
            feed.record(
                tx,
                EventKind.DEVICE_RETIRED,
                device_id=r["id"],
                actor=host,
                text="no longer declared by its worker",
            )
    if req.recovery.proves():
        recover(tx, host, req.recovery, th)
    set_labels(
        tx, host, tuple(declared), req.labels, req.declared_labels, req.sheet, req.device_sheets
    )
    match_cache.invalidate()
    tx.schedule = True
    tx.notify("devices", "jobs")
    return rebooted


def recover(tx: Tx, host: str, proof: RecoveryProof, th: Thresholds) -> list[str]:
    """Return this worker's reboot-clearable quarantined devices on a proof.

    Never `fault`, never an unknown reason, never a device with a live lease;
    at most `flap_limit` times per device per `flap_window` (then a
    recovery_refused event, once per quarantine however often the worker
    presents its proof again: it waits for a human). Returns the device ids
    recovered.
    """
    back = []
    tx.exec("recoveries_prune", (tx.now - th.flap_window,))
    for d in tx.all("devices_recoverable_on_worker", (host,)):
        recent = tx.scalar("recoveries_count", (d["id"], tx.now - th.flap_window))
        if recent >= th.flap_limit:
            if not tx.scalar("recovery_refused_since", (d["id"], d["quarantined_at"] or 0.0)):
                feed.record(
                    tx,
                    EventKind.RECOVERY_REFUSED,
                    device_id=d["id"],
                    text=f"recovered {recent} time{'' if recent == 1 else 's'} within "
                    f"{format_duration(th.flap_window)}; waiting for an admin (rc clear)",
                )
            continue
        tx.exec("device_unquarantine", (d["id"],))
        tx.exec("recovery_insert", (d["id"], tx.now, d["quarantine_reason"]))
        feed.record(
            tx,
            EventKind.DEVICE_RECOVERED,
            device_id=d["id"],
            text=f"was quarantined for {d['quarantine_reason']}; {proof.summary()}",
        )
        back.append(d["id"])
    if back:
        tx.schedule = True
        tx.notify("devices")
    return back


def set_labels(
    tx: Tx,
    host: str,
    names: tuple[str, ...],
    labels: dict[str, dict[str, str]] | None,
    declared: dict[str, dict[str, str]] | None,
    sheet: str | None,
    device_sheets: dict[str, str],
) -> None:
    """Store probe results, declared labels and usage sheets for a host.

    Detected labels: None says nothing; otherwise each device present in the
    map gets host-wide facts ("") overlaid by its own, replacing what was
    stored, and a device left out keeps its labels (the preservation rule,
    inventory §6.8). Declared labels, when sent, replace every device's.
    Sheets: None keeps the host sheet; device sheets left out are kept.
    """
    for name in names:
        device_id = f"{host}:{name}"
        if labels is not None and name in labels:
            merged = {**labels.get("", {}), **labels[name]}
            _replace_labels(tx, device_id, LabelSource.DETECTED, merged)
        if declared is not None:
            merged = {**declared.get("", {}), **declared.get(name, {})}
            _replace_labels(tx, device_id, LabelSource.DECLARED, merged)
    if sheet is not None:
        tx.exec("sheet_upsert", (host, "", sheet, tx.now))
    for name, body in device_sheets.items():
        if name in names:
            tx.exec("sheet_upsert", (host, name, body, tx.now))


def _replace_labels(tx: Tx, device_id: str, source: LabelSource, values: dict[str, str]) -> None:
    old = {r["key"]: r["value"] for r in tx.all("labels_of", (device_id, source.value))}
    if old == values:
        tx.exec("labels_touch", (tx.now, device_id, source.value))
        return
    tx.exec("labels_delete", (device_id, source.value))
    tx.many("label_insert", [(device_id, k, v, source.value, tx.now) for k, v in values.items()])


def heartbeat(tx: Tx, worker_id: str, running: tuple[int, ...], th: Thresholds) -> list[int]:
    """A worker is alive and names the jobs it supervises.

    Renews the leases of the named jobs that are this worker's and active (to
    at least now + lease_renewal; naming another worker's job renews nothing),
    returns `unknown` devices to busy (live lease) or ready (never a device on
    which the worker still runs a job the controller has ended), and in
    retention mode returns `worker_lost` devices whose named job still holds a
    lease.
    Returns the named jobs the worker should stop: ended on the controller,
    or not this worker's. 404 for a worker that never registered.
    """
    if tx.exec("worker_touch", (tx.now, worker_id)) == 0:
        raise Refused.not_found(f"worker {worker_id} is not registered; register first")
    tx.exec("devices_touch", (tx.now, worker_id))
    ids = dumps(list(running))
    if running:
        tx.exec("leases_renew", (tx.now + th.lease_renewal, ids, worker_id))
    changed = tx.exec("devices_unknown_to_busy", (worker_id,))
    freed = tx.exec("devices_unknown_to_ready", (worker_id, ids))
    if th.retain and running:
        changed += tx.exec("devices_worker_lost_to_busy", (ids, worker_id))
    if freed:
        tx.schedule = True
    if changed or freed:
        tx.notify("devices")
    return [r["id"] for r in tx.all("jobs_to_stop", (ids, worker_id))] if running else []


def leave(
    tx: Tx, worker_id: str, instance: str, started: tuple[int, ...]
) -> tuple[list[int], list[int]]:
    """A worker process stops cleanly (wire.LeaveRequest): what it proves it
    never started goes back to the queue (DESIGN.md §3).

    The proof is the claim of the process the controller has on record
    (`instance`, from its registration): it will start nothing more, and
    `started` holds every job it started whose end the controller has not
    recorded. Every job assigned to the worker and not in `started` was
    therefore never started: it goes back to `queued` in its old place (its
    priority, id and queued_at are kept; a selector job forgets the device
    it was given; its max_runtime stays the one assignment gave it), and its
    lease is released; one whose kill was requested ends `killed` instead.
    Jobs that may have run are not touched (the next registration
    reconciles them: silence proves nothing). The worker's devices then
    leave the pool (`unknown`) until it speaks again, so nothing more is
    handed to a worker that is going away.

    404 for a worker that never registered; 409 conflict (nothing changes)
    when `instance` is not the registered process (another one registered
    since, or the claim names none). Returns (requeued ids, killed ids).
    """
    row = tx.one("worker_get", (worker_id,))
    if row is None:
        raise Refused.not_found(f"worker {worker_id} is not registered")
    if not instance or row["instance"] != instance:
        raise Refused.conflict(
            ErrorCode.CONFLICT,
            f"worker {worker_id} is registered by another process now; "
            "only that process can hand its jobs back",
        )
    named = set(started)
    requeued, killed = [], []
    for j in tx.all("jobs_assigned_to", (worker_id,)):
        if j["id"] in named:
            continue
        if j["kill_requested"]:
            tx.exec("job_finish", ("killed", None, j["kill_reason"], tx.now, None, j["id"]))
            killed.append(j["id"])
            tx.notify(f"log:{j['id']}")
        else:
            tx.exec("job_requeue", (j["id"],))
            requeued.append(j["id"])
        tx.exec("lease_release_by_job", (tx.now, j["id"]))
        tx.notify(f"job:{j['id']}")
    tx.exec("devices_to_unknown", (worker_id,))
    if requeued:
        tx.schedule = True  # another worker's device may take them now
    tx.notify("jobs", "devices")
    return requeued, killed


def sweep(tx: Tx, th: Thresholds, started_at: float) -> int:
    """Write off silent workers and expired leases (inventory §7.2).

    Silence ≥ unknown_after: ready/busy devices → unknown. Silence ≥
    lost_after: devices → unhealthy/worker_lost and (unless retention mode)
    their jobs lost. A lease past its expiry: released, its job lost, its
    device quarantined lease_expired. During the startup grace after a
    controller start nothing expires and no worker is written off. Returns how
    many things changed.
    """
    changes = 0
    in_grace = tx.now < started_at + th.startup_grace
    for w in tx.all("workers_silent", (tx.now - th.unknown_after,)):
        silence = tx.now - w["last_heartbeat_at"]
        if silence >= th.lost_after and not in_grace:
            detail = f"no heartbeat for {format_duration(silence)}"
            for d in tx.all("devices_of_worker", (w["id"],)):
                if quarantine(tx, d["id"], QuarantineReason.WORKER_LOST, detail):
                    feed.record(tx, EventKind.WORKER_LOST, device_id=d["id"], text=detail)
                    changes += 1
            if not th.retain:
                for j in tx.all("jobs_active_on_worker", (w["id"],)):
                    lose_job(tx, j["id"], j["device_id"], "worker lost")
                    changes += 1
        else:
            n = tx.exec("devices_to_unknown", (w["id"],))
            if n:
                tx.notify("devices")
                changes += n
    if not in_grace:
        for lease in tx.all("leases_expired", (tx.now,)):
            if th.retain and lease["kind"] == "job":
                continue
            tx.exec("lease_release", (tx.now, lease["id"]))
            job = tx.one("job_brief", (lease["job_id"],))
            if job is not None and job["state"] in ("assigned", "running"):
                lose_job(tx, lease["job_id"], lease["device_id"], "lease expired")
            feed.record(
                tx,
                EventKind.LEASE_EXPIRED,
                device_id=lease["device_id"],
                job_id=lease["job_id"],
                text="lease expired",
            )
            if quarantine(
                tx,
                lease["device_id"],
                QuarantineReason.LEASE_EXPIRED,
                f"the lease of job {lease['job_id']} expired",
            ):
                feed.record(
                    tx,
                    EventKind.DEVICE_UNHEALTHY,
                    device_id=lease["device_id"],
                    job_id=lease["job_id"],
                    text="quarantined: lease expired",
                )
            changes += 1
    if changes:
        tx.notify("devices", "jobs")
    return changes


def controller_started(tx: Tx) -> int:
    """A controller (re)started: every ready or busy device is `unknown` until
    its worker speaks to this controller (a heartbeat or a registration).

    Silence never promotes a device (DESIGN.md §7): the records say "ready",
    but nobody has yet shown that the worker behind them is alive, and a job
    handed to a dead worker is a job lost. Leases are untouched (the startup
    grace protects them). Returns how many devices were demoted.
    """
    n = tx.exec("devices_demote_on_start")
    if n:
        tx.notify("devices")
    return n


def fault(tx: Tx, device_id: str, reason: str, job_id: int | None, actor: str) -> None:
    """A worker (or admin) reports a device unfit: quarantine it as `fault`.

    404 device_not_found for an unknown device. The event is verify_failed
    when the reason starts with "verify failed: ", else device_unhealthy.
    """
    if tx.one("device_state", (device_id,)) is None:
        raise Refused.not_found(f"no device {device_id!r}", ErrorCode.DEVICE_NOT_FOUND)
    quarantine(tx, device_id, QuarantineReason.FAULT, reason)
    kind = (
        EventKind.VERIFY_FAILED
        if reason.startswith("verify failed: ")
        else EventKind.DEVICE_UNHEALTHY
    )
    feed.record(tx, kind, device_id=device_id, job_id=job_id, actor=actor, text=reason)


def clear(tx: Tx, device_id: str, actor: str) -> None:
    """An admin returns a quarantined device to the pool.

    409 device_not_cleared while a lease is live on it or when it is not
    quarantined (a no-op is never reported as success); 404 for no device.
    """
    row = tx.one("device_state", (device_id,))
    if row is None:
        raise Refused.not_found(f"no device {device_id!r}", ErrorCode.DEVICE_NOT_FOUND)
    if row["state"] != "unhealthy":
        raise Refused.conflict(
            ErrorCode.DEVICE_NOT_CLEARED,
            f"{device_id} is not quarantined (it is {row['state']}); nothing to clear",
        )
    if tx.scalar("device_has_live_lease", (device_id,)):
        raise Refused.conflict(
            ErrorCode.DEVICE_NOT_CLEARED,
            f"{device_id} still has a live lease; kill or release its job first",
        )
    was = row["quarantine_reason"] or "an unknown cause"
    tx.exec("device_unquarantine", (device_id,))
    feed.record(
        tx,
        EventKind.DEVICE_CLEARED,
        device_id=device_id,
        actor=actor,
        text=f"cleared by {actor} (was quarantined for {was})",
    )
    tx.schedule = True
    tx.notify("devices")


def retire(tx: Tx, device_id: str, actor: str, match_cache: MatchCache) -> None:
    """An admin removes a device: its labels, sheet and row go, job history stays.

    Queued jobs pinned to it are cancelled. 404 device_not_found; 409
    device_busy while a lease is live on it.
    """
    if tx.one("device_state", (device_id,)) is None:
        raise Refused.not_found(f"no device {device_id!r}", ErrorCode.DEVICE_NOT_FOUND)
    if tx.scalar("device_has_live_lease", (device_id,)):
        raise Refused.conflict(
            ErrorCode.DEVICE_BUSY, f"{device_id} has a live lease; kill or release its job first"
        )
    for j in tx.all("jobs_queued_pinned_to", (device_id,)):
        tx.exec("job_cancel_queued", (f"device {device_id} was retired", tx.now, j["id"]))
        tx.notify(f"job:{j['id']}")
    _remove_device(tx, device_id)
    feed.record(
        tx, EventKind.DEVICE_RETIRED, device_id=device_id, actor=actor, text=f"retired by {actor}"
    )
    match_cache.invalidate()
    tx.notify("devices", "jobs")


def _remove_device(tx: Tx, device_id: str) -> None:
    host, _, name = device_id.rpartition(":")
    tx.exec("labels_delete_all", (device_id,))
    tx.exec("sheet_delete", (host, name))
    tx.exec("device_delete", (device_id,))


def drain(tx: Tx, device_id: str, on: bool, reason: str, actor: str) -> tuple[str, bool]:
    """Drain (no new job starts; the current one finishes) or undrain a device.

    Returns (what happened in words, already). A verb whose effect is in
    place already changes nothing and records no event (`already` True): a
    drain of a draining device keeps its reason, and says it, who drained it
    and how long ago ("already drained: cable swap, by admin, 5m ago"); an
    undrain of a device that is not draining says so. The one change a
    second drain makes is a new, different, non-empty reason, which replaces
    the old one (a `device_drained` event names both). 404 for an unknown
    device.
    """
    row = tx.one("device_drain_state", (device_id,))
    if row is None:
        raise Refused.not_found(f"no device {device_id!r}", ErrorCode.DEVICE_NOT_FOUND)
    old = row["drain_reason"]
    if on and row["draining"] and (not reason or reason == old):
        return "already drained: " + _drained_since(tx, device_id, old), True
    if not on and not row["draining"]:
        return f"already undrained: {device_id} is not draining", True
    tx.exec("device_drain", (1 if on else 0, reason if on else "", device_id))
    if on:
        text = f"drained by {actor}" + (f": {reason}" if reason else "")
        if row["draining"]:
            text += f" (was: {old})" if old else " (it had no reason)"
        feed.record(tx, EventKind.DEVICE_DRAINED, device_id=device_id, actor=actor, text=text)
    else:
        feed.record(
            tx,
            EventKind.DEVICE_UNDRAINED,
            device_id=device_id,
            actor=actor,
            text=f"undrained by {actor}",
        )
        tx.schedule = True
    tx.notify("devices")
    if not on:
        return f"{device_id} is back in the pool", False
    if row["draining"]:
        return f"{device_id}: drain reason is now {reason!r} (was {old!r})", False
    return f"draining {device_id}", False


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
