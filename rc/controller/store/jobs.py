"""Transactions on jobs: cancel, kill, assign, hand-out, running, release,
requeue, lose.

Every change of a job's state is a function here or in
rc.controller.store.submit (the other modules of the store call them):
enqueue (→ queued, in submit), assign (queued → assigned), mark_running
(assigned → running), release and kill (→ a terminal state), cancel_queued
and end_doomed (queued → killed), withdraw_queued (a queued job taken
back), requeue_unstarted and _requeue_after_hardware (back to queued),
kill_unstarted (assigned → killed), lose (→ lost). Each announces
`job:<id>` and `jobs`, and one that ends a job `log:<id>` too, so that a
follower of its log wakes at once. The reads of one job or a listing are
rc.controller.store.jobqueries; this module re-exports them and enqueue,
so `jobs.enqueue`, `jobs.listing`, `jobs.brief` name them as before.

Each function takes a `Tx` first and is run whole by the writer (or a reader)
of rc.controller.store.db. Refusals raise `Refused` with their error
code (rc.proto.errors).
"""

from __future__ import annotations

from dataclasses import dataclass

from rc.controller import idle
from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.planning import Policy, fits_ceiling, runtime_on
from rc.controller.store import events, leases, rows
from rc.controller.store.db import Tx, dumps, loads
from rc.controller.store.jobqueries import (
    Filter,
    array_summary,
    brief,
    briefs,
    listing,
    state_of,
)
from rc.controller.store.submit import NewJob, check_selector, enqueue, spec_bytes
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import RESTARTS_MAX, EventKind, JobKind, JobState
from rc.proto.wire import Assignment, KillOutcome

__all__ = [
    "WATCHDOG_PREFIXES",
    "Applied",
    "Filter",
    "NewJob",
    "apply_reports",
    "array_summary",
    "assign",
    "assigned_to",
    "brief",
    "briefs",
    "cancel_queued",
    "deliver_kills",
    "end_doomed",
    "enqueue",
    "extend",
    "kill",
    "kill_unstarted",
    "listing",
    "lose",
    "mark_running",
    "pending_for",
    "release",
    "requeue_unstarted",
    "spec_bytes",
    "state_of",
    "withdraw_queued",
]


WATCHDOG_PREFIXES = ("max_runtime exceeded", "idle: no output for")
"""Kill reasons that mean a watchdog fired (_release records a watchdog_trip event)."""


def end_doomed(tx: Tx) -> list[int]:
    """End, as killed, every queued job with a dependency that can no longer
    be met (it ended as its condition excludes): "dependency 42 failed (exit
    3)". Their own dependents follow in the same call (bounded by the
    chain's length). Returns the jobs ended."""
    ended: list[int] = []
    for _ in range(10_000):
        doomed = tx.all("deps_doomed")
        if not doomed:
            break
        for r in doomed:
            dep = tx.one("job_get", (r["after_id"],))
            how = dep["state"]
            if dep["exit_code"] is not None and how == "failed":
                how = f"failed (exit {dep['exit_code']})"
            elif how == "succeeded":
                how = "succeeded (this job waited for it to fail)"
            if cancel_queued(tx, r["job_id"], f"dependency {r['after_id']} {how}"):
                ended.append(r["job_id"])
    return ended


def cancel_queued(tx: Tx, job_id: int, reason: str) -> bool:
    """queued → killed with `reason`; False when the job was no longer queued.
    A pass follows: the devices it had reserved may go to others now."""
    if tx.exec("job_cancel_queued", (reason, tx.now, job_id)) == 0:
        return False
    tx.schedule = True
    tx.notify("jobs", f"job:{job_id}", f"log:{job_id}")
    return True


def requeue_unstarted(tx: Tx, job_id: int) -> None:
    """assigned → queued: a job its worker proves it never started
    (workers.leave) goes back to the queue in its old place (its priority,
    id and queued_at kept; a selector job forgets the device it was given;
    its max_runtime stays the one assignment gave it), its leases released.
    GuardFailed unless it is assigned and holds its leases. The caller asks
    for the pass that may place it again."""
    tx.change("job_requeue", (job_id,))
    leases.release(tx, job_id)
    tx.notify(f"job:{job_id}", "jobs")


def kill_unstarted(tx: Tx, job_id: int, reason: str) -> None:
    """assigned → killed with `reason`: a job whose kill was requested
    before its worker started it, proved never started (workers.leave), its
    leases released. GuardFailed unless it is assigned or running and holds
    its leases."""
    tx.change("job_finish", ("killed", None, reason, tx.now, None, job_id))
    leases.release(tx, job_id)
    tx.notify(f"job:{job_id}", f"log:{job_id}", "jobs")


def withdraw_queued(tx: Tx, job_id: int) -> bool:
    """Take back a --no-wait submission that is still queued: the row goes
    (no listing, count or history keeps a job that never was); its id is not
    reused (AUTOINCREMENT) and its idempotency key is free again. False when
    it was no longer queued (it got a device meanwhile)."""
    if tx.exec("job_withdraw_queued", (job_id,)) == 0:
        return False
    tx.schedule = True  # what it reserved is free for others
    tx.notify("jobs", f"job:{job_id}")
    return True


def kill_many(
    tx: Tx, ids: tuple[int, ...], who: Caller, reason: str, retain: bool
) -> list[KillOutcome]:
    """kill() of each job of `ids`, in order, in this one transaction (rc kill
    of an array or a filter); a refusal of one is its outcome, not the
    whole call's."""
    out = []
    for job_id in ids:
        try:
            what = kill(tx, job_id, who, reason, retain)
        except Refused as e:
            out.append(KillOutcome(job_id, False, e.message, e.code))
            continue
        out.append(KillOutcome(job_id, True, f"{what} for job {job_id}"))
    return out


def kill(
    tx: Tx, job_id: int, who: Caller, reason: str = "", retain: bool = False, via: str = ""
) -> str:
    """Kill or cancel a job for `who`; returns what happened, in words.

    Only its owner or an admin (Caller.owns; 403 not_job_owner otherwise). A queued job
    is cancelled now; an active one gets a kill request the worker picks up
    from its long poll. A terminal job: 409 not_cancellable. An admin killing
    someone else's job leaves a job_killed event naming both, and so does
    any kill sent through a program that named itself (`via`, "mcp":
    rc.proto.VIA_HEADER), saying so.

    Retention mode (`retain`, docs/design.md#sweeps-and-leases): when the
    job's worker is silent (device unknown or quarantined worker_lost) the job
    is finalized as killed now and its lease released; the kill request stays
    for the worker, which learns of it when it names the job again (heartbeat
    stop list), and the device is not returned to the pool until the worker
    stops naming it.
    """
    row = tx.one("job_brief", (job_id,))
    if row is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    owner = row["submitter"]  # its label, for words
    if not who.owns(row["owner"]):
        raise Refused(
            ErrorCode.NOT_JOB_OWNER,
            f"hold {job_id} belongs to {owner}; only its owner or an admin may release it"
            if row["kind"] == "hold"
            else f"job {job_id} belongs to {owner}; only its owner or an admin may kill it",
        )
    own = who.principal == row["owner"]
    caller = who.label
    why = f"killed by {caller}" if own else f"killed by {caller} (admin)"
    if reason:
        why += f": {reason}"
    state = JobState(row["state"])
    if state.terminal:
        raise Refused(ErrorCode.NOT_CANCELLABLE, f"job {job_id} already ended ({state.value})")
    if not own or via:
        whose = "their own" if own else f"{owner}'s"
        events.record(
            tx,
            EventKind.JOB_KILLED,
            job_id=job_id,
            device_id=row["device_id"],
            actor=caller,
            text=f"{caller} killed {whose} job {job_id}" + (f" via {via}" if via else ""),
        )
    if state is JobState.QUEUED:
        cancel_queued(tx, job_id, why)
        return "cancelled"
    tx.change("job_request_kill", (why, job_id))
    tx.notify(f"worker:{row['worker_id']}", f"job:{job_id}", "jobs")
    if retain:
        dev = tx.one("device_state", (row["device_id"],))
        if dev is not None and (
            dev["state"] == "unknown"
            or (dev["state"] == "unhealthy" and dev["quarantine_reason"] == "worker_lost")
        ):
            tx.change("job_finish", ("killed", None, why, tx.now, None, job_id))
            leases.release(tx, job_id)
            tx.schedule = True
            tx.notify(f"log:{job_id}", "devices")
            return "killed (its worker is silent; it will be told when it returns)"
    return "kill requested"


def extend(
    tx: Tx, job_id: int, who: Caller, add: int, lease_grace: float, match_cache, ttl_max: int = 0
) -> int:
    """Add `add` seconds to a hold's ttl; returns the new ttl (seconds).

    Only its owner or an admin (Caller.owns; 403 not_job_owner); a job is 409
    not_a_hold, an ended hold 409 not_cancellable. The new ttl must fit the
    lowest runtime ceiling of its devices (of the devices its selector
    matches, while queued unplaced): 400 runtime_above_ceiling naming it.
    A user's new ttl must not pass `ttl_max` either (rc serve --hold-ttl-max;
    0: none; 400 limit_exceeded); an admin's may.
    The live leases last at least the new ttl plus `lease_grace` from when
    they began; its worker learns the new ttl by its next heartbeat.
    """
    row = tx.one("job_get", (job_id,))
    if row is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    if row["kind"] != JobKind.HOLD:
        raise Refused(
            ErrorCode.NOT_A_HOLD, f"job {job_id} is not a hold; only a hold's ttl can be extended"
        )
    if not who.owns(row["owner"]):
        raise Refused(
            ErrorCode.NOT_JOB_OWNER,
            f"hold {job_id} belongs to {row['submitter']}; only its owner or an admin may "
            "extend it",
        )
    if JobState(row["state"]).terminal:
        raise Refused(ErrorCode.NOT_CANCELLABLE, f"hold {job_id} already ended ({row['state']})")
    new = row["max_runtime"] + add
    if ttl_max and not who.admin and new > ttl_max:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"hold {job_id} may last at most {format_duration(ttl_max)} here (rc serve "
            f"--hold-ttl-max); it has {format_duration(row['max_runtime'])}, and "
            f"{format_duration(add)} more would make {format_duration(new)}",
        )
    devices = rows.devices_of(row)
    if devices:
        ceilings = [
            r["max_runtime"]
            for d in devices
            if (r := tx.one("device_ceiling", (d,))) is not None and r["max_runtime"]
        ]
        ceiling = min(ceilings, default=0)
        if not fits_ceiling(new, ceiling):
            raise Refused(
                ErrorCode.RUNTIME_ABOVE_CEILING,
                f"hold {job_id} may last at most {format_duration(ceiling)} (the ceiling of "
                f"{'its device' if len(devices) == 1 else 'its devices'}); it has "
                f"{format_duration(row['max_runtime'])}, and {format_duration(add)} more "
                f"would make {format_duration(new)}",
            )
    else:
        check_selector(tx, row["selector"], row["count"], new, match_cache)
    tx.change("job_extend", (new, job_id))
    tx.exec("leases_extend", (new, lease_grace, job_id))
    tx.notify(f"job:{job_id}", "jobs", "devices")
    return new


def assign(tx: Tx, job_id: int, device_ids: tuple[str, ...], policy: Policy) -> bool:
    """queued → assigned: give a queued job its devices (one host's, ready),
    all at once: job assigned to them (in this order: its RC_DEVICES), each
    device busy, one lease per device (leases.grant), held by its Unix user
    (the account that the per-user cap, fair share and the usage ledger
    count).

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
    leases.grant(tx, job_id, device_ids, job["unix_user"], job["kind"], job["reason"], ttl)
    tx.notify(f"worker:{worker}", f"job:{job_id}", "jobs", "devices")
    return True


def lose(tx: Tx, job_id: int, device_id: str, why: str) -> None:
    """An active job → lost, its leases released, and a job_lost event
    (naming `device_id`, its first device)."""
    if tx.exec("job_lose", (why, tx.now, job_id)):
        # no live lease left when the sweep released the expired ones first
        leases.release(tx, job_id, guarded=False)
        events.record(tx, EventKind.JOB_LOST, job_id=job_id, device_id=device_id, text=why)
        tx.schedule = True  # its dependents may be ended or freed
        tx.notify(f"job:{job_id}", f"log:{job_id}", "jobs")


def pending_for(tx: Tx, worker_id: str, redelivery: float) -> tuple[list[Assignment], int]:
    """What a worker's long poll may hand out, read without writing: the
    jobs assigned to it (as Assignments, id order: rows.assignment) and how
    many kill requests are due (never delivered, or last delivered
    `redelivery` seconds ago or more)."""
    assigned = [rows.assignment(r) for r in tx.all("jobs_assigned_to", (worker_id,))]
    due = tx.scalar("count_kills_due", (worker_id, tx.now - redelivery))
    return assigned, due


def assigned_to(tx: Tx, worker_id: str) -> list[Assignment]:
    """The jobs assigned to a worker and not yet running, with no kill
    requested (as Assignments, id order: rows.assignment): what a reply to
    its reports carries (read without writing). A job with a kill requested
    is left to the long poll, which hands it out with its kill."""
    return [
        rows.assignment(r)
        for r in tx.all("jobs_assigned_to", (worker_id,))
        if not r["kill_requested"]
    ]


def deliver_kills(tx: Tx, worker_id: str, redelivery: float) -> list[int]:
    """The kill requests a worker's long poll hands out: those never
    delivered, and those delivered `redelivery` seconds ago or more (the
    worker may not have got them). Stamps each as delivered now; returns the
    job ids."""
    kills = [r["id"] for r in tx.all("kills_due", (worker_id, tx.now - redelivery))]
    if kills:
        tx.many("kill_delivered", [(tx.now, k) for k in kills])
    return kills


def mark_running(tx: Tx, job_id: int, worker_id: str, started_at: float) -> bool:
    """assigned → running at `started_at` (0: now); False, changing nothing,
    when the job is already past assigned. 404 / 403 not_worker_job as _own."""
    return _mark_running(tx, _own(tx, job_id, worker_id), started_at)


def _mark_running(tx: Tx, row, started_at: float) -> bool:
    job_id = row["id"]
    if tx.exec("job_mark_running", (started_at or tx.now, job_id)) == 0:
        return False  # already running, or ended
    tx.notify(f"job:{job_id}", "jobs")
    return True


def release(
    tx: Tx,
    job_id: int,
    worker_id: str,
    state: JobState,
    exit_code: int | None,
    reason: str,
    started_at: float | None,
) -> bool:
    """A terminal report: record the outcome, release the job's leases, free
    its devices, together.

    Idempotent: a job already terminal is left as it is (returns False). Each
    device goes busy → ready; a quarantined one stays quarantined. A kill
    that was requested keeps its "killed by ..." reason. The first report with
    a watchdog reason leaves a watchdog_trip event (never for holds).
    """
    return _release(tx, _own(tx, job_id, worker_id), state, exit_code, reason, started_at)


def _release(
    tx: Tx, row, state: JobState, exit_code: int | None, reason: str, started_at: float | None
) -> bool:
    if JobState(row["state"]).terminal:
        return False
    job_id = row["id"]
    final_reason = (
        row["kill_reason"] if (row["kill_requested"] and state is JobState.KILLED) else reason
    )
    tx.change(
        "job_finish",
        (state.value, exit_code, final_reason, tx.now, started_at, job_id),
    )
    device_id = row["device_id"]
    for d in leases.release(tx, job_id):
        tx.exec("device_free", (d,))  # not a quarantined one: it stays out of the pool
    if row["kind"] == JobKind.JOB and reason.startswith(WATCHDOG_PREFIXES):
        events.record(tx, EventKind.WATCHDOG_TRIP, job_id=job_id, device_id=device_id, text=reason)
    tx.schedule = True
    tx.notify(f"job:{job_id}", f"log:{job_id}", "jobs", "devices")
    return True


def _own(tx: Tx, job_id: int, worker_id: str):
    row = tx.one("job_brief", (job_id,))
    if row is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    if row["worker_id"] != worker_id:
        raise Refused(
            ErrorCode.NOT_WORKER_JOB, f"job {job_id} is not assigned to worker {worker_id}"
        )
    return row


@dataclass(frozen=True, slots=True)
class Applied:
    """What apply_reports did.

    results: (job id, error code, message) per report, in order, the code
    empty for success. start_latencies: for each job these reports started
    (it was assigned, and a running or terminal report moved it on), the
    seconds from its submission to its start, for the metrics
    (rc_job_start_latency_seconds, observed after the commit).
    """

    results: list[tuple[int, str, str]]
    start_latencies: list[float]


def apply_reports(tx: Tx, worker_id: str, reports) -> Applied:
    """Apply a worker's batch of JobReports (running: mark_running; a
    terminal state: release). One refused report does not affect the others
    (each check happens before any change)."""
    out, latencies = [], []
    for rep in reports:
        try:
            if not (rep.state is JobState.RUNNING or rep.state.terminal):
                raise Refused(
                    ErrorCode.BAD_REQUEST,
                    f"a worker reports running or a terminal state, not {rep.state}",
                )
            row = _own(tx, rep.job_id, worker_id)
            if rep.state is JobState.RUNNING:
                began = _mark_running(tx, row, rep.started_at or 0.0)
            elif _requeue_after_hardware(tx, row, rep):
                began = False  # it starts again: its latency counts from then
            else:  # a job that ends straight from assigned also started
                was_assigned = row["state"] == JobState.ASSIGNED
                reason = _not_requeued(row, rep)
                ended = _release(tx, row, rep.state, rep.exit_code, reason, rep.started_at)
                began = ended and was_assigned
            if began:
                latencies.append((rep.started_at or tx.now) - row["submitted_at"])
            out.append((rep.job_id, "", ""))
        except Refused as e:
            out.append((rep.job_id, e.code, e.message))
    return Applied(out, latencies)


def _requeue_after_hardware(tx: Tx, row, rep) -> bool:
    """A terminal report that says the hardware failed the job
    (rep.hardware_cause) puts a job that opted in (requeue_on_hardware),
    was not killed on request, is not pinned (a pinned job cannot leave its
    faulty device) and has been requeued fewer than RESTARTS_MAX times back
    in the queue: its leases released and its devices freed as for an end
    (a quarantined one stays out of the pool), the faulty devices of its
    own (rep.hardware_device_ids) added to the ones it must never get again,
    one restart more (its RC_RESTART_COUNT), and a job_requeued event. Its
    log goes on: the next run appends after a separator line (README "GPU
    health"). False, changing nothing, for any other report."""
    if (
        rep.state not in (JobState.FAILED, JobState.KILLED)
        or not rep.hardware_cause
        or row["kind"] != JobKind.JOB
        or not row["selector"]
        or not row["requeue_on_hardware"]
        or row["kill_requested"]
        or row["restart_count"] >= RESTARTS_MAX
        or JobState(row["state"]).terminal
    ):
        return False
    job_id = row["id"]
    mine = set(rows.devices_of(row))
    excluded = list(
        dict.fromkeys(
            [*loads(row["excluded_device_ids"]), *(d for d in rep.hardware_device_ids if d in mine)]
        )
    )
    restart = row["restart_count"] + 1
    cause = f"cause: hardware ({rep.hardware_cause})"
    if tx.exec("job_requeue_after_hardware", (dumps(excluded), cause, job_id)) == 0:
        return False
    for d in leases.release(tx, job_id, guarded=False):
        tx.exec("device_free", (d,))  # not a quarantined one: it stays out of the pool
    events.record(
        tx,
        EventKind.JOB_REQUEUED,
        job_id=job_id,
        device_id=row["device_id"],
        text=(
            f"job {job_id} requeued after a hardware failure ({rep.hardware_cause}), "
            f"restart {restart} of {RESTARTS_MAX}"
        ),
    )
    tx.schedule = True
    tx.notify(f"job:{job_id}", f"log:{job_id}", "jobs", "devices")
    return True


def _not_requeued(row, rep) -> str:
    """The reason a job ends with: the report's, and, when the hardware
    caused it but it is not requeued, why not."""
    reason = rep.reason
    if not rep.hardware_cause or rep.state not in (JobState.FAILED, JobState.KILLED):
        return reason
    if row["kind"] != JobKind.JOB or row["kill_requested"]:
        return reason
    if "cause: hardware" not in reason:
        cause = f"cause: hardware ({rep.hardware_cause})"
        reason = f"{reason}; {cause}" if reason else cause
    if not row["requeue_on_hardware"]:
        why = "submitted with --no-requeue-on-hardware"
    elif not row["selector"]:
        why = "pinned to the faulty device"
    else:
        why = f"requeued {RESTARTS_MAX} times already"
    return f"{reason}; not requeued: {why}"


def idle_watched(tx: Tx) -> list[idle.Watched]:
    """Running holds with an idle rule not already asked to end, by id."""
    return [rows.watched_hold(r, tx.now) for r in tx.all("holds_idle_watched")]


def hold_idle_timeout(tx: Tx, job_id: int) -> int | None:
    """A hold's idle timeout in seconds (0: off); None when it has no rule."""
    r = tx.one("hold_idle_of", (job_id,))
    return None if r is None else r["timeout"]


def warn_idle(tx: Tx, w: idle.Watched, text: str) -> None:
    """The hold_idle_warning event of an idle hold (the feed and the webhook)."""
    events.record(
        tx, EventKind.HOLD_IDLE_WARNING, job_id=w.hold_id, device_id=w.device_id, text=text
    )


def reclaim_idle(tx: Tx, w: idle.Watched, reason: str) -> bool:
    """End an idle hold: a kill request whose reason is `reason` ("idle: no
    use for 2h", kept as the hold's end reason) and a hold_reclaimed event.
    False (nothing done) when it is no longer running."""
    row = tx.one("job_brief", (w.hold_id,))
    if row is None or row["state"] != JobState.RUNNING or row["kill_requested"]:
        return False
    tx.change("job_request_kill", (reason, w.hold_id))
    events.record(
        tx,
        EventKind.HOLD_RECLAIMED,
        job_id=w.hold_id,
        device_id=w.device_id,
        text=f"hold {w.hold_id} of {w.owner} released: {reason}",
    )
    tx.notify(f"worker:{row['worker_id']}", f"job:{w.hold_id}", "jobs")
    return True
