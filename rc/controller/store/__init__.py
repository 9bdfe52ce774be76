"""The store: the database engine, the named queries, and the transactions."""

from __future__ import annotations

from rc.controller.store.db import Database, Tx

__all__ = ["Database", "Tx"]
