"""The activity feed: every notable event is a row (docs/design.md#the-activity-feed).

`record()` is called inside the transaction that caused the event, so the
event exists exactly when the change does. Readers (`rc events`, the
dashboard, the webhook sink) read rows after an id.
"""

from __future__ import annotations

from rc.controller.store import rows
from rc.controller.store.db import Tx
from rc.proto.model import Event, EventKind

__all__ = ["after", "last_id", "record", "since"]


def record(
    tx: Tx,
    kind: EventKind,
    *,
    device_id: str = "",
    job_id: int | None = None,
    actor: str = "",
    text: str = "",
) -> int:
    """Append an event stamped with the transaction's time; returns its id."""
    event_id = tx.scalar("event_insert", (tx.now, kind.value, device_id, job_id, actor, text))
    tx.notify("events")
    return event_id


def since(tx: Tx, after_id: int, since_at: float, limit: int) -> list[Event]:
    """Events with id > after_id and at >= since_at, oldest first; with
    after_id 0, the newest `limit` such events (still oldest first)."""
    if after_id == 0:
        return [rows.event(r) for r in tx.all("events_tail", (since_at, limit))]
    return after(tx, after_id, limit, since_at)


def after(tx: Tx, after_id: int, limit: int, since_at: float = 0.0) -> list[Event]:
    """The first `limit` events with id > after_id (and at >= since_at), oldest first."""
    return [rows.event(r) for r in tx.all("events_since", (after_id, since_at, limit))]


def last_id(tx: Tx) -> int:
    """The newest event's id (0 for an empty feed)."""
    return tx.scalar("events_last_id")
