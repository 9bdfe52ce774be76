"""Database rows → rc.proto records."""

from __future__ import annotations

import sqlite3

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

__all__ = ["device", "devices_of", "event", "job", "label", "listed_argv", "listed_job", "token"]


def devices_of(r: sqlite3.Row) -> tuple[str, ...]:
    """A jobs row's devices, in order (device_ids; device_id alone for a row
    that has none, a queued selector job having neither)."""
    ids = tuple(loads(r["device_ids"]))
    return ids or ((r["device_id"],) if r["device_id"] else ())


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
