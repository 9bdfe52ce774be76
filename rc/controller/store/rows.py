"""Database rows → records: every mapper from a row of the store to what
the rest of the controller gets (rc.proto records, the planner's records,
and the few records of the store's own below).

Nothing outside rc/controller/store sees a row (tests/unit/test_layout.py holds
it to that): a store function that answers with something read returns one
of these records, built here, so a column's name and its stored form (JSON
text, 0/1 for a boolean, an enum's value) are known in the store alone.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from rc.controller.idle import Watched
from rc.controller.planning import QueuedJob, Slot
from rc.controller.store.db import loads
from rc.proto.listed import argv_head, cut, cut_argv
from rc.proto.model import (
    Device,
    DeviceState,
    Event,
    EventKind,
    Job,
    JobKind,
    JobState,
    Label,
    LabelSource,
    QuarantineReason,
    Role,
    Stdio,
    Token,
)
from rc.proto.wire import Assignment

__all__ = [
    "JobBrief",
    "LiveToken",
    "assignment",
    "device",
    "device_slot",
    "devices_of",
    "event",
    "host_slot",
    "job",
    "job_brief",
    "job_env",
    "label",
    "listed_argv",
    "listed_job",
    "live_token",
    "queued_job",
    "token",
    "watched_hold",
]


@dataclass(frozen=True, slots=True)
class JobBrief:
    """What access checks and the relay need of one job (jobs.brief): its
    id, state, kind, `submitter` (its owner's label, for words), `owner`
    (the principal that owns it, in its stored form: Caller.owns takes
    it), the Unix user it runs as, its worker ("" before it is assigned),
    its devices (`device_id` the first of `device_ids`, as devices_of
    gives them) and its stdio."""

    id: int
    state: JobState
    kind: JobKind
    submitter: str
    owner: str
    unix_user: str
    worker_id: str
    device_id: str
    device_ids: tuple[str, ...]
    stdio: Stdio


@dataclass(frozen=True, slots=True)
class LiveToken:
    """A live token as the controller's in-memory token map keeps it
    (rc.controller.auth.TokenCache): its record (never the secret) and the
    sha256 of its secret, hex (the map's key)."""

    token: Token
    secret_hash: str


def devices_of(r: sqlite3.Row) -> tuple[str, ...]:
    """A jobs row's devices, in order (device_ids; device_id alone for a row
    that has none, a queued selector job having neither)."""
    ids = tuple(loads(r["device_ids"]))
    return ids or ((r["device_id"],) if r["device_id"] else ())


def job_brief(r: sqlite3.Row) -> JobBrief:
    """A job_brief row as a JobBrief."""
    return JobBrief(
        id=r["id"],
        state=JobState(r["state"]),
        kind=JobKind(r["kind"]),
        submitter=r["submitter"],
        owner=r["owner"],
        unix_user=r["unix_user"],
        worker_id=r["worker_id"],
        device_id=r["device_id"],
        device_ids=devices_of(r),
        stdio=Stdio(r["stdio"]),
    )


def job_env(r: sqlite3.Row) -> dict[str, str]:
    """A jobs row's environment as its worker gets it: the submitted entries,
    then what rc says about the job (RC_RESTART_COUNT: how many times a
    hardware failure requeued it, 0 on the first run; RC_JOB_NAME when it has a name;
    RC_ARRAY_ID, RC_ARRAY_INDEX and RC_ARRAY_ITEM, from an array file, for an
    array's element), which wins over an entry of the same name."""
    env = loads(r["env"])
    if r["kind"] != JobKind.JOB:
        return env
    if r["name"]:
        env["RC_JOB_NAME"] = r["name"]
    env["RC_RESTART_COUNT"] = str(r["restart_count"])
    if r["array_id"] is not None:
        env["RC_ARRAY_ID"] = str(r["array_id"])
        env["RC_ARRAY_INDEX"] = str(r["array_index"])
        if r["array_item"]:
            env["RC_ARRAY_ITEM"] = r["array_item"]
    return env


def assignment(r: sqlite3.Row) -> Assignment:
    """A jobs row (all of its columns) as its worker gets it. Its log
    offset is left 0: where a requeued run's output starts is the log
    store's to say, when it is handed out (rc.controller.handout.with_log_offset)."""
    return Assignment(
        job_id=r["id"],
        device_id=r["device_id"],
        device_ids=devices_of(r),
        kind=JobKind(r["kind"]),
        command=tuple(loads(r["command"])),
        cwd=r["cwd"],
        env=job_env(r),
        submitter=r["submitter"],
        max_runtime_seconds=r["max_runtime"],
        idle_timeout_seconds=r["idle_timeout"],
        stdio=Stdio(r["stdio"]),
        unix_user=r["unix_user"],
        restart_count=r["restart_count"],
    )


def job(r: sqlite3.Row) -> Job:
    """A jobs row as a Job, whole."""
    return _job(r, tuple(loads(r["command"])), r["reason"], r["kill_reason"])


def listed_job(r: sqlite3.Row) -> Job:
    """A listed jobs row (jobs_list's columns: command_head, reason_head and
    kill_reason_head, the starts of those texts) as a Job whose command and
    reasons are cut as listings carry them (rc.proto.listed)."""
    return _job(
        r, listed_argv(r["command_head"]), cut(r["reason_head"]), cut(r["kill_reason_head"])
    )


def listed_argv(head: str) -> tuple[str, ...]:
    """A command as listings carry it, from the start of its stored JSON
    text (rc.proto.listed.COMMAND_HEAD_CHARS of it)."""
    return cut_argv(*argv_head(head))


def _job(r: sqlite3.Row, command: tuple[str, ...], reason: str, kill_reason: str) -> Job:
    return Job(
        id=r["id"],
        kind=JobKind(r["kind"]),
        state=JobState(r["state"]),
        submitter=r["submitter"],
        command=command,
        selector=r["selector"],
        device_id=r["device_id"],
        worker_id=r["worker_id"],
        cwd=r["cwd"],
        env=loads(r["env"]),
        idempotency_key=r["idempotency_key"],
        priority=r["priority"],
        max_runtime_seconds=r["max_runtime"],
        idle_timeout_seconds=r["idle_timeout"],
        reason=reason,
        stdio=Stdio(r["stdio"]),
        exit_code=r["exit_code"],
        kill_reason=kill_reason,
        submitted_at=r["submitted_at"],
        queued_at=r["queued_at"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        count=r["count"],
        device_ids=tuple(loads(r["device_ids"])),
        unix_user=r["unix_user"],
        name=r["name"],
        array_id=r["array_id"],
        array_index=r["array_index"],
        array_item=r["array_item"],
        requeue_on_hardware=bool(r["requeue_on_hardware"]),
        restart_count=r["restart_count"],
        excluded_device_ids=tuple(loads(r["excluded_device_ids"])),
        owner=r["owner"],
        stashed=bool(r["stashed"]),
        begin_at=r["begin_at"],
    )


def label(r: sqlite3.Row) -> Label:
    """A device_labels row as a Label."""
    return Label(r["key"], r["value"], LabelSource(r["source"]), r["updated_at"])


def device(r: sqlite3.Row, labels: tuple[Label, ...] = ()) -> Device:
    """A devices row as a Device."""
    return Device(
        id=r["id"],
        host=r["host"],
        name=r["name"],
        worker_id=r["worker_id"],
        state=DeviceState(r["state"]),
        last_heartbeat_at=r["last_heartbeat_at"],
        max_runtime_seconds=r["max_runtime"],
        quarantine_reason=QuarantineReason(r["quarantine_reason"]),
        quarantine_detail=r["quarantine_detail"],
        draining=bool(r["draining"]),
        drain_reason=r["drain_reason"],
        labels=labels,
    )


def event(r: sqlite3.Row) -> Event:
    """An events row as an Event, its text cut as listings carry it (every
    reader of the feed is one: rc.proto.listed)."""
    return Event(
        id=r["id"],
        at=r["at"],
        kind=EventKind(r["kind"]),
        device_id=r["device_id"],
        job_id=r["job_id"],
        actor=r["actor"],
        text=cut(r["text"]),
    )


def live_token(r: sqlite3.Row) -> LiveToken:
    """A tokens row of a live token as a LiveToken."""
    return LiveToken(token(r), r["secret_hash"])


def queued_job(r: sqlite3.Row) -> QueuedJob:
    """A queued_jobs (or queued_jobs_ordered) row as the planner's QueuedJob."""
    return QueuedJob(
        id=r["id"],
        submitter=r["submitter"],
        priority=r["priority"],
        queued_at=r["queued_at"],
        selector=r["selector"],
        device_id=r["device_id"],
        max_runtime=r["max_runtime"],
        count=r["count"],
        device_ids=tuple(loads(r["device_ids"])) if not r["selector"] else (),
        unix_user=r["unix_user"],
        array_id=r["array_id"] or 0,
        array_cap=r["array_cap"],
        blocked=bool(r["blocked"]),
        excluded=tuple(loads(r["excluded_device_ids"])),
    )


def host_slot(r: sqlite3.Row) -> Slot:
    """Whom a worker runs jobs as (a row with a workers row's run_as,
    shared_account and allow_root_jobs), as the Slot fields
    planning.runs_jobs_of reads."""
    shared = bool(r["shared_account"])
    return Slot(
        "",
        DeviceState.READY,
        run_as="" if shared else r["run_as"],
        root_ok=shared or bool(r["allow_root_jobs"]),
    )


def device_slot(r: sqlite3.Row) -> Slot:
    """A device_slots row as the planner's Slot. A device a job holds is
    expected free at the job's start (its assignment, before it started)
    plus the runtime it was given; never, when it has none. Whom its worker
    runs jobs as rides along (a shared account runs anyone's: run_as "",
    root too)."""
    free_at = r["since"] + r["runtime"] if r["since"] is not None and r["runtime"] else math.inf
    who = host_slot(r)
    return Slot(
        r["id"],
        DeviceState(r["state"]),
        r["max_runtime"],
        bool(r["draining"]),
        free_at,
        run_as=who.run_as,
        root_ok=who.root_ok,
    )


def watched_hold(r: sqlite3.Row, now: float) -> Watched:
    """A holds_idle_watched row as the idle watch's Watched (a hold not
    started yet counts from `now`)."""
    return Watched(r["id"], r["submitter"], r["device_id"], r["started_at"] or now, r["timeout"])


def token(r: sqlite3.Row) -> Token:
    """A tokens row as a Token (never the secret)."""
    return Token(
        name=r["name"],
        role=Role(r["role"]),
        created_at=r["created_at"],
        created_by=r["created_by"],
        expires_at=r["expires_at"],
        revoked_at=r["revoked_at"],
        host=r["host"],
        unix_user=r["unix_user"],
        id=r["id"],
    )
