"""The transaction that submits: enqueue (→ queued) a job, a hold or an
array, with the checks a submission passes (queued limits, dependencies,
pinned devices, the selector, --as identity); spec_bytes, a submission's
size against the queued-spec limit.

Run whole by the writer of rc.controller.store.db; refusals raise
`Refused` with their error code (rc.proto.errors). rc.controller.store.jobs
re-exports NewJob, enqueue and spec_bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rc.controller.errors import Refused
from rc.controller.planning import fits_ceiling, not_run_here, runs_jobs_of
from rc.controller.store import events, rows
from rc.controller.store.db import Tx, dumps
from rc.controller.store.labels import MatchCache
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import EventKind, JobKind, Principal, token_label


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
    none. `via`: the program the caller sent it through (rc.proto.VIA_HEADER,
    "mcp"), "" for none; with one, a job_submitted event records it.
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
    begin_at: float = 0.0
    """Not to start before then (seconds since the epoch; 0: none)."""
    via: str = ""


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
        check_selector(tx, job.selector, job.count, max_runtime, match_cache)
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
    if job.via:  # a program acting for its caller (rc mcp): every write on record
        who = job.actor or job.submitter
        n = len(job.array_indices)
        what = f"array {job_id} ({n} jobs)" if n else f"{job.kind.value} {job_id}"
        events.record(
            tx,
            EventKind.JOB_SUBMITTED,
            job_id=job_id,
            actor=who,
            text=f"{who} submitted {what} via {job.via}",
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
        "begin_at": job.begin_at,
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


def check_selector(tx: Tx, sel: str, count: int, max_runtime: int, match_cache: MatchCache) -> None:
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
