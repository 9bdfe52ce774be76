"""The store schema's checked shape and the rows of old schema versions the migration tests load (both engines)."""

from __future__ import annotations

import re

from rc.proto.model import (
    Condition,
    DeviceState,
    EventKind,
    JobKind,
    JobState,
    LabelSource,
    Link,
    QuarantineReason,
    Role,
    Stdio,
)
from tests.helpers.harness import REPO

CHECKED = {
    ("devices", "state"): DeviceState,
    ("devices", "quarantine_reason"): QuarantineReason,
    ("jobs", "kind"): JobKind,
    ("jobs", "state"): JobState,
    ("jobs", "stdio"): Stdio,
    ("leases", "kind"): JobKind,
    ("device_labels", "source"): LabelSource,
    ("events", "kind"): EventKind,
    ("tokens", "role"): Role,
    ("device_links", "link"): Link,
    ("job_deps", "condition"): Condition,
}


V9_ROWS = REPO / "tests" / "data" / "store_v9_rows.sql"
"""Rows of a schema-9 database, of every kind schema 10 must give an owner."""


def _v10_owners() -> dict[int, tuple[str, str]]:
    """What schema 10 makes of V9_ROWS' jobs: id → (owner, label)."""
    import pwd

    def uid_or_name(name: str) -> str:
        try:
            return f"uid:{pwd.getpwnam(name).pw_uid}"
        except KeyError:
            return f"name:{name}"

    return {
        1: ("token:1", "root (token admin)"),
        2: ("token:2", "alice (token alice)"),
        3: (uid_or_name("alice"), "alice"),  # the token was revoked then
        4: ("token:3", "alice (token alice)"),  # the alice made again: another principal
        5: ("token:4", "svc (token ci)"),  # --as ci: the target token's
        6: (uid_or_name("nobody"), "nobody"),  # --as a Unix user
        7: (uid_or_name("nobody"), "nobody"),
        8: ("name:rc-no-such-user-29", "rc-no-such-user-29"),  # nobody's: admins only
    }


V10_JOBS = (
    "INSERT INTO jobs (id, kind, state, submitter, selector, command, env, cwd, reason, "
    "submitted_at, queued_at, finished_at, unix_user, owner) VALUES "
    "(1, 'job', 'queued', 'alice', '*', '[\"echo\",\"h\u00e9llo \u2603\"]', '{\"K\":\"v\"}', "
    "'/tmp/\u00e9', 'why', 1, 1, NULL, 'alice', 'uid:1000'), "
    "(2, 'job', 'succeeded', 'alice', '*', '[\"true\"]', '{}', '', '', 2, 2, 3, 'alice', "
    "'uid:1000'), "
    "(3, 'job', 'queued', 'bob', '*', '[\"sleep\",\"9\"]', '{}', '', '', 4, 4, NULL, 'bob', "
    "'uid:1001')"
)
"""Jobs of a schema-10 database: non-ASCII text (spec bytes are UTF-8
bytes, not characters), a finished job, another user's."""


V11_SPEC_BYTES = {
    1: len('["echo","h\u00e9llo \u2603"]'.encode())
    + len('{"K":"v"}')
    + len("/tmp/\u00e9".encode())
    + 3,
    2: len('["true"]') + 2,
    3: len('["sleep","9"]') + 2,
}


def _prepare_text(sql: str) -> str:
    """psycopg placeholders → $n, for PREPARE (the server infers the types)."""
    seq, names = [0], {}

    def sub(m: re.Match) -> str:
        if m.group(0) == "%%":
            return "%"
        if m.group(1) is None:
            seq[0] += 1
            return f"${seq[0]}"
        names.setdefault(m.group(1), len(names) + 1)
        return f"${names[m.group(1)]}"

    return re.sub(r"%%|%\((\w+)\)s|%s", sub, sql)
