"""The queue, edited: `rc update`, `rc stash`, `rc unstash` (README "Editing
the queue").

A queued job's priority, name, max runtime, stash and begin time change in
one transaction, conditional on the job still being queued, with a
job_updated event saying what changed and a scheduling pass asked for. A
stashed job keeps its id and its queued_at, so it keeps its place in the
order: unstashed, it is where it was (the planner skips it meanwhile: it
takes and reserves nothing, and nobody waits behind it).
"""

from __future__ import annotations

from rc.controller.auth import Caller
from rc.controller.errors import Refused
from rc.controller.store import events, queue, rows
from rc.controller.store.db import Tx
from rc.controller.store.labels import MatchCache
from rc.controller.store.submit import check_selector, fits_ceiling
from rc.proto import selector as selectors
from rc.proto.duration import MAX_SECONDS, format_duration
from rc.proto.errors import ErrorCode
from rc.proto.model import (
    COUNT_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    EventKind,
    JobState,
    valid_job_name,
)
from rc.proto.wire import UpdateRequest

__all__ = ["update"]


def update(
    tx: Tx,
    job_id: int,
    who: Caller,
    req: UpdateRequest,
    max_user_priority: int,
    matches: MatchCache,
    cap: int = 0,
) -> list[str]:
    """Apply `req` to queued job `job_id`; returns what changed, in words
    ("priority 0 → 5", "stashed"), [] when nothing did.

    Refuses: 404 for no such job; 403 not_job_owner unless `who` owns it or
    is an admin; 409 not_cancellable when it is no longer queued; 400
    priority_out_of_range / priority_not_allowed as a submit would
    (`max_user_priority`, rc serve --max-user-priority); 400 bad_request
    for a bad name, a negative time, or a user lengthening the max runtime
    (an admin's: 0, the devices' ceiling, is longest), or a selector or
    count for a job pinned to devices; 400 bad_selector; and what a submit
    of the new ask would be refused for (no_matching_device,
    runtime_above_ceiling: submit.check_selector), or a count past the
    per-user device cap `cap` (0: none; 400 limit_exceeded)."""
    row = tx.one("job_get", (job_id,))
    if row is None:
        raise Refused(ErrorCode.NOT_FOUND, f"no job {job_id}")
    if not who.owns(row["owner"]):
        raise Refused(
            ErrorCode.NOT_JOB_OWNER,
            f"job {job_id} belongs to {row['submitter']}; only its owner or an admin may change it",
        )
    if row["state"] != JobState.QUEUED:
        raise Refused(
            ErrorCode.NOT_CANCELLABLE,
            f"job {job_id} is {row['state']}: only a queued job can be changed",
        )
    selector, count = _target(req, row)
    if cap and count > cap and count != row["count"]:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{count} devices is more than the per-user cap of {cap} (rc serve "
            "--max-devices-per-user): the job could never start",
        )
    new = {
        "priority": _priority(req, who, max_user_priority, row["priority"]),
        "name": _name(req, row["name"]),
        "selector": selector,
        "count": count,
        "max_runtime": _runtime(req, who, row),
        "stashed": row["stashed"] if req.stashed is None else int(req.stashed),
        "begin_at": _begin(req, row["begin_at"]),
    }
    ask = (new["selector"], new["count"], new["max_runtime"])
    if ask != (row["selector"], row["count"], row["max_runtime"]):
        _check_fits(tx, row, *ask, matches)
    said = _changes(row, new)
    if not said:
        return []
    tx.change("job_update_queued", {**new, "id": job_id})
    events.record(
        tx,
        EventKind.JOB_UPDATED,
        job_id=job_id,
        actor=who.label,
        text=f"job {job_id} changed by {who.label}: {', '.join(said)}",
    )
    tx.notify(f"job:{job_id}", "jobs")
    queue.request_pass(tx)
    return said


def _priority(req: UpdateRequest, who: Caller, limit: int, have: int) -> int:
    if req.priority is None:
        return have
    p = req.priority
    if not PRIORITY_MIN <= p <= PRIORITY_MAX:
        raise Refused(
            ErrorCode.PRIORITY_OUT_OF_RANGE,
            f"priority {p} is outside {PRIORITY_MIN}..{PRIORITY_MAX}",
        )
    if p > 0 and not who.admin and p > limit:
        raise Refused(
            ErrorCode.PRIORITY_NOT_ALLOWED,
            f"priority {p} is above this controller's limit of {limit} for users "
            "(rc serve --max-user-priority)",
        )
    return p


def _name(req: UpdateRequest, have: str) -> str:
    if req.name is None:
        return have
    if req.name and not valid_job_name(req.name):
        raise Refused(ErrorCode.BAD_REQUEST, f"{req.name[:40]!r} is not a job name")
    return req.name


def _runtime(req: UpdateRequest, who: Caller, row) -> int:
    """The new max runtime: a user's may only be shorter (0 is the longest:
    the devices' ceiling)."""
    have = row["max_runtime"]
    asked = req.max_runtime_seconds
    if asked is None or asked == have:
        return have
    if not 0 <= asked <= MAX_SECONDS:
        raise Refused(ErrorCode.BAD_REQUEST, "the max runtime must be from 0 to 100 years")
    longer = asked == 0 or (have != 0 and asked > have)
    if longer and not who.admin:
        shown = "the devices' ceiling" if asked == 0 else format_duration(asked)
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"job {row['id']}'s max runtime is {format_duration(have) if have else 'the ceiling'}; "
            f"a user may shorten it, and only an admin lengthen it (to {shown})",
        )
    return asked


def _check_fits(tx: Tx, row, selector: str, count: int, runtime: int, matches: MatchCache) -> None:
    """The job's new ask fits the fleet as a submit's must: a selector
    matching `count` devices of one host whose ceiling allows `runtime`,
    or pinned devices that allow it (400, naming the problem)."""
    if selector:
        check_selector(tx, selector, count, runtime, matches)
        return
    for d in rows.devices_of(row):
        dev = tx.one("device_ceiling", (d,))
        if dev is not None and not fits_ceiling(runtime, dev["max_runtime"]):
            raise Refused(
                ErrorCode.RUNTIME_ABOVE_CEILING,
                f"{d} allows at most {format_duration(dev['max_runtime'])}",
            )


def _target(req: UpdateRequest, row) -> tuple[str, int]:
    """The new selector (normal form) and count of a selector job; a pinned
    one may change neither (400 bad_request), a bad selector is 400
    bad_selector naming its term."""
    if req.selector is None and req.count is None:
        return row["selector"], row["count"]
    if not row["selector"]:
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"job {row['id']} is pinned to its devices: its selector and count cannot change",
        )
    sel = row["selector"]
    if req.selector is not None:
        try:
            sel = str(selectors.parse(req.selector))
        except selectors.SelectorError as e:
            raise Refused(ErrorCode.BAD_SELECTOR, str(e)) from None
    count = row["count"] if req.count is None else req.count
    if not 1 <= count <= COUNT_MAX:
        raise Refused(ErrorCode.BAD_REQUEST, f"count {count} is outside 1..{COUNT_MAX}")
    return sel, count


def _begin(req: UpdateRequest, have: float) -> float:
    if req.begin_at is None:
        return have
    if req.begin_at < 0:
        raise Refused(ErrorCode.BAD_REQUEST, "begin_at cannot be negative")
    return float(req.begin_at)


def _changes(row, new: dict) -> list[str]:
    """What differs between `row` and `new`, in words."""
    said = []
    if new["priority"] != row["priority"]:
        said.append(f"priority {row['priority']} → {new['priority']}")
    if new["name"] != row["name"]:
        said.append(f"name {row['name'] or '-'} → {new['name'] or '-'}")
    if new["selector"] != row["selector"]:
        said.append(f"selector {row['selector']!r} → {new['selector']!r}")
    if new["count"] != row["count"]:
        said.append(f"count {row['count']} → {new['count']}")
    if new["max_runtime"] != row["max_runtime"]:
        old, now = (
            format_duration(x) if x else "ceiling" for x in (row["max_runtime"], new["max_runtime"])
        )
        said.append(f"max runtime {old} → {now}")
    if new["stashed"] != row["stashed"]:
        said.append("stashed" if new["stashed"] else "unstashed")
    if new["begin_at"] != row["begin_at"]:
        said.append("begin time cleared" if not new["begin_at"] else "begin time set")
    return said
