"""Transactions on workers: register, heartbeat, leave, the sweep, recovery
(docs/design.md#quarantine-and-proof and the two sections after it).

The governing rule: never hand out a device that cannot be proven free, and
silence never promotes a device. A device leaves quarantine only by a reboot
(a changed boot id), a recovery proof (for reboot-clearable reasons, flap
limited), a returning worker in retention mode, or an admin.
"""

from __future__ import annotations

from dataclasses import dataclass

from rc.controller.errors import Refused
from rc.controller.store import devices, events, jobs, labels, leases, rows
from rc.controller.store.db import Tx, dumps
from rc.controller.store.labels import MatchCache
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, QuarantineReason, RecoveryProof
from rc.proto.wire import RegisterRequest

__all__ = [
    "Thresholds",
    "beat",
    "beat_check",
    "controller_started",
    "heartbeat",
    "leave",
    "recover",
    "register",
    "sweep",
    "touch_beats",
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


def register(tx: Tx, req: RegisterRequest, match_cache: MatchCache, th: Thresholds) -> bool:
    """A worker (re)registers: reconcile, upsert devices, maybe recover, store labels.

    Every job the controller believes runs on this worker is
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
    tx.change(
        "worker_upsert",
        (
            host,
            host,
            req.boot_id,
            req.instance,
            req.version,
            tx.now,
            tx.now,
            req.run_as,
            int(req.shared_account),
            int(req.allow_root_jobs),
        ),
    )
    why = "host rebooted" if rebooted else "worker re-registered"
    named = set(req.running_job_ids)
    for j in tx.all("jobs_active_on_worker", (host,)):
        if same_process and (j["id"] in named or j["state"] == "assigned"):
            continue
        jobs.lose(tx, j["id"], j["device_id"], why)
        for device_id in rows.devices_of(j):  # every device of the job
            if rebooted:
                # a quarantined device stays so (the reboot returns it below, by its reason)
                tx.exec("device_ready_if_busy_or_unknown", (device_id,))
            elif devices.quarantine(
                tx,
                device_id,
                QuarantineReason.REGISTRATION,
                f"job {j['id']} was running when the worker re-registered",
            ):
                events.record(
                    tx,
                    EventKind.DEVICE_UNHEALTHY,
                    device_id=device_id,
                    job_id=j["id"],
                    text=f"quarantined: job {j['id']} was in flight when the worker "
                    "re-registered, and nothing proves it is gone",
                )
    if rebooted:
        for d in tx.all("devices_recoverable_on_worker", (host,)):
            tx.change("device_unquarantine", (d["id"],))
            events.record(
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
            tx.change("device_reregister", (decl.max_runtime_seconds, tx.now, device_id))
        else:
            tx.change(
                "device_insert",
                (device_id, host, name, host, decl.max_runtime_seconds, tx.now, tx.now),
            )
    for name, r in existing.items():
        if name not in declared and tx.scalar("device_has_live_lease", (r["id"],)) == 0:
            devices.remove(tx, r["id"])
            events.record(
                tx,
                EventKind.DEVICE_RETIRED,
                device_id=r["id"],
                actor=host,
                text="no longer declared by its worker",
            )
    if req.recovery.proves():
        recover(tx, host, req.recovery, th)
    labels.set_labels(
        tx, host, tuple(declared), req.labels, req.declared_labels, req.sheet, req.device_sheets
    )
    if req.links is not None:
        labels.set_links(tx, host, req.links)
    match_cache.invalidate()
    tx.schedule = True
    tx.notify("devices", "jobs")
    return rebooted


def recover(
    tx: Tx, host: str, proof: RecoveryProof, th: Thresholds, recheck: bool = False
) -> list[str]:
    """Return this worker's reboot-clearable quarantined devices on a proof.

    Never `fault` (except, on a worker's periodic `recheck`, a fault whose detail is
    processes that survived a job's teardown: a fresh scan that finds none
    is the proof those are gone; a failed verify script or acquire hook
    still waits for rc clear), never an unknown reason, never a device with a live lease;
    at most `flap_limit` times per device per `flap_window` (then a
    recovery_refused event, once per quarantine however often the worker
    presents its proof again: it waits for a human). Returns the device ids
    recovered.
    """
    if not proof.proves():
        return []
    back = []
    tx.exec("recoveries_prune", (tx.now - th.flap_window,))  # every old one, maybe none
    out = tx.all("devices_recoverable_on_worker", (host,))
    if recheck:
        out = [*out, *tx.all("devices_survivor_faulted_on_worker", (host,))]
    for d in out:
        recent = tx.scalar("recoveries_count", (d["id"], tx.now - th.flap_window))
        if recent >= th.flap_limit:
            if not tx.scalar("recovery_refused_since", (d["id"], d["quarantined_at"] or 0.0)):
                events.record(
                    tx,
                    EventKind.RECOVERY_REFUSED,
                    device_id=d["id"],
                    text=f"recovered {recent} time{'' if recent == 1 else 's'} within "
                    f"{format_duration(th.flap_window)}; waiting for an admin (rc clear)",
                )
            continue
        tx.change("device_unquarantine", (d["id"],))
        tx.change("recovery_insert", (d["id"], tx.now, d["quarantine_reason"]))
        events.record(
            tx,
            EventKind.DEVICE_RECOVERED,
            device_id=d["id"],
            text=f"was quarantined for {d['quarantine_reason']}; {proof.summary()}"
            + (" (the worker's periodic re-check)" if recheck else ""),
        )
        back.append(d["id"])
    if back:
        tx.schedule = True
        tx.notify("devices")
    return back


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
        raise Refused(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered; register first")
    tx.exec("devices_touch", (tx.now, worker_id))  # each of its devices, maybe none
    ids = dumps(list(running))
    if running:
        # only the named jobs that are this worker's and active: maybe none
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


def beat(
    tx: Tx, worker_id: str, running: tuple[int, ...], th: Thresholds
) -> tuple[list[int], dict[str, int]]:
    """heartbeat(), and the ttl in seconds of each named hold of this
    worker's, by id (rc extend may have changed it; the worker's watchdog
    follows)."""
    stop = heartbeat(tx, worker_id, running, th)
    if not running:
        return stop, {}
    ids = dumps(list(running))
    return stop, {
        str(r["id"]): r["max_runtime"] for r in tx.all("holds_runtimes", (ids, worker_id))
    }


def beat_check(
    tx: Tx, worker_id: str, running: tuple[int, ...], th: Thresholds
) -> tuple[bool, list[int], dict[str, int]]:
    """The read half of a heartbeat, for one that may be coalesced
    (Controller.heartbeat): (whether it changes state, so that `beat` must
    write it before the reply: a device of the worker is `unknown`, or, in
    retention mode with jobs named, quarantined `worker_lost`; the named
    jobs the worker should stop; the ttl of each named hold, as `beat`
    returns them). 404 for a worker that never registered. Read-only."""
    if tx.one("worker_get", (worker_id,)) is None:
        raise Refused(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered; register first")
    if tx.scalar("devices_beat_changes", (worker_id, int(th.retain and bool(running)))):
        return True, [], {}
    if not running:
        return False, [], {}
    ids = dumps(list(running))
    stop = [r["id"] for r in tx.all("jobs_to_stop", (ids, worker_id))]
    ttls = {str(r["id"]): r["max_runtime"] for r in tx.all("holds_runtimes", (ids, worker_id))}
    return False, stop, ttls


def touch_beats(tx: Tx, beats: list[tuple[str, float, tuple[int, ...]]], th: Thresholds) -> int:
    """Write coalesced heartbeats, each (worker id, when in wall seconds,
    the job ids it named): the worker's and its devices' last heartbeat
    become `when`, and the named jobs' leases (those of its own active
    jobs) last at least until `when` + lease_renewal. Heartbeats that
    change state never come here (`beat_check`). Returns how many."""
    for worker_id, at, running in beats:
        tx.exec("worker_touch", (at, worker_id))
        tx.exec("devices_touch", (at, worker_id))
        if running:
            tx.exec("leases_renew", (at + th.lease_renewal, dumps(list(running)), worker_id))
    return len(beats)


def leave(
    tx: Tx, worker_id: str, instance: str, started: tuple[int, ...]
) -> tuple[list[int], list[int]]:
    """A worker process stops cleanly (wire.LeaveRequest): what it proves it
    never started goes back to the queue (docs/design.md#job-states).

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
        raise Refused(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered")
    if not instance or row["instance"] != instance:
        raise Refused(
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
            jobs.kill_unstarted(tx, j["id"], j["kill_reason"])
            killed.append(j["id"])
        else:
            jobs.requeue_unstarted(tx, j["id"])
            requeued.append(j["id"])
    tx.exec("devices_to_unknown", (worker_id,))  # those ready or busy, maybe none
    if requeued:
        tx.schedule = True  # another worker's device may take them now
    tx.notify("jobs", "devices")
    return requeued, killed


def sweep(tx: Tx, th: Thresholds, started_at: float) -> int:
    """Write off silent workers and expired leases (docs/design.md#sweeps-and-leases).

    Silence ≥ unknown_after: ready/busy devices → unknown. Silence ≥
    lost_after: devices → unhealthy/worker_lost and (unless retention mode)
    their jobs lost. A lease past its expiry: released with the job's other
    leases, the job lost, each of its devices quarantined lease_expired. During the startup grace after a
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
                if devices.quarantine(tx, d["id"], QuarantineReason.WORKER_LOST, detail):
                    events.record(tx, EventKind.WORKER_LOST, device_id=d["id"], text=detail)
                    changes += 1
            if not th.retain:
                for j in tx.all("jobs_active_on_worker", (w["id"],)):
                    jobs.lose(tx, j["id"], j["device_id"], "worker lost")
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
            job_id = lease["job_id"]
            # a job's leases go together: every device of it is in doubt
            released = leases.release(tx, job_id)
            job = tx.one("job_brief", (job_id,))
            if job is not None and job["state"] in ("assigned", "running"):
                jobs.lose(tx, job_id, released[0], "lease expired")
            for device_id in released:
                events.record(
                    tx,
                    EventKind.LEASE_EXPIRED,
                    device_id=device_id,
                    job_id=job_id,
                    text="lease expired",
                )
                if devices.quarantine(
                    tx,
                    device_id,
                    QuarantineReason.LEASE_EXPIRED,
                    f"the lease of job {job_id} expired",
                ):
                    events.record(
                        tx,
                        EventKind.DEVICE_UNHEALTHY,
                        device_id=device_id,
                        job_id=job_id,
                        text="quarantined: lease expired",
                    )
            changes += 1
    if changes:
        tx.notify("devices", "jobs")
    return changes


def controller_started(tx: Tx) -> int:
    """A controller (re)started: every ready or busy device is `unknown` until
    its worker speaks to this controller (a heartbeat or a registration).

    Silence never promotes a device: the records say "ready",
    but nobody has yet shown that the worker behind them is alive, and a job
    handed to a dead worker is a job lost. Leases are untouched (the startup
    grace protects them). Returns how many devices were demoted.
    """
    n = tx.exec("devices_demote_on_start")
    if n:
        tx.notify("devices")
    return n
