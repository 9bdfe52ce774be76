"""The reads of jobs: one job's brief and state, an array summed up, a
listing by Filter.

Each takes a `Tx` first and runs in one snapshot (db.read);
rc.controller.store.jobs re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rc.controller.store import rows
from rc.controller.store.db import Tx, dumps
from rc.proto.model import Job


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
