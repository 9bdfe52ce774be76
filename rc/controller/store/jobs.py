"""Transactions on jobs: enqueue, cancel, kill, assign, hand-out, running,
release, requeue, lose; and the reads of one job or a listing.

Every change of a job's state is a function here (the other modules of the
store call them): enqueue (→ queued), assign (queued → assigned),
mark_running (assigned → running), release and kill (→ a terminal state),
cancel_queued and end_doomed (queued → killed), withdraw_queued (a queued
job taken back), requeue_unstarted and _requeue_after_hardware (back to
queued), kill_unstarted (assigned → killed), lose (→ lost). Each announces
`job:<id>` and `jobs`, and one that ends a job `log:<id>` too, so that a
follower of its log wakes at once.

Each function takes a `Tx` first and is run whole by the writer (or a reader)
of rc.controller.store.db. Refusals raise `Refused` with their error
code (rc.proto.errors).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rc.controller import idle
from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.planning import Policy, fits_ceiling, not_run_here, runs_jobs_of, runtime_on
from rc.controller.store import events, leases, rows
from rc.controller.store.db import Tx, dumps, loads
from rc.controller.store.labels import MatchCache
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import (
    RESTARTS_MAX,
    EventKind,
    Job,
    JobKind,
    JobState,
    Principal,
    token_label,
)
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


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated submission, ready to enqueue.

    selector is normalised ('' for a pinned job); device_ids is the pinned
    list (one host, no duplicates; device_id its first) and count its length,
    or () and the number of devices a selector job asks for; digest is the
    sha256 of the canonical request, compared when an idempotency key is
    reused (an owner's own keys only).

    Who: `owner` is the principal that will own it (its stored form),
    `submitter` its display label and `unix_user` the Unix user it runs as
    (docs/design.md#identity-and-ownership); `token_name` is the name of
    the caller that sent it. Under --as, `actor` is the acting admin's
    label (a submitted_as event names both), and `as_token` the name of the
    live token it is submitted as (`as_user: "token:NAME"`): owner, label
    and Unix user are then that token's, looked up by enqueue (the three
    fields given are ignored).

    `queued_limit` and `queued_spec_limit` are the per-user limits on queued
    jobs and on their spec bytes (rc serve --max-queued-spec-bytes), 0 for
    none.
    """

    kind: JobKind
    submitter: str
    token_name: str
    command: tuple[str, ...]
    selector: str
    device_id: str
    cwd: str
    env: dict[str, str]
    idempotency_key: str | None
    digest: str
    priority: int
    max_runtime: int
    idle_timeout: int
    reason: str
    stdio: str
    queued_limit: int
    count: int = 1
    device_ids: tuple[str, ...] = ()
    unix_user: str | None = None
    name: str = ""
    array_indices: tuple[int, ...] = ()
    array_items: tuple[str, ...] = ()
    array_cap: int = 0
    array_spec: str = ""
    hold_idle: int | None = None
    """A hold's idle timeout in seconds (0: off); None for a job."""
    after: tuple[tuple[int, str], ...] = ()
    requeue_on_hardware: bool = True
    queued_spec_limit: int = 0
    owner: str = ""
    actor: str = ""
    as_token: str = ""


def enqueue(tx: Tx, job: NewJob, match_cache: MatchCache) -> tuple[int, bool]:
    """Insert a queued job and ask for a scheduling pass.

    An array (`array_indices`) is one element per index, all inserted here,
    in this transaction: the returned id is its first element's, which is
    the array's id.

    Returns (job id, created). The same idempotency key from the same owner
    with the same request returns the existing job (created False); with a
    different request it is 409 idempotency_conflict; another owner's key
    is another owner's, never looked at. Refuses (400) --as a token that is
    not live, a job that would run as nobody, an unknown pinned device, a
    selector matching no device now, or fewer than `count` devices on any one
    host (no_matching_device, naming the most one host has), a runtime above
    the ceiling of a pinned device or of too many candidates (never clamped:
    runtime_above_ceiling); 429 queue_full past the per-user queued limit
    and 429 queued_spec_bytes past the per-user budget of queued spec bytes
    (both counted by Unix user, an array's every element; nothing is queued).
    """
    job = _identity(tx, job)
    if job.idempotency_key is not None:
        row = tx.one("job_by_idempotency_key", (job.owner, job.idempotency_key))
        if row is not None:
            if row["request_digest"] != job.digest:
                raise Refused(
                    ErrorCode.IDEMPOTENCY_CONFLICT,
                    f"idempotency key {job.idempotency_key!r} was used for a different "
                    f"request (job {row['id']})",
                )
            return row["id"], False
    n = len(job.array_indices) or 1
    unix_user = job.unix_user or ""
    base = spec_bytes(job)
    items = [len(item.encode()) for item in job.array_items] or [0] * n
    if job.queued_limit or job.queued_spec_limit:
        _check_queued(tx, job, unix_user, n, base * n + sum(items))
    deps = _resolve_deps(tx, job.after)
    max_runtime = job.max_runtime  # 0: inherit the ceiling where it lands (assign)
    pins = job.device_ids or ((job.device_id,) if job.device_id else ())
    if pins:
        _check_pinned(tx, pins, max_runtime)
    else:
        _check_selector(tx, job.selector, job.count, max_runtime, match_cache)
    pool = pins or tuple(match_cache.matching(tx, job.selector))
    _someone_runs_it(tx, pool, unix_user, ", ".join(pins) or f"matching {job.selector!r}")
    fields = _fields(tx, job, max_runtime, pins, unix_user, job.idempotency_key)
    job_id = tx.scalar("job_insert", {**fields, "spec_bytes": base + items[0]})
    if job.array_indices:
        _insert_elements(tx, job, job_id, max_runtime, pins, unix_user, base, items)
    if job.hold_idle is not None:
        tx.exec("hold_idle_insert", (job_id, job.hold_idle))
    if deps:
        ids = range(job_id, job_id + (len(job.array_indices) or 1))
        tx.many("dep_insert", [(i, a, cond) for i in ids for a, cond in deps])
    if job.actor:  # an admin acting for someone: both on record
        events.record(
            tx,
            EventKind.SUBMITTED_AS,
            job_id=job_id,
            actor=job.actor,
            text=f"{job.actor} submitted job {job_id} as {job.submitter} ({job.owner})",
        )
    tx.schedule = True
    tx.notify("jobs", f"job:{job_id}")
    return job_id, True


def spec_bytes(job: NewJob) -> int:
    """The bytes a job's spec takes in the store (the jobs.spec_bytes column,
    schema 11), its array item aside: its command and environment as stored
    (JSON text), its working directory and its reason, in UTF-8."""
    return sum(
        len(text.encode())
        for text in (dumps(list(job.command)), dumps(job.env), job.cwd, job.reason)
    )


def _size(n: int) -> str:
    """Bytes for a person: "262,144 bytes (256.0 KiB)"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n:,} bytes ({n / scale:.1f} {unit})"
    return f"{n:,} bytes"


def _check_queued(tx: Tx, job: NewJob, unix_user: str, n: int, adding: int) -> None:
    """The per-user limits on queued jobs: 429 queue_full when `n` more jobs
    would pass job.queued_limit, 429 queued_spec_bytes when `adding` more
    spec bytes would pass job.queued_spec_limit (0: no limit)."""
    queued = tx.one("queued_of_user", (unix_user,))
    if job.queued_limit and queued["n"] + n > job.queued_limit:
        raise Refused(
            ErrorCode.QUEUE_FULL,
            f"{unix_user} already has {job.queued_limit} queued jobs (the per-user limit)"
            if n == 1
            else f"{n} more queued jobs would pass {unix_user}'s limit of "
            f"{job.queued_limit}; nothing was queued",
        )
    limit, has = job.queued_spec_limit, queued["spec_bytes"]
    if limit and has + adding > limit:
        what = "this job's" if n == 1 else f"this array's {n} elements'"
        raise Refused(
            ErrorCode.QUEUED_SPEC_BYTES,
            f"{unix_user} has {_size(has)} of job specs queued; {what} {_size(adding)} "
            f"would pass the per-user budget of {_size(limit)} (rc serve "
            "--max-queued-spec-bytes); nothing was queued. It frees as queued jobs start "
            "or are cancelled.",
        )


def _resolve_deps(tx: Tx, after: tuple[tuple[int, str], ...]) -> list[tuple[int, str]]:
    """The (job id, condition) rows a submission's dependencies make: an
    array's id stands for every element of it. 400 bad_request for a job
    that does not exist (so only earlier jobs can be named: no cycle)."""
    out: list[tuple[int, str]] = []
    for after_id, cond in after:
        if tx.one("job_brief", (after_id,)) is None:
            raise Refused(ErrorCode.BAD_REQUEST, f"--after {after_id}: there is no job {after_id}")
        if tx.one("array_get", (after_id,)) is not None:
            out += [(r["id"], cond) for r in tx.all("array_element_ids", (after_id,))]
        else:
            out.append((after_id, cond))
    return out


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


def _fields(tx: Tx, job: NewJob, max_runtime: int, pins, unix_user: str, key: str | None) -> dict:
    """A new job's parameters of job_insert (and of job_insert_element,
    whose own follow), spec bytes aside: `key` its idempotency key (None
    for an array's later elements, which the first element's key stands
    for)."""
    return {
        "kind": job.kind.value,
        "submitter": job.submitter,
        "token_name": job.token_name,
        "selector": job.selector,
        "device_id": job.device_id,
        "command": dumps(list(job.command)),
        "cwd": job.cwd,
        "env": dumps(job.env),
        "idempotency_key": key,
        "request_digest": job.digest,
        "priority": job.priority,
        "max_runtime": max_runtime,
        "idle_timeout": job.idle_timeout,
        "reason": job.reason,
        "stdio": job.stdio,
        "now": tx.now,
        "count": len(pins) if pins else job.count,
        "device_ids": dumps(list(pins)),
        "unix_user": unix_user,
        "name": job.name,
        "requeue_on_hardware": int(job.requeue_on_hardware),
        "owner": job.owner,
    }


def _insert_elements(
    tx: Tx,
    job: NewJob,
    first: int,
    max_runtime: int,
    pins,
    unix_user: str,
    base: int,
    item_bytes: list[int],
) -> None:
    """Make job `first` the first element of an array and insert the others
    with the ids after it (one statement, the same transaction), and the
    array's row. Element k gets index array_indices[k] and item
    array_items[k] (when given), and spec bytes `base` + item_bytes[k];
    every element runs as `unix_user`."""
    items = job.array_items or ("",) * len(job.array_indices)
    indices = job.array_indices
    tx.change("job_set_array", (first, indices[0], items[0], first))
    common = _fields(tx, job, max_runtime, pins, unix_user, None)
    tx.many(
        "job_insert_element",
        [
            {
                **common,
                "id": first + k,
                "spec_bytes": base + item_bytes[k],
                "array_id": first,
                "array_index": indices[k],
                "array_item": items[k],
            }
            for k in range(1, len(indices))
        ],
    )
    tx.exec(
        "array_insert",
        (first, job.submitter, len(indices), job.array_cap, job.array_spec, tx.now, job.owner),
    )


def _check_pinned(tx: Tx, pins: tuple[str, ...], max_runtime: int) -> None:
    """Every pinned device exists and allows the runtime (400 otherwise)."""
    for d in pins:
        dev = tx.one("device_ceiling", (d,))
        if dev is None:
            raise Refused(ErrorCode.UNKNOWN_DEVICE, f"no device {d!r}")
        ceiling = dev["max_runtime"]
        if not fits_ceiling(max_runtime, ceiling):
            raise Refused(
                ErrorCode.RUNTIME_ABOVE_CEILING,
                f"{d} allows at most {format_duration(ceiling)}; "
                f"asked for {format_duration(max_runtime)}",
            )


def _check_selector(
    tx: Tx, sel: str, count: int, max_runtime: int, match_cache: MatchCache
) -> None:
    """Some host has `count` devices matching `sel` whose ceilings allow the
    runtime (400 no_matching_device or runtime_above_ceiling otherwise)."""
    matching = match_cache.matching(tx, sel)
    if not matching:
        raise Refused(ErrorCode.NO_MATCHING_DEVICE, f"no device matches selector {sel!r}")
    per_host = _per_host(matching)
    most, where = max((len(ds), h) for h, ds in per_host.items())
    if most < count:
        raise Refused(
            ErrorCode.NO_MATCHING_DEVICE,
            f"no host has {count} devices matching {sel!r}; the most on one host is "
            f"{most} (on {where})",
        )
    if not max_runtime:
        return
    ceilings = {r["id"]: r["max_runtime"] for r in tx.all("device_slots")}
    fit = {
        h: [d for d in ds if fits_ceiling(max_runtime, ceilings.get(d, 0))]
        for h, ds in per_host.items()
    }
    if any(len(ds) >= count for ds in fit.values()):
        return
    if count == 1:
        top = max(ceilings.get(d, 0) for d in matching)
        raise Refused(
            ErrorCode.RUNTIME_ABOVE_CEILING,
            f"asked for {format_duration(max_runtime)} but the highest ceiling among "
            f"devices matching {sel!r} is {format_duration(top)}",
        )
    best, where = max((len(ds), h) for h, ds in fit.items())
    raise Refused(
        ErrorCode.RUNTIME_ABOVE_CEILING,
        f"asked for {format_duration(max_runtime)} on {count} devices matching {sel!r}, "
        f"but no host has {count} whose ceiling allows it (the most on one host is {best}, "
        f"on {where})",
    )


def _per_host(device_ids) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in sorted(device_ids):
        out.setdefault(d.rpartition(":")[0], []).append(d)
    return out


def _identity(tx: Tx, job: NewJob) -> NewJob:
    """`job` with its owner, label and Unix user settled: under --as a
    token (`as_token`) that live token's. 400 bad_request for --as a token
    that is not live, or a job that would run as nobody (a token that maps
    to no Unix user: a worker token)."""
    if job.as_token:
        row = tx.one("token_live_by_name", (job.as_token,))
        if row is None:
            raise Refused(
                ErrorCode.BAD_REQUEST,
                f"as_user token:{job.as_token}: there is no live token named {job.as_token!r}",
            )
        job = replace(
            job,
            owner=str(Principal.of_token(row["id"])),
            submitter=token_label(row["name"], row["unix_user"]),
            unix_user=row["unix_user"],
        )
    if not job.unix_user:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"{job.submitter} names no Unix user to run its jobs as "
            "(an admin creates its token again with --unix-user NAME)",
        )
    return job


def _someone_runs_it(tx: Tx, pool: tuple[str, ...], unix_user: str, target: str) -> None:
    """400 no_matching_device unless a worker of some device in `pool` runs
    jobs as `unix_user` (planning.runs_jobs_of), naming why each does not."""
    policy = {r["id"]: rows.host_slot(r) for r in tx.all("workers_running_as")}
    hosts = {d.rpartition(":")[0] for d in pool}
    if any(h not in policy or runs_jobs_of(policy[h], unix_user) for h in hosts):
        return
    why = "; ".join(not_run_here(h, policy[h], unix_user) for h in sorted(hosts))
    raise Refused(
        ErrorCode.NO_MATCHING_DEVICE, f"no device {target} runs jobs as {unix_user}: {why}"
    )


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


def kill(tx: Tx, job_id: int, who: Caller, reason: str = "", retain: bool = False) -> str:
    """Kill or cancel a job for `who`; returns what happened, in words.

    Only its owner or an admin (Caller.owns; 403 not_job_owner otherwise). A queued job
    is cancelled now; an active one gets a kill request the worker picks up
    from its long poll. A terminal job: 409 not_cancellable. An admin killing
    someone else's job leaves a job_killed event naming both.

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
    if not own:
        events.record(
            tx,
            EventKind.JOB_KILLED,
            job_id=job_id,
            device_id=row["device_id"],
            actor=caller,
            text=f"{caller} killed {owner}'s job {job_id}",
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


def extend(tx: Tx, job_id: int, who: Caller, add: int, lease_grace: float, match_cache) -> int:
    """Add `add` seconds to a hold's ttl; returns the new ttl (seconds).

    Only its owner or an admin (Caller.owns; 403 not_job_owner); a job is 409
    not_a_hold, an ended hold 409 not_cancellable. The new ttl must fit the
    lowest runtime ceiling of its devices (of the devices its selector
    matches, while queued unplaced): 400 runtime_above_ceiling naming it.
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
        _check_selector(tx, row["selector"], row["count"], new, match_cache)
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


def array_summary(tx: Tx, array_id: int):
    """An array summed up (wire.ArraySummary), or None when `array_id` is no
    array's id."""
    from rc.proto.wire import ArraySummary

    a = tx.one("array_get", (array_id,))
    if a is None:
        return None
    counts, first, last = {}, None, None
    for r in tx.all("array_counts", (array_id,)):
        counts[r["state"]] = r["n"]
        if r["first_start"] is not None:
            first = r["first_start"] if first is None else min(first, r["first_start"])
        if r["last_end"] is not None:
            last = r["last_end"] if last is None else max(last, r["last_end"])
    live = sum(counts.get(s, 0) for s in ("queued", "assigned", "running"))
    done = live == 0
    wall = None
    if first is not None:
        wall = ((last or tx.now) if done else tx.now) - first
    failed = tuple(r["array_index"] for r in tx.all("array_failed_indices", (array_id,)))
    return ArraySummary(
        array_id, a["submitter"], a["size"], a["max_running"], a["spec"], counts, failed, wall, done
    )


def briefs(tx: Tx, ids: tuple[int, ...]) -> dict[int, rows.JobBrief]:
    """brief() of each job of `ids` that exists, by id, in one read."""
    out = {}
    for job_id in ids:
        row = tx.one("job_brief", (job_id,))
        if row is not None:
            out[job_id] = rows.job_brief(row)
    return out


def brief(tx: Tx, job_id: int) -> rows.JobBrief | None:
    """What access checks need of a job (rows.JobBrief: its state, kind,
    owner, worker, devices, stdio), or None when there is no such job."""
    row = tx.one("job_brief", (job_id,))
    return None if row is None else rows.job_brief(row)


def state_of(tx: Tx, job_id: int) -> str | None:
    """A job's state (JobState value), or None when there is no such job."""
    return tx.scalar("job_state", (job_id,))


@dataclass(frozen=True, slots=True)
class Filter:
    """Which jobs a listing (or a kill by filter) takes, each field empty
    for "any": on `device` (among its devices), run as Unix user `user`,
    owned by the principal `owner`, in one of
    `states` (JobState values), with a name matching the GLOB `name`,
    submitted at or after `since` (seconds since the epoch), with an id below
    `before` (keyset paging), in the array `array` (its id)."""

    device: str = ""
    user: str = ""
    owner: str = ""
    states: tuple[str, ...] = ()
    name: str = ""
    since: float = 0.0
    before: int = 0
    array: int = 0


def listing(tx: Tx, where: Filter, limit: int) -> list[Job]:
    """Jobs newest first, at most `limit`, those `where` takes, listed: their
    commands and reasons cut (rows.listed_job; GET /v1/jobs/ID has them whole)."""
    params = {
        "device": where.device,
        "user": where.user,
        "owner": where.owner,
        "states": dumps(list(where.states)),
        "name": where.name,
        "since": where.since,
        "before": where.before,
        "array": where.array,
        "limit": limit,
    }
    return [rows.listed_job(r) for r in tx.all("jobs_list", params)]


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
