"""The activity feed: every notable event is a row (DESIGN.md §6.6).

`record()` is called inside the transaction that caused the event, so the
event exists exactly when the change does. Readers (`rc events`, the
dashboard, the webhook sink) read rows after an id.
"""

from __future__ import annotations

from rc.controller.store.db import Tx
from rc.proto.model import EventKind

__all__ = ["record", "since"]


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


def since(tx: Tx, after_id: int, since_at: float, limit: int):
    """Rows with id > after_id and at >= since_at, oldest first; with
    after_id 0, the newest `limit` such rows (still oldest first)."""
    if after_id == 0:
        return tx.all("events_tail", (since_at, limit))
    return tx.all("events_since", (after_id, since_at, limit))
