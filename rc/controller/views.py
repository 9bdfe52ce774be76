"""Read-side views: jobs, devices, the queue, and why a job waits.

Functions here take a read `Tx` (a consistent snapshot) and return rc.proto
wire records. Queue order, positions and explanations come from the same
`scheduler.plan()` the scheduling pass uses, so what `rc ps` and `rc explain`
say is what the scheduler does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rc.controller import rows
from rc.controller.db import Tx, loads
from rc.controller.errors import Refused
from rc.controller.scheduler import (
    Plan,
    Policy,
    effective_priority,
    fits_ceiling,
    load_labels,
    plan,
    queued_jobs,
    slots,
)
from rc.proto import selector as selectors
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import DeviceState, Job, JobState, Label
from rc.proto.wire import (
    DescribeResponse,
    DeviceView,
    ExplainResponse,
    JobExplanation,
    JobView,
    StateResponse,
)

__all__ = [
    "job_view",
    "device_views",
    "state",
    "describe",
    "explain_selector",
    "explain_job",
    "QueueSnapshot",
]

RECENT_JOBS = 5


@dataclass(slots=True)
class QueueSnapshot:
    """The queue planned as the scheduler would plan it now."""

    plan: Plan
    jobs: dict[int, Job]
    labels: dict[str, dict[str, str]]

    def position(self, job_id: int) -> int:
        """1 + the queued jobs ahead of this one that compete for a device it
        could use (0 when the job is not queued)."""
        if job_id not in self.jobs:
            return 0
        mine = set(self.plan.candidates.get(job_id, ()))
        ahead = 0
        for other in self.plan.order:
            if other == job_id:
                break
            if mine & set(self.plan.candidates.get(other, ())):
                ahead += 1
        return ahead + 1


def _matches(labels: dict[str, dict[str, str]], sels: set[str]) -> dict[str, frozenset[str]]:
    out = {}
    for s in sels:
        parsed = selectors.parse(s)
        out[s] = frozenset(d for d, ls in labels.items() if parsed.matches(ls))
    return out


def queue_snapshot(tx: Tx, policy: Policy) -> QueueSnapshot:
    """Plan the current queue (no writes)."""
    queued = {r["id"]: rows.job(r) for r in tx.all("jobs_queued_full")}
    labels = load_labels(tx)
    q = queued_jobs(tx.all("queued_jobs"))
    fleet = slots(tx.all("device_slots"))
    matches = _matches(labels, {j.selector for j in q if j.selector})
    usage = {r["holder"]: r["n"] for r in tx.all("live_leases_per_holder")} if policy.cap else {}
    p = plan(q, fleet, matches, tx.now, aging=policy.aging, cap=policy.cap, usage=usage)
    return QueueSnapshot(p, queued, labels)


def job_view(tx: Tx, job_id: int, policy: Policy) -> JobView:
    """A job and its queue position. 404 for an unknown id."""
    r = tx.one("job_get", (job_id,))
    if r is None:
        raise Refused.not_found(f"no job {job_id}")
    job = rows.job(r)
    pos = queue_snapshot(tx, policy).position(job_id) if job.state is JobState.QUEUED else 0
    return JobView(job, pos)


def _labels_by_device(tx: Tx) -> dict[str, list[Label]]:
    out: dict[str, list[Label]] = defaultdict(list)
    for r in tx.all("labels_all_rows"):
        out[r["device_id"]].append(rows.label(r))
    return out


def device_views(tx: Tx, with_labels: bool = True) -> list[DeviceView]:
    """Every device with who holds it, sorted by id."""
    labels = _labels_by_device(tx) if with_labels else {}
    leases = {r["device_id"]: r for r in tx.all("leases_live")}
    out = []
    for r in tx.all("devices_all"):
        dev = rows.device(r, tuple(labels.get(r["id"], ())))
        out.append(_view(dev, leases.get(r["id"]), tx.now))
    return out


def _view(dev, lease, now: float) -> DeviceView:
    age = now - dev.last_heartbeat_at
    if lease is None:
        return DeviceView(device=dev, heartbeat_age_seconds=age)
    return DeviceView(
        device=dev,
        holder=lease["holder"],
        job_id=lease["job_id"],
        kind=lease["kind"],
        reason=lease["reason"],
        command=tuple(loads(lease["command"])),
        elapsed_seconds=now - lease["acquired_at"],
        max_runtime_seconds=lease["job_max_runtime"],
        expires_at=(lease["acquired_at"] + lease["job_max_runtime"])
        if lease["job_max_runtime"]
        else None,
        heartbeat_age_seconds=age,
    )


def state(tx: Tx, policy: Policy) -> StateResponse:
    """The fleet, active jobs (newest first) and the queue in scheduling order."""
    snap = queue_snapshot(tx, policy)
    active = tuple(rows.job(r) for r in tx.all("jobs_active"))
    queued = tuple(snap.jobs[i] for i in snap.plan.order)
    return StateResponse(
        devices=tuple(device_views(tx)),
        jobs=active,
        queued=queued,
        queued_waiting_seconds={str(j.id): tx.now - j.queued_at for j in queued},
        queue_positions={str(j.id): snap.position(j.id) for j in queued},
    )


def describe(tx: Tx, device_id: str) -> DescribeResponse:
    """Everything about one device. 404 device_not_found."""
    r = tx.one("device_get", (device_id,))
    if r is None:
        raise Refused.not_found(f"no device {device_id!r}", ErrorCode.DEVICE_NOT_FOUND)
    labels = tuple(rows.label(x) for x in tx.all("labels_of_device", (device_id,)))
    dev = rows.device(r, labels)
    lease = next((x for x in tx.all("leases_live") if x["device_id"] == device_id), None)
    sheets = {x["device_name"]: x for x in tx.all("sheets_for_device", (dev.host, dev.name))}
    own = sheets.get(dev.name)
    chosen = own if own is not None and own["body"] else sheets.get("")
    recent = tuple(
        rows.job(x) for x in tx.all("jobs_recent_on_device", (device_id, RECENT_JOBS))
    )
    return DescribeResponse(
        view=_view(dev, lease, tx.now),
        labels=labels,
        label_age_seconds={f"{lb.key}/{lb.source.value}": tx.now - lb.updated_at for lb in labels},
        sheet=chosen["body"] if chosen is not None else "",
        sheet_is_host_wide=chosen is not None and chosen is not own,
        sheet_age_seconds=(tx.now - chosen["updated_at"]) if chosen is not None and chosen["body"] else None,
        recent_jobs=recent,
    )


def explain_selector(tx: Tx, text: str, policy: Policy) -> ExplainResponse:
    """Which devices a selector matches, which are free, how deep the queue is
    for them. 400 bad_selector for a malformed selector."""
    try:
        sel = selectors.parse(text)
    except selectors.SelectorError as e:
        raise Refused.bad(ErrorCode.BAD_SELECTOR, str(e)) from None
    snap = queue_snapshot(tx, policy)
    matching = sorted(d for d, ls in snap.labels.items() if sel.matches(ls))
    fleet = slots(tx.all("device_slots"))
    free = [d for d in matching if fleet[d].schedulable]
    wanted = set(matching)
    depth = sum(1 for j in snap.plan.order if wanted & set(snap.plan.candidates.get(j, ())))
    return ExplainResponse(str(sel), tuple(matching), tuple(free), depth)


def explain_job(tx: Tx, job_id: int, policy: Policy) -> JobExplanation:
    """Why a job is not running, in sentences (issue "Scheduling": rc explain JOB)."""
    r = tx.one("job_get", (job_id,))
    if r is None:
        raise Refused.not_found(f"no job {job_id}")
    job = rows.job(r)
    if job.state is not JobState.QUEUED:
        where = f" on {job.device_id}" if job.device_id else ""
        words = {
            JobState.ASSIGNED: f"It is not waiting: it was assigned{where} and is starting.",
            JobState.RUNNING: f"It is not waiting: it is running{where}.",
        }.get(job.state, f"It is not waiting: it ended ({job.state.value}"
              + (f": {job.kill_reason}" if job.kill_reason else "") + ").")
        return JobExplanation(job_id, job.state.value, (words,))
    snap = queue_snapshot(tx, policy)
    p = snap.plan
    fleet = slots(tx.all("device_slots"))
    devices = {x["id"]: x for x in tx.all("devices_all")}
    leases = {x["device_id"]: x for x in tx.all("leases_live")}
    target = job.device_id if not job.selector else job.selector
    if job.selector:
        pool = sorted(d for d, ls in snap.labels.items()
                      if selectors.parse(job.selector).matches(ls))
    else:
        pool = [job.device_id] if job.device_id in fleet else []
    reasons: list[str] = []
    blockers: dict[str, str] = {}
    if not pool:
        reasons.append(
            f"No device matches {target!r} any more (it was retired or its labels changed); "
            "it will wait until one does. Kill it with rc kill."
            if job.selector else f"Device {job.device_id} no longer exists (retired); kill this job."
        )
        return JobExplanation(job_id, "queued", tuple(reasons), snap.position(job_id), blockers)
    too_small = [d for d in pool if not fits_ceiling(job.max_runtime_seconds, fleet[d].max_runtime)]
    for d in too_small:
        blockers[d] = (f"its runtime ceiling ({format_duration(fleet[d].max_runtime)}) is below "
                       f"the job's {format_duration(job.max_runtime_seconds)}")
    cands = [d for d in pool if d not in too_small]
    if not cands:
        reasons.append(f"Every matching device has a runtime ceiling below the job's "
                       f"{format_duration(job.max_runtime_seconds)}.")
    if job_id in p.capped:
        held = sum(1 for x in leases.values() if x["holder"] == job.submitter)
        reasons.append(f"{job.submitter} already holds {held} device(s), the per-user cap "
                       f"({policy.cap}); it starts when one of them is released.")
    ahead_ids = p.order[: p.order.index(job_id)] if job_id in p.order else []
    rivals = [o for o in ahead_ids if set(cands) & set(p.candidates.get(o, ()))]
    held_by, out_of_pool, reserved = [], [], []
    for d in cands:
        s = fleet[d]
        dev = devices[d]
        lease = leases.get(d)
        if s.state is DeviceState.UNHEALTHY:
            why = dev["quarantine_detail"] or dev["quarantine_reason"] or "unknown cause"
            blockers[d] = f"quarantined ({dev['quarantine_reason'] or 'unknown'}): {why}"
            out_of_pool.append(d)
        elif s.state is DeviceState.UNKNOWN:
            blockers[d] = "its worker is not reporting"
            out_of_pool.append(d)
        elif s.draining:
            blockers[d] = "draining" + (f" ({dev['drain_reason']})" if dev["drain_reason"] else "")
            if lease is None:
                out_of_pool.append(d)
            else:
                held_by.append(d)
        elif lease is not None:
            held_by.append(d)
        elif p.reserved.get(d, job_id) != job_id:
            reserved.append(d)
            blockers[d] = f"free, but reserved for job {p.reserved[d]}, which is ahead in the queue"
        else:
            blockers[d] = "free"
        if lease is not None:
            until = ""
            if lease["job_max_runtime"]:
                end = lease["acquired_at"] + lease["job_max_runtime"]
                until = f" until at most {format_duration(max(0.0, end - tx.now))} from now"
            kind = "holds" if lease["kind"] == "hold" else "runs job %d on" % lease["job_id"]
            text = f"{lease['holder']} {kind} it{until}"
            blockers[d] = text if d not in blockers else f"{blockers[d]}; {text}"
    if held_by:
        who = "; ".join(f"{d}: {blockers[d]}" for d in held_by)
        reasons.append(f"No matching device is free: {who}.")
    if rivals:
        eff = effective_priority
        mine = next(j for j in queued_jobs(tx.all("queued_jobs")) if j.id == job_id)
        reasons.append(
            f"{len(rivals)} job(s) ahead of it want the same devices, with higher or equal "
            f"priority (its effective priority is {eff(mine, tx.now, policy.aging)})."
        )
    if out_of_pool:
        reasons.append("Matching device(s) out of the pool: "
                       + "; ".join(f"{d}: {blockers[d]}" for d in out_of_pool) + ".")
    if not reasons:
        reasons.append("A matching device is free; the next scheduling pass (within a second) "
                       "should start it.")
    return JobExplanation(job_id, "queued", tuple(reasons), snap.position(job_id), blockers)
