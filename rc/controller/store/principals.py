"""Schema 10's step after its SQL, on both engines: old jobs of local
users are owned by their uid (docs/design.md#identity-and-ownership).

Migration 0010 (migrations/0010_principals.sql, and pg/ the same) gives
every job a principal: its token's where one of its submitter's name
existed when it was submitted, else `name:<submitter>`. SQL cannot ask the
password database, so the loader runs `owners_by_uid` next, in the same
transaction: each `name:<n>` whose name this host knows becomes
`uid:<uid>` (the principal the local socket gives that user), in jobs and
arrays. A name the host no longer knows stays `name:<n>`: no caller is
ever that principal, so only an admin may act on such a job.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable
from typing import Any

from rc.proto.model import Principal

__all__ = ["owners_by_uid"]

NAME_PREFIX = Principal.NAME + ":"


def owners_by_uid(execute: Callable[..., Any], mark: str = "?") -> int:
    """Turn every `name:<n>` owner of jobs and arrays into `uid:<uid>` of
    the Unix user `n` of this host, where it has one. `execute(sql,
    params)` runs a statement on the migrating connection (`mark` is its
    placeholder: "?" for SQLite, "%s" for psycopg). Returns how many
    distinct names were found."""
    found = execute(
        "SELECT owner FROM jobs WHERE substr(owner, 1, 5) = 'name:' "
        "UNION SELECT owner FROM arrays WHERE substr(owner, 1, 5) = 'name:'"
    ).fetchall()
    moved = 0
    for (owner,) in found:
        try:
            uid = pwd.getpwnam(owner[len(NAME_PREFIX) :]).pw_uid
        except KeyError:
            continue
        new = str(Principal.of_uid(uid))
        for table in ("jobs", "arrays"):
            execute(f"UPDATE {table} SET owner = {mark} WHERE owner = {mark}", (new, owner))
        moved += 1
    return moved
