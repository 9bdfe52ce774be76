"""The rules of names: hosts and devices (and a device list in short),
tokens, environment variables, Unix users, principals and their labels,
job names; the bounds of share weights.

Standard library only; rc.proto.model re-exports every public name.
"""

from __future__ import annotations

import re
from typing import ClassVar

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""Host and device names: letters, digits, '.', '_', '-'; at most 63 (no ':' or '/')."""


def valid_device_id(text: str) -> bool:
    """Whether `text` has the form of a device id, "host:name"."""
    host, sep, name = text.partition(":")
    return bool(sep) and bool(NAME_RE.fullmatch(host)) and bool(NAME_RE.fullmatch(name))


_NUMBERED = re.compile(r"(.*?)(\d+)")


def device_list(ids: tuple[str, ...] | list[str]) -> str:
    """Devices for people, in their order, each host named once, and a run of
    three or more numbered alike and in a row shortened: ("box:gpu0",
    "box:gpu1", "box:gpu2", "box:gpu3") → "box:gpu0..3"; ("box:gpu2",
    "box:gpu0") → "box:gpu2,gpu0"; "" for none."""
    groups: list[tuple[str, list[str]]] = []
    for d in ids:
        host, _, name = d.rpartition(":")
        if groups and groups[-1][0] == host:
            groups[-1][1].append(name)
        else:
            groups.append((host, [name]))
    out = []
    for host, names in groups:
        parts: list[str] = []
        i = 0
        while i < len(names):
            m = _NUMBERED.fullmatch(names[i])
            j = i
            if m:
                while j + 1 < len(names):
                    n = _NUMBERED.fullmatch(names[j + 1])
                    if not (n and n[1] == m[1] and int(n[2]) == int(m[2]) + (j + 1 - i)):
                        break
                    j += 1
            if m and j - i >= 2:
                parts.append(f"{names[i]}..{int(m[2]) + (j - i)}")
            else:
                parts.extend(names[i : j + 1])
            i = j + 1
        out.append(f"{host}:{','.join(parts)}" if host else ",".join(parts))
    return ", ".join(out)


SHARE_WEIGHT_MIN = 0.01
"""The smallest fair-share weight: a smaller one rounds its entitlement, and
the adjustment with it, to nothing (README "Sharing fairly")."""


SHARE_WEIGHT_MAX = 1000.0
"""The largest fair-share weight."""


TOKEN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
"""A token's name: what `rc token create NAME` takes, and part of its jobs'
display label (token_label). Never an identity: a token is its id."""


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable name a job may set: letters, digits and '_', not
starting with a digit (what a shell can name)."""


def valid_env_name(name: str) -> bool:
    """Whether `name` is an environment variable name a job may set (ENV_NAME_RE)."""
    return bool(ENV_NAME_RE.fullmatch(name))


UNIX_USER_MAX_BYTES = 32
"""The longest Unix user name, in bytes of UTF-8 (useradd's limit on Debian)."""


UNIX_USER_RE = re.compile(r"[^\s:,/+~-][^\s:,/]*")
"""The shape of a Unix user name (valid_unix_user has the whole rule): not
starting with '-', '+' or '~', and no whitespace, ':', ',' or '/'."""


HEALTH_UNANSWERED = "unanswered"
"""The `health` label of a GPU whose nvidia-smi did not answer the last health
pass in time (a hung driver): the scheduler hands it to no job, and does not
reserve it, until a pass reads it again (README "GPU health")."""


ROOT = "root"
"""The Unix user a token maps to only when an admin says so (--unix-user root)."""


def valid_unix_user(name: str) -> bool:
    """Whether `name` is a Unix user name rc takes (a socket identity,
    `--unix-user`, `--as`, what a job runs as).

    The rule is what Debian's useradd accepts without --badname (shadow
    4.13: not starting with '-', '+' or '~'; no ':', ',' or whitespace;
    capitals, dots, digits, '_', '$', '@' are fine: `john.doe`, `Erin`),
    at most UNIX_USER_MAX_BYTES bytes, less what rc refuses as well: control
    characters, '/', a name of digits only (it reads as a uid), and '.' and
    '..'. No such name holds a space, so none can equal a token's display
    label (token_label)."""
    return (
        bool(UNIX_USER_RE.fullmatch(name))
        and name.isprintable()
        and len(name.encode()) <= UNIX_USER_MAX_BYTES
        and not name.isdigit()
        and name not in (".", "..")
    )


PRINCIPAL_RE = re.compile(r"token:[1-9][0-9]{0,18}|uid:(?:0|[1-9][0-9]{0,9})|name:\S{1,64}")
"""A principal's stored form (Principal): `token:<tokens.id>`,
`uid:<uid>`, or `name:<name>` (see Principal.NAME)."""


class Principal:
    """Who a caller is, and who owns a job, as a stable id
    (docs/design.md#identity-and-ownership). Ownership is equality of
    principals; a name never decides it.

    `token:<id>`: an API token by its tokens.id (AUTOINCREMENT, never
    reused: a token revoked and created again under the same name is
    another principal). `uid:<n>`: a local Unix user the controller's
    socket identified by SO_PEERCRED. `name:<n>` (NAME): only in rows from
    before principals (schema 10's migration) whose submitter neither had a
    token then nor is a user the controller's host knows; no caller is
    ever one, so such a job is its admins' alone.

    Stored and sent as text, str() (never as a record of its own); parse()
    reads it back. Raises ValueError for anything but those three shapes."""

    __slots__ = ("kind", "value")

    TOKEN: ClassVar[str] = "token"
    UID: ClassVar[str] = "uid"
    NAME: ClassVar[str] = "name"

    def __init__(self, kind: str, value: str) -> None:
        if not PRINCIPAL_RE.fullmatch(f"{kind}:{value}"):
            raise ValueError(f"{kind}:{value!s:.40} is not a principal")
        self.kind = kind
        self.value = value

    @classmethod
    def of_token(cls, token_id: int) -> Principal:
        """The principal of API token `token_id` (its tokens.id, >= 1)."""
        return cls(cls.TOKEN, str(token_id))

    @classmethod
    def of_uid(cls, uid: int) -> Principal:
        """The principal of the local Unix user with this uid."""
        return cls(cls.UID, str(uid))

    @classmethod
    def parse(cls, text: str) -> Principal:
        """The principal stored as `text`. Raises ValueError naming it."""
        kind, sep, value = text.partition(":")
        if not sep:
            raise ValueError(f"{text[:40]!r} is not a principal (token:ID, uid:N or name:NAME)")
        return cls(kind, value)

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    def __repr__(self) -> str:
        return f"Principal({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Principal) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


def token_label(name: str, unix_user: str) -> str:
    """How listings name a token and its jobs: its Unix user and its name,
    "alice (token laptop)", "svc (token ci)" ("token NAME" for one that
    names no Unix user: a worker token). A local user of the socket is its
    login name alone; a label with a space is never a Unix user name
    (valid_unix_user), so the two kinds cannot be mistaken for each other."""
    return f"{unix_user} (token {name})" if unix_user else f"token {name}"


JOB_NAME_MAX = 128
"""The longest job name, in characters."""


JOB_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:+=,@%-]{0,127}")
"""A job's name: letters, digits and `. _ : + = , @ % -`, starting with a
letter, digit or '_', at most JOB_NAME_MAX characters (no spaces or glob
characters, so `rc jobs --name 'sweep-*'` means what it says)."""


def valid_job_name(name: str) -> bool:
    """Whether `name` is a job name (JOB_NAME_RE)."""
    return bool(JOB_NAME_RE.fullmatch(name))
