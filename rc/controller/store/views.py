"""Read-side views: jobs, devices, the queue, and why a job waits.

Functions here take a read `Tx` (a consistent snapshot) and return rc.proto
wire records. Queue order, positions and explanations come from the same
`planning.plan()` the scheduling pass uses, so what `rc ps` and `rc explain`
say is what the scheduler does.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.planning import (
    LazyMatches,
    Policy,
    QueuedJob,
    Snapshot,
    aged_priority,
    candidates,
    effective_priority,
    fairshare,
    fits_ceiling,
    match_devices,
    not_run_here,
    runs_jobs_of,
)
from rc.controller.planning.placement import device_key, host_of
from rc.controller.store import rows
from rc.controller.store.db import Tx, loads
from rc.controller.store.labels import effective as effective_labels
from rc.controller.store.queue import adjust_param, adjustments, snapshot
from rc.controller.store.queue import slots as queue_slots
from rc.proto import selector as selectors
from rc.proto.duration import format_duration
from rc.proto.errors import ErrorCode
from rc.proto.listed import cut
from rc.proto.model import Condition, DeviceState, Job, JobState, Label, device_list
from rc.proto.wire import (
    Dependency,
    DescribeResponse,
    DeviceHolder,
    DeviceView,
    ExplainResponse,
    HostFit,
    JobDetail,
    JobExplanation,
    JobView,
    ReservationView,
    StateResponse,
)

__all__ = [
    "Census",
    "QueueSnapshot",
    "census",
    "describe",
    "device_views",
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


RIVALS_NAMED = 5
"""How many of the jobs ahead `rc explain JOB` names by id."""


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


def explain_job(tx: Tx, job_id: int, policy: Policy) -> JobExplanation:  # noqa: C901 - too complex; it is to be split into named steps
    """Why a job is not running, in sentences (rc explain JOB).

    For a queued job, from the same plan the scheduling pass makes: the
    dependencies it waits for (and their states); the per-user cap; its
    array's cap; no usable device free (who holds each, and for how long at
    most), or for a job on several devices no host with enough of them free
    (per host: how many match, how many are free, who holds the rest and
    until when: `hosts`); devices out of the pool (quarantined, silent
    worker, draining) and why; devices reserved for a job ahead of it, and
    the devices this job reserved (`reservation`); the jobs ahead of it that
    want the same devices. `blockers` says, per device it could use, why that
    device is not its now. 404 for no such job.
    """
    r = tx.one("job_get", (job_id,))
    if r is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    job = rows.job(r)
    if job.state is not JobState.QUEUED:
        return JobExplanation(job_id, job.state.value, (_not_waiting(job),))
    q = queue_snapshot(tx, policy)
    snap, p = q.snap, q.snap.plan
    me = snap.job(job_id)
    assert me is not None  # queued in this same snapshot
    terms = priority_terms(tx, me, snap, policy)
    wants = me.wants
    if job.selector:
        pool = sorted(match_devices(q.labels, job.selector), key=device_key)
        gone = []
    else:
        pool = [d for d in me.pins if d in snap.slots]
        gone = [d for d in me.pins if d not in snap.slots]
    pos = snap.position(job_id)
    if not pool or gone:
        if job.selector:
            why = (
                f"No device matches {job.selector!r} any more (a device was retired or its "
                "labels changed); it waits until one does, or rc kill it."
            )
        else:
            why = (
                f"Device {', '.join(gone)} no longer exists (retired); rc kill this job."
                if len(gone) == 1
                else f"Devices {', '.join(gone)} no longer exist (retired); rc kill this job."
            )
        return JobExplanation(job_id, "queued", (why,), pos, {})
    blockers: dict[str, str] = {}
    cands, not_here = [], {}
    for d in pool:
        slot = snap.slots[d]
        ceiling = slot.max_runtime
        if not runs_jobs_of(slot, me.unix_user):
            host = host_of(d)
            blockers[d] = not_here[host] = not_run_here(host, slot, me.unix_user)
        elif fits_ceiling(me.max_runtime, ceiling):
            cands.append(d)
        else:
            blockers[d] = (
                f"its runtime ceiling ({format_duration(ceiling)}) is below the "
                f"{format_duration(me.max_runtime)} this job asks for"
            )
    if not cands and not_here and all(host_of(d) in not_here for d in pool):
        why = (
            f"No device it could use runs jobs as {me.unix_user}: "
            + "; ".join(not_here[h] for h in sorted(not_here))
            + ". It waits until one does, or rc kill it."
        )
        return JobExplanation(job_id, "queued", (why,), pos, blockers)
    per_host: dict[str, list[str]] = {}
    for d in cands:
        per_host.setdefault(host_of(d), []).append(d)
    if not cands or (me.pins and len(cands) < wants):
        why = (
            f"Every device it could use has a runtime ceiling below the "
            f"{format_duration(me.max_runtime)} it asks for; it cannot start until a "
            "ceiling is raised. rc kill it and ask for less."
        )
        return JobExplanation(job_id, "queued", (why,), pos, blockers)
    if max(len(ds) for ds in per_host.values()) < wants:
        most, where = max((len(ds), h) for h, ds in per_host.items())
        why = (
            f"No host has {wants} devices it could use (the most on one host is {most}, "
            f"on {where}: a device was retired, its labels changed, or runtime ceilings "
            "are below what it asks for); it waits until one has, or rc kill it."
        )
        return JobExplanation(job_id, "queued", (why,), pos, blockers)

    devices = {x["id"]: x for x in tx.all("devices_all")}
    leases = live_leases(tx)
    taken_by = {d: j for j, ds in p.assignments for d in ds}
    mine_now = next((ds for j, ds in p.assignments if j == job_id), None)
    held, out_of_pool, free, reserved_away = [], [], [], []
    for d in cands:
        slot, dev, lease = snap.slots[d], devices[d], leases.get(d)
        who = _holding(lease, tx.now) if lease is not None else ""
        if slot.state is DeviceState.UNHEALTHY:
            cause = dev["quarantine_detail"] or "no detail recorded"
            blockers[d] = f"quarantined ({dev['quarantine_reason'] or 'unknown cause'}): {cause}"
            out_of_pool.append(d)
        elif slot.state is DeviceState.UNKNOWN:
            blockers[d] = "its worker has stopped reporting"
            out_of_pool.append(d)
        elif slot.draining:
            blockers[d] = "draining" + (f" ({dev['drain_reason']})" if dev["drain_reason"] else "")
            out_of_pool.append(d)
        elif lease is not None or slot.state is DeviceState.BUSY:
            blockers[d] = who or "busy"
            held.append(d)
            continue
        else:
            free.append(d)
            owner = taken_by.get(d)
            holder = p.reserved.get(d)
            if owner == job_id:
                blockers[d] = "free: this job starts on it at the next scheduling pass"
            elif owner is not None:
                blockers[d] = f"free, but job {owner} is ahead of this one and gets it"
            elif holder == job_id:
                blockers[d] = f"free, reserved for this job (it needs {wants} at once)"
            elif holder is not None:
                blockers[d] = f"free, but reserved for job {holder}"
                reserved_away.append(d)
            else:
                blockers[d] = "free"
        if who:
            blockers[d] += f"; {who}"

    hosts = tuple(_host_fit(h, ds, wants, snap, leases) for h, ds in per_host.items())
    mine = p.reservations.get(job_id)
    reservation = (
        ReservationView(mine.devices, None if math.isinf(mine.start_at) else mine.start_at)
        if mine is not None
        else None
    )
    reasons: list[str] = []
    if job_id in p.waiting:
        unmet = [r for r in tx.all("deps_of", (job_id,)) if not _met(r)]
        named = ", ".join(f"job {r['after_id']} ({r['state']})" for r in unmet[:RIVALS_NAMED])
        if len(unmet) > RIVALS_NAMED:
            named += f" and {len(unmet) - RIVALS_NAMED} more"
        reasons.append(f"Waiting for {named}: it is not eligible until its dependencies end.")
    if job_id in p.held:
        cap = me.array_cap
        reasons.append(
            f"Its array {me.array_id} already has {_count(cap, 'element')} assigned or "
            f"running, its cap (%{cap}); it starts once one of them ends."
        )
    if job_id in p.capped:
        n = snap.usage.get(me.account, 0)
        reasons.append(
            f"{me.account} already holds {_count(n, 'device')}; with the "
            f"{_count(wants, 'device')} this job needs that passes the per-user cap "
            f"(rc serve --max-devices-per-user {policy.cap}); it starts once enough of "
            "them are released."
            if wants > 1
            else f"{me.account} already holds {_count(n, 'device')}, the per-user cap "
            f"(rc serve --max-devices-per-user {policy.cap}); it starts once one of them "
            "is released."
        )
    if mine_now is None and wants > 1:
        enough = [h for h in hosts if h.free >= wants]
        if not enough:
            reasons.append(
                f"No host has {wants} of the devices it could use free at once: "
                + "; ".join(_fit_words(h, tx.now) for h in hosts)
                + "."
            )
        if out_of_pool and not enough:
            reasons.append(
                "Out of the pool: " + "; ".join(f"{d}: {blockers[d]}" for d in out_of_pool) + "."
            )
    elif not free:
        if held:
            reasons.append(
                "No matching device is free: "
                + "; ".join(f"{d}: {blockers[d]}" for d in held)
                + "."
            )
        if out_of_pool:
            lead = (
                "Every matching device is out of the pool"
                if not held
                else "The other matching devices are out of the pool"
            )
            reasons.append(
                lead + ": " + "; ".join(f"{d}: {blockers[d]}" for d in out_of_pool) + "."
            )
    if reserved_away and mine_now is None:
        reasons.append(_reserved_words(reserved_away, p, me, snap))
    if mine is not None and wants > 1:  # a one-device job takes the first that frees anyway
        reasons.append(_reservation_words(mine, tx.now))
    rivals = snap.rivals(job_id)
    if rivals:
        named = ", ".join(str(j) for j in rivals[:RIVALS_NAMED])
        if len(rivals) > RIVALS_NAMED:
            named += ", ..."
        eff = effective_priority(me, snap.now, policy.aging, snap.adjust)
        mine_prio = f"this job's priority is {me.priority}"
        if eff != me.priority:
            mine_prio += f", {eff} with aging" + (" and fair share" if snap.adjust else "")
        if policy.aging > 0:
            mine_prio += f", and it gains a step every {format_duration(policy.aging)} it waits"
        one = len(rivals) == 1
        reasons.append(
            f"{_count(len(rivals), 'job')} ahead of it with higher or equal priority "
            f"{'wants' if one else 'want'} the same devices and {'gets' if one else 'get'} "
            f"them first ({'job' if one else 'jobs'} {named}). "
            f"{mine_prio[0].upper()}{mine_prio[1:]}."
        )
    if not reasons:
        if mine_now is not None:
            reasons.append(
                f"It is starting: {device_list(mine_now)} "
                f"{'is' if len(mine_now) == 1 else 'are'} free and the next "
                "scheduling pass (within a second) hands "
                f"{'it' if len(mine_now) == 1 else 'them'} over."
            )
        else:
            reasons.append(
                "A matching device is free; the next scheduling pass (within a "
                "second) should start it."
            )
    return JobExplanation(
        job_id, "queued", tuple(reasons), pos, blockers, hosts, reservation, terms
    )


def priority_terms(tx: Tx, me: QueuedJob, snap: Snapshot, policy: Policy) -> str:
    """Every term of a queued job's effective priority in one line, as the
    plan `snap` ordered it: "priority 0 + aging 2 - fair share 3 (alice: 41%
    of recent device-hours (half-life 7d), entitled 25%) = -1"."""
    aged = effective_priority(me, snap.now, policy.aging)
    line = f"priority {me.priority}"
    if policy.aging > 0:
        line += f" + aging {aged - me.priority}"
    shares = policy.shares
    if shares is not None and shares.half_life > 0:
        adjust = snap.adjust.get(me.account, 0)
        line += f" - fair share {adjust}"
        standing = shares.standings(tx).get(me.account)
        if standing is not None:
            line += f" ({fairshare.words(standing, shares.half_life, format_duration)})"
    return f"{line} = {effective_priority(me, snap.now, policy.aging, snap.adjust)}"


def _met(r) -> bool:
    """Whether a deps_of row is met (rc.proto.model.Condition.met_by)."""
    return Condition(r["condition"]).met_by(JobState(r["state"]))


def dependencies(tx: Tx, job_id: int) -> tuple[Dependency, ...]:
    """A job's dependencies with each one's state, exit code and whether met."""
    return tuple(
        Dependency(r["after_id"], r["condition"], r["state"], r["exit_code"], _met(r))
        for r in tx.all("deps_of", (job_id,))
    )


def _host_fit(host: str, ds: list[str], wants: int, snap: Snapshot, leases) -> HostFit:
    """One host a queued job could use: matching, free, and who holds the rest."""
    held = []
    for d in ds:
        lease = leases.get(d)
        if lease is None:
            continue
        until = snap.slots[d].free_at
        held.append(
            DeviceHolder(
                device_id=d,
                job_id=lease["job_id"],
                holder=lease["label"],
                kind=lease["kind"],
                reason=lease["reason"],
                until=None if math.isinf(until) else until,
            )
        )
    free = sum(1 for d in ds if snap.slots[d].schedulable)
    return HostFit(host, len(ds), free, wants, tuple(held))


def _fit_words(h: HostFit, now: float) -> str:
    """ "gpu-box-1: 3 of 4 free; gpu2 held by job 42 (bob) for at most 1h5m more" """
    words = f"{h.host}: {h.free} of {h.matching} free"
    for x in h.held:
        name = x.device_id.rpartition(":")[2]
        what = "hold" if x.kind == "hold" else "job"
        words += f"; {name} held by {what} {x.job_id} ({x.holder})"
        if x.until is None:
            words += " with no time limit"
        elif x.until <= now:
            words += " past its time limit (it is being stopped)"
        else:
            words += f" for at most {format_duration(max(1.0, round(x.until - now)))} more"
    return words


def _start_words(start_at: float, now: float) -> str:
    if math.isinf(start_at):
        return "at an unknown time (a holder has no time limit)"
    if start_at <= now:
        return "now"
    return f"within {format_duration(max(1.0, round(start_at - now)))} at most"


def _reservation_words(res, now: float) -> str:
    """This job's reservation, in a sentence."""
    names = device_list(res.devices)
    if math.isinf(res.start_at):
        return (
            f"It has reserved {names}: a holder has no time limit, so no start can be "
            "promised; meanwhile only jobs with a time limit may use them."
        )
    return (
        f"It has reserved {names}, expected free {_start_words(res.start_at, now)}; "
        "until then only jobs that end before that may use them."
    )


def _reserved_words(ds: list[str], p, me, snap: Snapshot) -> str:
    """Free devices this job could use that a job ahead of it reserved."""
    by_job: dict[int, list[str]] = {}
    for d in ds:
        by_job.setdefault(p.reserved[d], []).append(d)
    parts = []
    for j, mine in by_job.items():
        res = p.reservations[j]
        when = _start_words(res.start_at, snap.now)
        parts.append(
            f"{device_list(mine)} {'is' if len(mine) == 1 else 'are'} reserved for job {j} "
            f"(it needs {len(res.devices)} at once, expected free {when})"
        )
    bound = me.max_runtime
    if bound:
        tail = (
            f"this job could use {'it' if len(ds) == 1 else 'them'} meanwhile only if its "
            f"max runtime ({format_duration(bound)}) ended before then."
        )
    else:
        tail = (
            "a job may use a reserved device meanwhile only if its --max-runtime ends "
            "before then, and this one has none."
        )
    return "Free, but " + "; ".join(parts) + ": " + tail


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _not_waiting(job: Job) -> str:
    where = f" on {device_list(job.device_ids or (job.device_id,))}" if job.device_id else ""
    if job.state is JobState.ASSIGNED:
        return f"It is not waiting: it was assigned{where} and is starting."
    if job.state is JobState.RUNNING:
        return f"It is not waiting: it is running{where}."
    why = f": {job.kill_reason}" if job.kill_reason else ""
    return f"It is not waiting: it ended ({job.state.value}{why})."


def _holding(lease, now: float) -> str:
    """Who holds a device under `lease` and for how long at most, in words."""
    if lease["kind"] == "hold":
        what = f"{lease['label']} holds it" + (f" ({lease['reason']})" if lease["reason"] else "")
    else:
        what = f"{lease['label']} runs job {lease['job_id']} on it"
    runtime = lease["job_max_runtime"]
    if not runtime:
        return what + ", with no time limit"
    left = lease["acquired_at"] + runtime - now
    if left <= 0:
        return what + ", past its time limit (it is being stopped)"
    return what + f", for at most {format_duration(max(1.0, round(left)))} more"


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
