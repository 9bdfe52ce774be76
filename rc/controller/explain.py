"""Why a job is not running, in words (`rc explain JOB`, GET /v1/jobs/{id}/explain).

The store gathers the facts in one read (rc.controller.store.views.explain_facts:
the job, and for a queued one the plan the scheduling pass would make now,
the devices it could use, who holds them and what its priority is made of);
`explanation` turns them into the answer, wire.JobExplanation. This module is
pure: no I/O and no clock (the facts carry the store's `now`), so every
sentence can be tested on facts built by hand.

For a queued job the answer says, most important first: a target that no
longer exists; devices whose worker does not run its Unix user, or whose
runtime ceiling is below its ask; no host with enough such devices; the
dependencies it waits for; its array's cap; the per-user cap; no usable
device free (who holds each, and for how long at most), or for a job on
several devices no host with enough of them free (`hosts`); devices out of
the pool (quarantined, silent worker, draining) and why; devices reserved
for a job ahead of it, and those it reserved itself (`reservation`); the
jobs ahead of it that want the same devices. `blockers` says, per device it
could use, why that device is not its now.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from rc.controller.planning import (
    QueuedJob,
    Reservation,
    Slot,
    fairshare,
    fits_ceiling,
    not_run_here,
    runs_jobs_of,
)
from rc.controller.planning.placement import host_of
from rc.proto.duration import format_duration
from rc.proto.model import DeviceState, Job, JobState, device_list
from rc.proto.wire import DeviceHolder, HostFit, JobExplanation, ReservationView

__all__ = [
    "RIVALS_NAMED",
    "Device",
    "Facts",
    "FairShare",
    "Lease",
    "Queued",
    "explanation",
    "not_waiting",
    "parked_words",
    "priority_terms",
]

RIVALS_NAMED = 5
"""How many of the jobs ahead (and of the unmet dependencies) `rc explain
JOB` names by id."""


# -- the facts --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """A live lease on a device: its job, "hold" or "job", the holder's
    display label, its reason (cut as listings carry it), the job's max
    runtime (seconds; 0: no limit) and when it was acquired (seconds since
    the epoch)."""

    job_id: int
    kind: str
    holder: str
    reason: str = ""
    max_runtime: int = 0
    acquired_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Device:
    """A device a queued job could ask for (its selector matches it, or it
    is pinned): its planner slot (state, draining, runtime ceiling, whom its
    worker runs jobs as, when it is expected free), why it is out of the
    pool as the store recorded it, its live lease, the job the plan hands it
    to in this pass and the job that reserved it (None: none)."""

    slot: Slot
    quarantine_reason: str = ""
    quarantine_detail: str = ""
    drain_reason: str = ""
    lease: Lease | None = None
    given_to: int | None = None
    reserved_for: int | None = None

    @property
    def id(self) -> str:
        """The device's id (host:name)."""
        return self.slot.id


@dataclass(frozen=True, slots=True)
class FairShare:
    """Fair share as it weighs on a queued job's account: the steps it takes
    off (0..10), the usage half-life (seconds) and the account's standing
    (None when it has none yet)."""

    adjust: int
    half_life: float
    standing: fairshare.Standing | None = None


@dataclass(frozen=True, slots=True)
class Queued:
    """What the plan says of a queued job.

    `me`: the job as planning sees it; `position`: its queue position;
    `pool`: the devices it could ask for (a selector's matches in device
    order, or its pins that still exist) and `gone` its pins that do not;
    `given`: the devices this pass hands it (None: none); `reservations`:
    its own reservation and those of the jobs that reserved one of its pool
    devices, by job id; `unmet`: (job id, state) of each dependency not met,
    None when the plan does not hold it back for them; `array_held`: its
    array's cap holds it back; `capped`: the per-user cap does, its account
    holding `account_holds` devices against a cap of `cap`; `rivals`: the
    jobs ahead of it that want a device it could use; `aging`: seconds per
    step of aging (0: off); `aged` and `effective`: its priority with aging,
    and with aging and fair share; `adjusted`: fair share adjusts some
    account now; `fair_share`: None when fair share is off."""

    me: QueuedJob
    position: int
    pool: tuple[Device, ...]
    gone: tuple[str, ...] = ()
    given: tuple[str, ...] | None = None
    reservations: dict[int, Reservation] = field(default_factory=dict)
    unmet: tuple[tuple[int, str], ...] | None = None
    array_held: bool = False
    capped: bool = False
    account_holds: int = 0
    cap: int = 0
    rivals: tuple[int, ...] = ()
    aging: float = 0.0
    aged: int = 0
    effective: int = 0
    adjusted: bool = False
    fair_share: FairShare | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything `explanation` says comes from: the job as stored, the
    store's clock (seconds since the epoch) and, while it is queued, what
    the plan says of it."""

    job: Job
    now: float
    queued: Queued | None = None


# -- the words --------------------------------------------------------------------


def explanation(f: Facts) -> JobExplanation:
    """Why the job of `f` is not running, as GET /v1/jobs/{id}/explain answers."""
    job, q = f.job, f.queued
    if q is None:
        return JobExplanation(job.id, job.state.value, (not_waiting(job),))
    vanished = _vanished(job, q)
    if vanished:
        return JobExplanation(job.id, "queued", (vanished,), q.position, {})
    blockers: dict[str, str] = {}
    cands, not_here = _candidates(q, blockers)
    per_host: dict[str, list[Device]] = {}
    for d in cands:
        per_host.setdefault(host_of(d.id), []).append(d)
    never = _never_fits(q, cands, per_host, not_here)
    if never:
        return JobExplanation(job.id, "queued", (never,), q.position, blockers)
    held, out_of_pool, free, reserved_away = _sort_candidates(q, cands, blockers, f.now)
    wants = q.me.wants
    hosts = tuple(_host_fit(h, ds, wants) for h, ds in per_host.items())
    mine = q.reservations.get(job.id)
    reservation = (
        ReservationView(mine.devices, None if math.isinf(mine.start_at) else mine.start_at)
        if mine is not None
        else None
    )
    parked = parked_words(job, f.now)
    reasons = [*parked, *_held_back(q)]
    if parked:  # what devices do says nothing of when it starts
        return JobExplanation(
            job.id, "queued", tuple(reasons), q.position, blockers, hosts, None, priority_terms(q)
        )
    if q.given is None and wants > 1:
        reasons += _no_host_free(hosts, out_of_pool, blockers, wants, f.now)
    elif not free:
        reasons += _none_free(held, out_of_pool, blockers)
    if reserved_away and q.given is None:
        reasons.append(_reserved_words(reserved_away, q, f.now))
    if mine is not None and wants > 1:  # a one-device job takes the first that frees anyway
        reasons.append(_reservation_words(mine, f.now))
    if q.rivals:
        reasons.append(_rival_words(q))
    if not reasons:
        reasons.append(_starting_words(q.given))
    return JobExplanation(
        job.id,
        "queued",
        tuple(reasons),
        q.position,
        blockers,
        hosts,
        reservation,
        priority_terms(q),
    )


def parked_words(job: Job, now: float) -> list[str]:
    """What parks a queued job (README "Editing the queue"): stashed, a
    begin time still to come; [] for neither."""
    out = []
    if job.stashed:
        out.append(
            f"It is stashed: it keeps its place but takes no device until rc unstash {job.id}."
        )
    if job.begin_at > now:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.begin_at))
        out.append(
            f"It begins at {at} (--begin), in {format_duration(max(1.0, round(job.begin_at - now)))}."
        )
    return out


def not_waiting(job: Job) -> str:
    """Why a job that is not queued is not waiting, in a sentence."""
    where = f" on {device_list(job.device_ids or (job.device_id,))}" if job.device_id else ""
    if job.state is JobState.ASSIGNED:
        return f"It is not waiting: it was assigned{where} and is starting."
    if job.state is JobState.RUNNING:
        return f"It is not waiting: it is running{where}."
    why = f": {job.kill_reason}" if job.kill_reason else ""
    return f"It is not waiting: it ended ({job.state.value}{why})."


def priority_terms(q: Queued) -> str:
    """Every term of a queued job's effective priority in one line, as the
    plan ordered it: "priority 0 + aging 2 - fair share 3 (alice: 41% of
    recent device-hours (half-life 7d), entitled 25%) = -1"."""
    me = q.me
    line = f"priority {me.priority}"
    if q.aging > 0:
        line += f" + aging {q.aged - me.priority}"
    share = q.fair_share
    if share is not None:
        line += f" - fair share {share.adjust}"
        if share.standing is not None:
            line += f" ({fairshare.words(share.standing, share.half_life, format_duration)})"
    return f"{line} = {q.effective}"


# -- a target it can never have -----------------------------------------------------


def _vanished(job: Job, q: Queued) -> str:
    """The sentence for a target that no longer exists ("" when it does)."""
    if q.pool and not q.gone:
        return ""
    if job.selector:
        return (
            f"No device matches {job.selector!r} any more (a device was retired or its "
            "labels changed); it waits until one does, or rc kill it."
        )
    gone = q.gone
    return (
        f"Device {', '.join(gone)} no longer exists (retired); rc kill this job."
        if len(gone) == 1
        else f"Devices {', '.join(gone)} no longer exist (retired); rc kill this job."
    )


def _candidates(q: Queued, blockers: dict[str, str]) -> tuple[list[Device], dict[str, str]]:
    """The pool devices that run the job's Unix user and whose ceiling allows
    its ask, and by host why a worker does not run its Unix user; the other
    devices' reasons go into `blockers`, in pool order."""
    me = q.me
    cands, not_here = [], {}
    for d in q.pool:
        slot = d.slot
        if not runs_jobs_of(slot, me.unix_user):
            host = host_of(d.id)
            blockers[d.id] = not_here[host] = not_run_here(host, slot, me.unix_user)
        elif fits_ceiling(me.max_runtime, slot.max_runtime):
            cands.append(d)
        else:
            blockers[d.id] = (
                f"its runtime ceiling ({format_duration(slot.max_runtime)}) is below the "
                f"{format_duration(me.max_runtime)} this job asks for"
            )
    return cands, not_here


def _never_fits(
    q: Queued, cands: list[Device], per_host: dict[str, list[Device]], not_here: dict[str, str]
) -> str:
    """The sentence for a job no device it could ask for can take (whom its
    worker runs jobs as, runtime ceilings, too few on one host); "" else."""
    me, wants = q.me, q.me.wants
    if not cands and not_here and all(host_of(d.id) in not_here for d in q.pool):
        return (
            f"No device it could use runs jobs as {me.unix_user}: "
            + "; ".join(not_here[h] for h in sorted(not_here))
            + ". It waits until one does, or rc kill it."
        )
    if not cands or (me.pins and len(cands) < wants):
        return (
            f"Every device it could use has a runtime ceiling below the "
            f"{format_duration(me.max_runtime)} it asks for; it cannot start until a "
            "ceiling is raised. rc kill it and ask for less."
        )
    if max(len(ds) for ds in per_host.values()) < wants:
        most, where = max((len(ds), h) for h, ds in per_host.items())
        return (
            f"No host has {wants} devices it could use (the most on one host is {most}, "
            f"on {where}: a device was retired, its labels changed, or runtime ceilings "
            "are below what it asks for); it waits until one has, or rc kill it."
        )
    return ""


# -- the devices it could use -------------------------------------------------------


def _sort_candidates(
    q: Queued, cands: list[Device], blockers: dict[str, str], now: float
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Each candidate's blocker into `blockers`, and the candidates sorted:
    (held, out of the pool, free, free but reserved for another job)."""
    job_id, wants = q.me.id, q.me.wants
    held, out_of_pool, free, reserved_away = [], [], [], []
    for d in cands:
        slot, lease = d.slot, d.lease
        who = _holding(lease, now) if lease is not None else ""
        if slot.state is DeviceState.UNHEALTHY:
            cause = d.quarantine_detail or "no detail recorded"
            blockers[d.id] = f"quarantined ({d.quarantine_reason or 'unknown cause'}): {cause}"
            out_of_pool.append(d.id)
        elif slot.state is DeviceState.UNKNOWN:
            blockers[d.id] = "its worker has stopped reporting"
            out_of_pool.append(d.id)
        elif slot.draining:
            blockers[d.id] = "draining" + (f" ({d.drain_reason})" if d.drain_reason else "")
            out_of_pool.append(d.id)
        elif lease is not None or slot.state is DeviceState.BUSY:
            blockers[d.id] = who or "busy"
            held.append(d.id)
            continue
        else:
            free.append(d.id)
            blockers[d.id] = _free_words(d, job_id, wants)
            if d.given_to is None and d.reserved_for not in (None, job_id):
                reserved_away.append(d.id)
        if who:
            blockers[d.id] += f"; {who}"
    return held, out_of_pool, free, reserved_away


def _free_words(d: Device, job_id: int, wants: int) -> str:
    """Why a free device is not this job's now (or that it is)."""
    owner, holder = d.given_to, d.reserved_for
    if owner == job_id:
        return "free: this job starts on it at the next scheduling pass"
    if owner is not None:
        return f"free, but job {owner} is ahead of this one and gets it"
    if holder == job_id:
        return f"free, reserved for this job (it needs {wants} at once)"
    if holder is not None:
        return f"free, but reserved for job {holder}"
    return "free"


def _host_fit(host: str, ds: list[Device], wants: int) -> HostFit:
    """One host a queued job could use: matching, free, and who holds the rest."""
    held = []
    for d in ds:
        lease = d.lease
        if lease is None:
            continue
        until = d.slot.free_at
        held.append(
            DeviceHolder(
                device_id=d.id,
                job_id=lease.job_id,
                holder=lease.holder,
                kind=lease.kind,
                reason=lease.reason,
                until=None if math.isinf(until) else until,
            )
        )
    free = sum(1 for d in ds if d.slot.schedulable)
    return HostFit(host, len(ds), free, wants, tuple(held))


def _holding(lease: Lease, now: float) -> str:
    """Who holds a device under `lease` and for how long at most, in words."""
    if lease.kind == "hold":
        what = f"{lease.holder} holds it" + (f" ({lease.reason})" if lease.reason else "")
    else:
        what = f"{lease.holder} runs job {lease.job_id} on it"
    if not lease.max_runtime:
        return what + ", with no time limit"
    left = lease.acquired_at + lease.max_runtime - now
    if left <= 0:
        return what + ", past its time limit (it is being stopped)"
    return what + f", for at most {format_duration(max(1.0, round(left)))} more"


# -- the reasons ------------------------------------------------------------------


def _held_back(q: Queued) -> list[str]:
    """The sentences for what the plan holds it back for: its dependencies,
    its array's cap, the per-user cap."""
    me, wants = q.me, q.me.wants
    reasons = []
    if q.unmet is not None:
        unmet = q.unmet
        named = ", ".join(f"job {j} ({state})" for j, state in unmet[:RIVALS_NAMED])
        if len(unmet) > RIVALS_NAMED:
            named += f" and {len(unmet) - RIVALS_NAMED} more"
        reasons.append(f"Waiting for {named}: it is not eligible until its dependencies end.")
    if q.array_held:
        cap = me.array_cap
        reasons.append(
            f"Its array {me.array_id} already has {_count(cap, 'element')} assigned or "
            f"running, its cap (%{cap}); it starts once one of them ends."
        )
    if q.capped:
        n = q.account_holds
        reasons.append(
            f"{me.account} already holds {_count(n, 'device')}; with the "
            f"{_count(wants, 'device')} this job needs that passes the per-user cap "
            f"(rc serve --max-devices-per-user {q.cap}); it starts once enough of "
            "them are released."
            if wants > 1
            else f"{me.account} already holds {_count(n, 'device')}, the per-user cap "
            f"(rc serve --max-devices-per-user {q.cap}); it starts once one of them "
            "is released."
        )
    return reasons


def _no_host_free(
    hosts: tuple[HostFit, ...],
    out_of_pool: list[str],
    blockers: dict[str, str],
    wants: int,
    now: float,
) -> list[str]:
    """The sentences for a job on several devices that no host has free at once."""
    if any(h.free >= wants for h in hosts):
        return []
    reasons = [
        f"No host has {wants} of the devices it could use free at once: "
        + "; ".join(_fit_words(h, now) for h in hosts)
        + "."
    ]
    if out_of_pool:
        reasons.append(
            "Out of the pool: " + "; ".join(f"{d}: {blockers[d]}" for d in out_of_pool) + "."
        )
    return reasons


def _none_free(held: list[str], out_of_pool: list[str], blockers: dict[str, str]) -> list[str]:
    """The sentences for a job none of whose devices is free: who holds
    them, and which are out of the pool and why."""
    reasons = []
    if held:
        reasons.append(
            "No matching device is free: " + "; ".join(f"{d}: {blockers[d]}" for d in held) + "."
        )
    if out_of_pool:
        lead = (
            "Every matching device is out of the pool"
            if not held
            else "The other matching devices are out of the pool"
        )
        reasons.append(lead + ": " + "; ".join(f"{d}: {blockers[d]}" for d in out_of_pool) + ".")
    return reasons


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
    """When reserved devices are expected free, in words."""
    if math.isinf(start_at):
        return "at an unknown time (a holder has no time limit)"
    if start_at <= now:
        return "now"
    return f"within {format_duration(max(1.0, round(start_at - now)))} at most"


def _reservation_words(res: Reservation, now: float) -> str:
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


def _reserved_words(ds: list[str], q: Queued, now: float) -> str:
    """Free devices this job could use that a job ahead of it reserved."""
    reserved_for = {d.id: d.reserved_for for d in q.pool}
    by_job: dict[int, list[str]] = {}
    for d in ds:
        by_job.setdefault(reserved_for[d], []).append(d)
    parts = []
    for j, mine in by_job.items():
        res = q.reservations[j]
        when = _start_words(res.start_at, now)
        parts.append(
            f"{device_list(mine)} {'is' if len(mine) == 1 else 'are'} reserved for job {j} "
            f"(it needs {len(res.devices)} at once, expected free {when})"
        )
    bound = q.me.max_runtime
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


def _rival_words(q: Queued) -> str:
    """The jobs ahead of it that want the same devices, and its priority."""
    me, rivals = q.me, q.rivals
    named = ", ".join(str(j) for j in rivals[:RIVALS_NAMED])
    if len(rivals) > RIVALS_NAMED:
        named += ", ..."
    eff = q.effective
    mine_prio = f"this job's priority is {me.priority}"
    if eff != me.priority:
        mine_prio += f", {eff} with aging" + (" and fair share" if q.adjusted else "")
    if q.aging > 0:
        mine_prio += f", and it gains a step every {format_duration(q.aging)} it waits"
    one = len(rivals) == 1
    return (
        f"{_count(len(rivals), 'job')} ahead of it with higher or equal priority "
        f"{'wants' if one else 'want'} the same devices and {'gets' if one else 'get'} "
        f"them first ({'job' if one else 'jobs'} {named}). "
        f"{mine_prio[0].upper()}{mine_prio[1:]}."
    )


def _starting_words(given: tuple[str, ...] | None) -> str:
    """Nothing holds it back: it starts at the next pass."""
    if given is not None:
        return (
            f"It is starting: {device_list(given)} "
            f"{'is' if len(given) == 1 else 'are'} free and the next "
            "scheduling pass (within a second) hands "
            f"{'it' if len(given) == 1 else 'them'} over."
        )
    return "A matching device is free; the next scheduling pass (within a second) should start it."


def _count(n: int, noun: str) -> str:
    """ "1 job", "2 jobs" """
    return f"{n} {noun}" + ("" if n == 1 else "s")
