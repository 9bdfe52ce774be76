"""Read-side views: jobs, devices, the queue, and why a job waits.

Functions here take a read `Tx` (a consistent snapshot) and return rc.proto
wire records; why a job waits is gathered here as facts (explain_facts) and
put into words by rc.controller.explain. Queue order, positions and explanations come from the same
`planning.plan()` the scheduling pass uses, so what `rc ps` and `rc explain`
say is what the scheduler does.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.explain import Device, Facts, FairShare, Lease, Queued, explanation
from rc.controller.planning import (
    LazyMatches,
    Policy,
    QueuedJob,
    Slot,
    Snapshot,
    aged_priority,
    candidates,
    effective_priority,
    match_devices,
)
from rc.controller.planning.placement import device_key
from rc.controller.store import rows
from rc.controller.store.db import Tx, loads
from rc.controller.store.labels import effective as effective_labels
from rc.controller.store.queue import adjust_param, adjustments, snapshot
from rc.controller.store.queue import slots as queue_slots
from rc.proto import selector as selectors
from rc.proto.errors import ErrorCode
from rc.proto.listed import cut
from rc.proto.model import Condition, Job, JobState, Label
from rc.proto.wire import (
    Dependency,
    DescribeResponse,
    DeviceView,
    ExplainResponse,
    JobDetail,
    JobExplanation,
    JobView,
    StateResponse,
)

__all__ = [
    "Census",
    "QueueSnapshot",
    "census",
    "describe",
    "device_views",
    "explain_facts",
    "explain_job",
    "explain_selector",
    "for_caller",
    "job_detail",
    "job_view",
    "queue_snapshot",
    "state",
]

RECENT_JOBS = 5
HEALTH_HISTORY = 20
"""rc describe shows at most this many GPU health events of a device."""
HIDDEN = "(hidden)"
"""What another user sees instead of a job's environment values."""


def for_caller(job: Job, who: Caller) -> Job:
    """The job as `who` may see it: its owner (by principal) and admins see
    everything; anyone else sees the names of its environment variables,
    not their values (environments are where people put secrets)."""
    if not job.env or who.owns(job.owner):
        return job
    return dataclasses.replace(job, env={k: HIDDEN for k in job.env})


@dataclass(slots=True)
class QueueSnapshot:
    """The queue planned as the scheduler would plan it now (planning.Snapshot),
    with every device's effective labels."""

    snap: Snapshot
    labels: dict[str, dict[str, str]]

    def position(self, job_id: int) -> int:
        """1 + the queued jobs ahead of this one that would take a device it
        could use (0 when the job is not queued)."""
        return self.snap.position(job_id)


def queue_snapshot(tx: Tx, policy: Policy) -> QueueSnapshot:
    """Plan the current queue on fresh labels (no writes)."""
    labels = effective_labels(tx)
    snap = snapshot(tx, lambda sel: match_devices(labels, sel), policy)
    return QueueSnapshot(snap, labels)


def plan_snapshot(tx: Tx, policy: Policy) -> Snapshot:
    """The queue planned on fresh labels (what Controller.queue_plan caches)."""
    labels = effective_labels(tx)
    return snapshot(tx, lambda sel: match_devices(labels, sel), policy)


def job_view(tx: Tx, job_id: int, policy: Policy, snap: Snapshot | None = None) -> JobView:
    """A job and its queue position. 404 for an unknown id.

    Without a per-user cap (and no element of a capped array or job with
    dependencies queued) the
    position is counted in SQL (queue_position), never planning the queue. Under a cap, `snap`, a plan of the queue taken
    after the job's latest change (see Controller.queue_plan), saves planning
    the queue again; when it does not know the job, the queue is planned here.
    """
    r = tx.one("job_get", (job_id,))
    if r is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    job = rows.job(r)
    if job.state is not JobState.QUEUED:
        return JobView(job, 0)
    if policy.cap == 0 and not tx.scalar("any_held_queued"):
        return JobView(job, queue_position(tx, job, policy))
    if snap is None or job_id not in snap.plan.candidates:
        snap = plan_snapshot(tx, policy)
    return JobView(job, snap.position(job_id))


def job_detail(tx: Tx, job: Job, policy: Policy, log_bytes: int) -> JobDetail:
    """What `rc show` adds to a job (wire.JobDetail): times waited and run,
    the lowest ceiling of its devices, its log's size (`log_bytes`, from the
    log store) and, while queued, the first sentence of explain_job."""
    now = tx.now
    start = job.started_at
    if start is not None:
        waited: float | None = start - job.queued_at
        ran: float | None = (job.finished_at or now) - start
    else:
        waited = (job.finished_at or now) - job.queued_at
        ran = None
    ceilings = []
    for d in job.device_ids or ((job.device_id,) if job.device_id else ()):
        r = tx.one("device_ceiling", (d,))
        if r is not None and r["max_runtime"]:
            ceilings.append(r["max_runtime"])
    explain = ""
    if job.state is JobState.QUEUED:
        reasons = explain_job(tx, job.id, policy).reasons
        explain = reasons[0] if reasons else ""
    return JobDetail(
        waited,
        ran,
        min(ceilings, default=0),
        log_bytes,
        explain,
        after=dependencies(tx, job.id),
    )


def queue_position(tx: Tx, job: Job, policy: Policy) -> int:
    """Snapshot.position() of a queued job with no per-user cap in force, in
    time that does not grow with the queue in Python: SQLite counts the jobs
    ahead of it in scheduling order by what they ask for (a queue has few
    distinct asks), and the jobs whose candidates meet this job's are its
    rivals. Under a cap only a plan knows which jobs are held back, so the
    caller plans instead (job_view). Held equal to the plan by the scheduler
    state machine test.
    """
    slots = queue_slots(tx)
    labels: dict[str, dict[str, str]] = {}

    def matches(sel: str) -> frozenset[str]:
        if not labels:
            labels.update(effective_labels(tx))
        return match_devices(labels, sel)

    lazy = LazyMatches(matches)
    pins = () if job.selector else (job.device_ids or (job.device_id,))
    mine = set(
        candidates(
            job.selector,
            pins,
            job.max_runtime_seconds,
            slots,
            lazy,
            job.unix_user,
            job.excluded_device_ids,
        )
    )
    ahead = 0
    if mine:
        adjust = adjustments(tx, policy)
        eff = aged_priority(job.priority, job.queued_at, tx.now, policy.aging)
        params = {
            "id": job.id,
            "eff": eff - adjust.get(job.unix_user, 0),
            "now": tx.now,
            "aging": policy.aging,
            "adjust": adjust_param(adjust),
        }
        groups = (
            tx.all("queue_ahead_by_ask_adjusted", params)
            if adjust
            else tx.all("queue_ahead_by_ask", params)
        )
        for g in groups:
            theirs = () if g["selector"] else tuple(loads(g["device_ids"]))
            got = candidates(
                g["selector"],
                theirs,
                g["max_runtime"],
                slots,
                lazy,
                g["unix_user"],
                tuple(loads(g["excluded_device_ids"])),
            )
            if mine.intersection(got):
                ahead += g["n"]
    return ahead + 1


def _labels_by_device(tx: Tx) -> dict[str, list[Label]]:
    out: dict[str, list[Label]] = defaultdict(list)
    for r in tx.all("labels_all_rows"):
        out[r["device_id"]].append(rows.label(r))
    return out


def device_views(tx: Tx, with_labels: bool = True) -> list[DeviceView]:
    """Every device with who holds it, sorted by id."""
    labels = _labels_by_device(tx) if with_labels else {}
    leases = live_leases(tx)
    out = []
    for r in tx.all("devices_all"):
        dev = rows.device(r, tuple(labels.get(r["id"], ())))
        out.append(_view(dev, leases.get(r["id"]), tx.now))
    return out


def live_leases(tx: Tx) -> dict[str, dict]:
    """Every live lease by its device: a leases_live row whose `reason` and
    `command` (its job's) are cut as listings carry them (rc.proto.listed)."""
    out = {}
    for r in tx.all("leases_live"):
        lease = dict(r)
        lease["reason"] = cut(lease.pop("reason_head"))
        lease["command"] = rows.listed_argv(lease.pop("command_head"))
        out[lease["device_id"]] = lease
    return out


def _view(dev, lease, now: float) -> DeviceView:
    age = now - dev.last_heartbeat_at
    if lease is None:
        return DeviceView(device=dev, heartbeat_age_seconds=age)
    return DeviceView(
        device=dev,
        holder=lease["label"],
        job_id=lease["job_id"],
        kind=lease["kind"],
        reason=lease["reason"],
        command=lease["command"],
        elapsed_seconds=now - lease["acquired_at"],
        max_runtime_seconds=lease["job_max_runtime"],
        expires_at=(lease["acquired_at"] + lease["job_max_runtime"])
        if lease["job_max_runtime"]
        else None,
        heartbeat_age_seconds=age,
    )


def state(tx: Tx, policy: Policy) -> StateResponse:
    """The fleet, active jobs (newest first) and the queue in scheduling order,
    with each queued job's position and seconds waited; every job listed (its
    command and reasons cut: rows.listed_job)."""
    q = queue_snapshot(tx, policy)
    active = tuple(rows.listed_job(r) for r in tx.all("jobs_active"))
    listed = {r["id"]: rows.listed_job(r) for r in tx.all("jobs_queued_listed")}
    queued = tuple(listed[i] for i in q.snap.plan.order if i in listed)
    positions = q.snap.positions()
    return StateResponse(
        devices=tuple(device_views(tx)),
        jobs=active,
        queued=queued,
        queued_waiting_seconds={str(j.id): tx.now - j.queued_at for j in queued},
        queue_positions={str(j.id): positions[j.id] for j in queued},
    )


def describe(tx: Tx, device_id: str) -> DescribeResponse:
    """Everything about one device. 404 device_not_found."""
    r = tx.one("device_get", (device_id,))
    if r is None:
        raise Refused(ErrorCode.DEVICE_NOT_FOUND, f"no device {device_id!r}")
    labels = tuple(rows.label(x) for x in tx.all("labels_of_device", (device_id,)))
    dev = rows.device(r, labels)
    lease = live_leases(tx).get(device_id)
    sheets = {x["device_name"]: x for x in tx.all("sheets_for_device", (dev.host, dev.name))}
    own = sheets.get(dev.name)
    chosen = own if own is not None and own["body"] else sheets.get("")
    recent = tuple(
        rows.listed_job(x) for x in tx.all("jobs_recent_on_device", (device_id, RECENT_JOBS))
    )
    history = tuple(
        rows.event(x) for x in tx.all("events_health_of_device", (device_id, HEALTH_HISTORY))
    )
    return DescribeResponse(
        view=_view(dev, lease, tx.now),
        labels=labels,
        label_age_seconds={f"{lb.key}/{lb.source.value}": tx.now - lb.updated_at for lb in labels},
        sheet=chosen["body"] if chosen is not None else "",
        sheet_is_host_wide=chosen is not None and chosen is not own,
        sheet_age_seconds=(tx.now - chosen["updated_at"])
        if chosen is not None and chosen["body"]
        else None,
        recent_jobs=recent,
        health_history=history,
    )


def explain_selector(tx: Tx, text: str, policy: Policy) -> ExplainResponse:
    """Which devices a selector matches, which of them are free (ready, not
    draining), and how many queued jobs want one of them. 400 bad_selector
    for a malformed selector."""
    try:
        sel = str(selectors.parse(text))
    except selectors.SelectorError as e:
        raise Refused(ErrorCode.BAD_SELECTOR, str(e)) from None
    q = queue_snapshot(tx, policy)
    matching = sorted(match_devices(q.labels, sel))
    free = [d for d in matching if q.snap.slots[d].schedulable]
    wanted = set(matching)
    p = q.snap.plan
    depth = sum(1 for j in p.order if wanted.intersection(p.candidates.get(j, ())))
    return ExplainResponse(sel, tuple(matching), tuple(free), depth)


def explain_job(tx: Tx, job_id: int, policy: Policy) -> JobExplanation:
    """Why a job is not running, in sentences (rc explain JOB): the facts
    of explain_facts in rc.controller.explain's words. 404 for no such job."""
    return explanation(explain_facts(tx, job_id, policy))


def explain_facts(tx: Tx, job_id: int, policy: Policy) -> Facts:
    """What `rc explain JOB` says comes from (rc.controller.explain.Facts):
    the job and, while it is queued, the plan the scheduling pass would make
    now, the devices it could ask for (each with its slot, why it is out of
    the pool, its live lease, whom the plan gives it or who reserved it),
    its unmet dependencies and the terms of its priority. 404 not_found for
    no such job."""
    r = tx.one("job_get", (job_id,))
    if r is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    job = rows.job(r)
    if job.state is not JobState.QUEUED:
        return Facts(job, tx.now)
    q = queue_snapshot(tx, policy)
    snap, p = q.snap, q.snap.plan
    me = snap.job(job_id)
    assert me is not None  # queued in this same snapshot
    if job.selector:
        ids = sorted(match_devices(q.labels, job.selector), key=device_key)
    else:
        ids = [d for d in me.pins if d in snap.slots]
    devices = {x["id"]: x for x in tx.all("devices_all")}
    leases = live_leases(tx)
    given_to = {d: j for j, ds in p.assignments for d in ds}
    pool = tuple(
        _pool_device(snap.slots[d], devices[d], leases.get(d), given_to.get(d), p.reserved.get(d))
        for d in ids
    )
    wanted = {job_id} | {d.reserved_for for d in pool if d.reserved_for is not None}
    unmet = None
    if job_id in p.waiting:
        unmet = tuple(
            (x["after_id"], x["state"]) for x in tx.all("deps_of", (job_id,)) if not _met(x)
        )
    return Facts(
        job,
        tx.now,
        Queued(
            me,
            snap.position(job_id),
            pool,
            gone=() if job.selector else tuple(d for d in me.pins if d not in snap.slots),
            given=next((ds for j, ds in p.assignments if j == job_id), None),
            reservations={j: res for j, res in p.reservations.items() if j in wanted},
            unmet=unmet,
            array_held=job_id in p.held,
            capped=job_id in p.capped,
            account_holds=snap.usage.get(me.account, 0),
            cap=policy.cap,
            rivals=tuple(snap.rivals(job_id)),
            aging=policy.aging,
            aged=effective_priority(me, snap.now, policy.aging),
            effective=effective_priority(me, snap.now, policy.aging, snap.adjust),
            adjusted=bool(snap.adjust),
            fair_share=_fair_share(tx, me, snap, policy),
        ),
    )


def _pool_device(slot: Slot, row, lease, given_to: int | None, reserved_for: int | None) -> Device:
    """A device a queued job could ask for, from its slot, its devices row
    and its live lease (live_leases; None: none)."""
    return Device(
        slot,
        quarantine_reason=row["quarantine_reason"] or "",
        quarantine_detail=row["quarantine_detail"] or "",
        drain_reason=row["drain_reason"] or "",
        lease=None
        if lease is None
        else Lease(
            lease["job_id"],
            lease["kind"],
            lease["label"],
            lease["reason"],
            lease["job_max_runtime"] or 0,
            lease["acquired_at"],
        ),
        given_to=given_to,
        reserved_for=reserved_for,
    )


def _fair_share(tx: Tx, me: QueuedJob, snap: Snapshot, policy: Policy) -> FairShare | None:
    """Fair share as it weighs on `me`'s account (None when it is off)."""
    shares = policy.shares
    if shares is None or shares.half_life <= 0:
        return None
    return FairShare(
        snap.adjust.get(me.account, 0), shares.half_life, shares.standings(tx).get(me.account)
    )


def _met(r) -> bool:
    """Whether a deps_of row is met (rc.proto.model.Condition.met_by)."""
    return Condition(r["condition"]).met_by(JobState(r["state"]))


def dependencies(tx: Tx, job_id: int) -> tuple[Dependency, ...]:
    """A job's dependencies with each one's state, exit code and whether met."""
    return tuple(
        Dependency(r["after_id"], r["condition"], r["state"], r["exit_code"], _met(r))
        for r in tx.all("deps_of", (job_id,))
    )


@dataclass(frozen=True, slots=True)
class Census:
    """The store's facts for /metrics (rc.controller.metrics), read in one
    transaction. Each map holds only the keys present in the store (a state,
    reason, priority or kind with no row is absent, not 0).

    devices_by_state: DeviceState value → devices; quarantined_by_reason:
    QuarantineReason value ('' for an unknown cause) → unhealthy devices;
    draining: devices being drained; queued_by_priority: priority → queued
    jobs; jobs_by_state: JobState value → jobs; events_by_kind: EventKind
    value → feed events; heartbeat_age: worker id → seconds since its last
    heartbeat (controller clock).
    """

    devices_by_state: dict[str, int]
    quarantined_by_reason: dict[str, int]
    draining: int
    queued_by_priority: dict[int, int]
    jobs_by_state: dict[str, int]
    events_by_kind: dict[str, int]
    heartbeat_age: dict[str, float]


def census(tx: Tx) -> Census:
    """Count the store for /metrics (one pass over the jobs table)."""

    def counts(found, column: str) -> dict:
        return {r[column]: r["n"] for r in found}

    return Census(
        devices_by_state=counts(tx.all("metrics_devices_by_state"), "state"),
        quarantined_by_reason=counts(tx.all("metrics_devices_quarantined"), "quarantine_reason"),
        draining=tx.scalar("metrics_devices_draining"),
        queued_by_priority=counts(tx.all("metrics_queue_by_priority"), "priority"),
        jobs_by_state=counts(tx.all("metrics_jobs_by_state"), "state"),
        events_by_kind=counts(tx.all("metrics_events_by_kind"), "kind"),
        heartbeat_age={r["id"]: tx.now - r["last_heartbeat_at"] for r in tx.all("workers_all")},
    )
