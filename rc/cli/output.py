"""Rendering for humans and machines: tables, JSON, ages, durations, times,
and the words a listing uses for a job's state and what it runs.

Humans get times in the local time zone (`TZ` honoured); `-o json` gets every
timestamp as RFC 3339 UTC text. Table cells show every control character as an
escape, so what other users wrote can never drive the terminal or forge a row.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rc.proto.codec import encode
from rc.proto.copyjob import is_copy_label
from rc.proto.duration import format_duration
from rc.proto.model import device_list

__all__ = [
    "EscapingStream",
    "add_output_flag",
    "age",
    "command_text",
    "duration",
    "end_reason",
    "escape_controls",
    "hold_end",
    "iso_utc",
    "job_state",
    "job_target",
    "job_what",
    "job_who",
    "kill_parts",
    "machine",
    "on_devices",
    "one_line",
    "print_json",
    "print_line",
    "table",
    "visible",
    "when",
]

_KEPT = "\n\t\r"


def escape_controls(text: str) -> str:
    """`text` with every control character but newline, tab and carriage
    return shown as an escape (ESC → \\x1b): what other users wrote (a hold
    reason, a command, a label) can never drive the terminal reading it."""
    if (
        text.isprintable()
        or text.replace("\n", "").replace("\t", "").replace("\r", "").isprintable()
    ):
        return text  # the common case, at C speed (a whole table is one write)
    return "".join(c if c.isprintable() or c in _KEPT else repr(c)[1:-1] for c in text)


def visible(text: str) -> str:
    """`text` with every character that is not printable shown as an escape:
    newline, tab and carriage return as \\n, \\t, \\r; the rest of C0, DEL,
    C1 (ESC as \\x1b, CSI as \\x9b) and other invisible or layout-changing
    characters (bidi overrides, line separators, ...) as \\xNN / \\uNNNN.
    For a table cell: one line, nothing that moves the cursor."""
    if text.isprintable():
        return text  # the common case, at C speed
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(text: str) -> str:
    """`text` with newlines, carriage returns and tabs shown as escapes: for
    a line that carries what someone else wrote (a hold reason, a fault
    detail, an event), so it can never forge a line of its own."""
    if "\n" not in text and "\r" not in text and "\t" not in text:
        return text
    return text.replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


def print_line(text: str) -> None:
    """print(one_line(text))."""
    print(one_line(text))


class EscapingStream:
    """A text stream that passes everything through escape_controls. Bytes
    written to `.buffer` (a job's own output) go through untouched."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.unescaped = stream
        """The stream itself, for rc's own terminal control (a progress line's
        erase-to-end-of-line), never for text someone else wrote."""

    def write(self, text: str) -> int:
        return self._stream.write(escape_controls(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def add_output_flag(p) -> None:
    """The `-o text|json` option every listing takes."""
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="text (default) or json: the records on stdout, times as RFC 3339 UTC",
    )


def print_json(obj: Any) -> None:
    """Records as indented JSON on stdout, timestamps as RFC 3339 UTC (machine)."""
    json.dump(machine(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


TIMESTAMP_KEYS = frozenset({"at", "since", "until"})
"""Keys whose numbers are timestamps (seconds since the epoch) wherever they
are in a record, beside every key ending in `_at`: an explain's held
devices' `until`, a usage report's `since` and `until`."""


def machine(obj: Any) -> Any:
    """`obj` as JSON primitives (records encoded) with every timestamp (a
    number under a key in TIMESTAMP_KEYS or ending in `_at`: seconds since
    the epoch) rewritten as RFC 3339 UTC text to the millisecond, e.g.
    "2026-03-02T16:04:05.123Z". Other numbers (durations, ages) stay numbers."""
    return _timestamps(encode(obj))


def _timestamps(v: Any, key: str = "") -> Any:
    if isinstance(v, dict):
        return {k: _timestamps(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [_timestamps(x) for x in v]
    if (
        (key in TIMESTAMP_KEYS or key.endswith("_at"))
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    ):
        return iso_utc(v)
    return v


def iso_utc(ts: float) -> str:
    """Seconds since the epoch as RFC 3339 UTC to the millisecond."""
    moment = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A left-aligned table on stdout; None and "" render as "-"."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
        for row in (list(headers), *cells)
    ]
    sys.stdout.write("\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    return visible(str(v))


def duration(seconds: float | None) -> str:
    """Seconds as "1h2m3s" (None → "-")."""
    if seconds is None:
        return "-"
    return format_duration(round(max(0.0, seconds)))


def age(seconds: float | None) -> str:
    """An age in its largest whole unit: 45s / 12m / 3h / 5d / 2mo ago.

    A negative age (a timestamp from the future) says so; None says the
    controller did not send one.
    """
    if seconds is None:
        return "age unknown (controller may be out of date)"
    if seconds < 0:
        return f"{_ladder(-seconds)} in the future (clock skew?)"
    return f"{_ladder(seconds)} ago"


def _ladder(s: float) -> str:
    if s < 60:
        return f"{int(s)}s"
    if s < 3600:
        return f"{int(s // 60)}m"
    if s < 86400:
        return f"{int(s // 3600)}h"
    if s < 30 * 86400:
        return f"{int(s // 86400)}d"
    return f"{int(s // (30 * 86400))}mo"


def when(ts: float | None) -> str:
    """A timestamp for a human: local time (the `TZ` environment variable
    honoured) to the second, "2026-03-02 17:04:05" ("-" for None)."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def command_text(argv: Sequence[str], limit: int = 60) -> str:
    """A command line shortened for a table column."""
    import shlex

    text = " ".join(shlex.quote(a) for a in argv).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


STATE_REASON_SHOWN = 40
"""Characters of a job's end reason shown in a table (-o json has it all)."""

_KILLED_BY = re.compile(
    r"killed by (?P<who>[^\s:]+(?: \(token [^\s:()]+\))?)(?P<admin> \(admin\))?(?:: (?P<why>.*))?\Z",
    re.DOTALL,
)
_REWORDED = (
    # the worker's and controller's fixed reasons, as a listing says them
    (re.compile(r"idle: no output for (?P<d>\S+)\Z"), "no output for {d} (idle timeout)"),
    (re.compile(r"max_runtime exceeded \((?P<d>[^)]*)\)\Z"), "ran past its max runtime of {d}"),
    (re.compile(r"signal: (?P<sig>\S+)\Z"), "signal {sig}"),
    (re.compile(r"no-wait: no device was free\Z"), "no device was free (--no-wait)"),
)


def kill_parts(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """A kill's actor and why, from its stored "killed by NAME[ (admin)][:
    WHY]": ("bob", "disk full"), ("bob, an admin", ...); why is
    "cancelled while queued" for a job that never started and was given
    none, else "" for none. None when the reason is no such kill."""
    m = _KILLED_BY.match((job.get("kill_reason") or "").strip())
    if m is None:
        return None
    who = m["who"] + (", an admin" if m["admin"] else "")
    why = (m["why"] or "").strip()
    if not why and not job.get("started_at"):
        why = "cancelled while queued"
    return who, why


def end_reason(job: Mapping[str, Any]) -> str:
    """Why a job ended, in words that follow its state ("" for none).

    A kill stored as "killed by NAME[ (admin)][: WHY]" reads "by NAME: WHY"
    (the actor first, so cutting the free text after it never hides who;
    "by NAME, an admin"; WHY is "cancelled while queued" when it never
    started and none was given); the worker's fixed reasons are reworded
    ("idle: no output for 5m" → "no output for 5m (idle timeout)");
    anything else is shown as it is.
    """
    parts = kill_parts(job)
    if parts is None:
        reason = (job.get("kill_reason") or "").strip()
        for pattern, words in _REWORDED:
            hit = pattern.match(reason)
            if hit:
                return words.format(**hit.groupdict())
        return reason
    who, why = parts
    return f"by {who}: {why}" if why else f"by {who}"


def hold_end(job: Mapping[str, Any]) -> str:
    """How a hold ended (or is ending: its kill is requested), for the end
    messages of `rc hold` and of its sessions: "released by ann", "released
    by ann (Ctrl-C)", "killed by bob: disk full", "its ttl of 2h was
    reached", "lost: lease expired"; its state when nothing says more."""
    parts = kill_parts(job)
    if parts is not None:
        who, why = parts
        if why == "released" or why.startswith("released ("):
            return f"released by {who}{why[len('released') :]}"
        return f"killed by {who}: {why}" if why else f"killed by {who}"
    why = end_reason(job).removeprefix("hold ended: ")
    if job["state"] in ("lost", "failed"):
        return f"{job['state']}: {why}" if why else job["state"]
    return why or job["state"]


def job_state(job: Mapping[str, Any], limit: int | None = STATE_REASON_SHOWN) -> str:
    """A finished job's state with why, as listings show it: "killed by
    root: cancelled while queued", "failed: exited with code 3", "lost:
    ...", "killed by ann"; other states as they are. The free text is cut
    to `limit` characters (None: whole); a kill's actor before it never is."""
    state = job["state"]
    if state not in ("killed", "lost", "failed"):
        return state
    parts = kill_parts(job)
    if parts is not None:
        who, why = parts
        if limit is not None and len(why) > limit:
            why = why[: limit - 1] + "…"
        return f"{state} by {who}: {why}" if why else f"{state} by {who}"
    why = end_reason(job)
    if not why:
        return state
    if limit is not None and len(why) > limit:
        why = why[: limit - 1] + "…"
    return f"{state}: {why}"


def on_devices(job: Mapping[str, Any]) -> str:
    """The devices a job has (or pins), shortened: "box:gpu0..3", "box:cpu2,cpu0"."""
    ids = job.get("device_ids") or ([job["device_id"]] if job.get("device_id") else [])
    return device_list(ids)


def job_who(job: Mapping[str, Any]) -> str:
    """A listing's SUBMITTER column: the submitter's label ("alice", "svc
    (token ci)": it names the Unix user), with the Unix user its job runs
    as where the label does not ("ci (as svc)", from a controller from
    before labels)."""
    who = job.get("submitter", "")
    unix = job.get("unix_user") or ""
    if not unix or unix == who or who.startswith(f"{unix} (token "):
        return who
    return f"{who} (as {unix})"


def job_target(job: Mapping[str, Any]) -> str:
    """A listing's DEVICE column: the job's devices once it has them (or the
    pinned ones), else its selector, with the number of devices it asks for
    when more than one ("4x model=h100")."""
    devices = on_devices(job)
    if devices:
        return devices
    count = job.get("count") or 1
    return f"{count}x {job['selector']}" if count > 1 else job.get("selector", "")


def job_what(job: Mapping[str, Any], limit: int = 60) -> str:
    """What a job runs, for a listing: "hold: REASON" for a hold (its reason
    free text, cut as the rest, so it never widens a table); for a copy
    job the label its controller gave it ("rc cp SRC DST", only ever set by
    the controller: rc.proto.copyjob); else the command line, with the job's
    reason (the submitter's free text) in parentheses beside it, never
    instead of it. Shortened to `limit` characters, the command first."""
    reason = job.get("reason") or ""
    if job.get("kind") == "hold":
        text = f"hold: {reason}"
        return text if len(text) <= limit else text[: limit - 1] + "…"
    if is_copy_label(job):
        return reason if len(reason) <= limit else reason[: limit - 1] + "…"
    text = command_text(job.get("command") or (), limit)
    if reason:
        text = f"{text} ({reason})".replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"
