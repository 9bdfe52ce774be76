"""`rc run --array` and `rc rerun`: an array's spec and file, its live
progress, and submitting copies of jobs (README "Arrays", "Names, details
and listings")."""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from rc.cli.complete import attach, recent_jobs
from rc.cli.context import UsageError, add_client_flags, client, number_in, stderr
from rc.cli.follow import Outage, submit
from rc.proto import calls
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError

__all__ = ["add_parsers", "array_items", "array_spec_arg", "follow_array", "rerun_body"]


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "rerun",
        help="submit a copy of a job (new id, same spec and name)",
        description="Submit a copy of job JOB: the same command, cwd, environment, "
        "target (selector, or pinned devices), count, priority, limits and name, "
        "with a new id and idempotency key; the copy is yours. Prints its id and "
        "returns (rc logs -f ID follows it). A terminal or pipe job cannot be rerun.",
    )
    attach(p.add_argument("job", type=number_in(1), metavar="JOB", help="the job id"), recent_jobs)
    p.add_argument(
        "--failed",
        action="store_true",
        help="JOB is an array: rerun its elements that did not succeed, as a new array "
        "(same indices, items and cap)",
    )
    add_client_flags(p)
    p.set_defaults(handler="arrays:cmd_rerun")


def array_spec_arg(text: str) -> str:
    """argparse type: an array SPEC[%K] (rc.proto.arrayspec), kept as text."""
    from rc.proto.arrayspec import ArraySpecError, parse

    try:
        parse(text)
    except ArraySpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def array_items(path: str) -> list[str]:
    """The non-empty lines of an array file (without their line ends).
    Raises UsageError when it cannot be read, has none, or has too many."""
    from rc.proto.arrayspec import ARRAY_MAX

    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\r\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--array-file {path}: {e}") from None
    items = [line for line in lines if line.strip()]
    if not items:
        raise UsageError(f"--array-file {path} has no non-empty line")
    if len(items) > ARRAY_MAX:
        raise UsageError(
            f"--array-file {path} has {len(items)} lines; an array has at most {ARRAY_MAX}"
        )
    return items


ARRAY_POLL_S = 1.0
"""How often `rc run --array` reads its array's progress."""


def follow_array(c: Client, array_id: int) -> int:
    """`rc run --array` without --detach: a live one-line progress on stderr
    until every element ended; 0 when every one succeeded, else 1. Ctrl-C
    stops watching (130); the elements go on. A controller that cannot be
    reached (or answers 5xx) is waited for as `rc run` waits for it
    (follow.Outage: up to RECONNECT_MAX_S in a row), so a restart does not
    end the watch."""
    shown = ""
    tty = sys.stderr.isatty()
    out = getattr(sys.stderr, "unescaped", sys.stderr)  # rc's own erase-line, not escaped
    outage = Outage()
    try:
        while True:
            try:
                a = c.call(calls.ARRAY_GET, array_id)
                outage.over()
            except (TransportError, ApiError) as e:
                if isinstance(e, ApiError) and e.status < 500:
                    raise
                if not outage.wait():
                    if tty and shown:
                        out.write("\n")
                    raise RcError(
                        f"lost track of array {array_id} ({e}); its elements go on "
                        f"(rc jobs --array {array_id})"
                    ) from None
                continue
            n = a["counts"]
            done = sum(n.get(s, 0) for s in ("succeeded", "failed", "killed", "lost"))
            bad = done - n.get("succeeded", 0)
            line = (
                f"array {array_id}: {done}/{a['size']} done, {n.get('running', 0) + n.get('assigned', 0)} "
                f"running, {n.get('queued', 0)} queued, {bad} failed"
            )
            if line != shown:
                if tty:
                    out.write("\r" + line + "\x1b[K")
                    out.flush()
                else:
                    stderr(line)
                shown = line
            if a["done"]:
                if tty:
                    out.write("\n")
                if bad:
                    failed = ",".join(str(i) for i in a["failed_indices"][:20])
                    more = ", ..." if len(a["failed_indices"]) > 20 else ""
                    stderr(
                        f"array {array_id}: {bad} did not succeed (indices {failed}{more}); "
                        f"rc rerun --failed {array_id} runs them again"
                    )
                return 1 if bad else 0
            time.sleep(ARRAY_POLL_S)
    except KeyboardInterrupt:
        if tty:
            out.write("\n")
        stderr(f"stopped watching; array {array_id} goes on (rc kill --array {array_id} ends it)")
        return 130


def rerun_body(j: dict) -> dict:
    """The submission that copies job `j` (as GET /v1/jobs/{id} gives it):
    its spec and name, a fresh idempotency key. Raises RcError for what
    cannot be copied: a terminal or pipe job, an environment hidden from
    the caller."""
    from rc.proto.errors import RcError

    if j.get("stdio"):
        raise RcError(f"job {j['id']} ran with a terminal or a pipe; it cannot be rerun")
    env = j.get("env") or {}
    if any(v == "(hidden)" for v in env.values()):
        raise RcError(
            f"job {j['id']} belongs to {j['submitter']}, and its environment is hidden "
            "from you; only its owner or an admin can rerun it"
        )
    if j.get("selector"):
        where: dict = {"selector": j["selector"], "count": j.get("count") or 1}
    else:
        pins = j.get("device_ids") or [j["device_id"]]
        where = {"device_ids": pins, "count": len(pins)}
    body = {
        **where,
        "kind": j.get("kind", "job"),
        "priority": j.get("priority", 0),
        "max_runtime_seconds": j.get("max_runtime_seconds", 0),
        "reason": j.get("reason", ""),
        "name": j.get("name", ""),
        "idempotency_key": uuid.uuid4().hex,
    }
    if body["kind"] == "job":
        body.update(
            command=j.get("command") or [],
            cwd=j.get("cwd", ""),
            env=env,
            idle_timeout_seconds=j.get("idle_timeout_seconds", 0),
        )
        if j.get("requeue_on_hardware") is False:  # its opt-out is copied too
            body["requeue_on_hardware"] = False
    return body


def cmd_rerun(args: argparse.Namespace) -> int:
    """`rc rerun JOB`: submit a copy; prints the new id (stderr says of what)."""
    c = client(args)
    if args.failed:
        return _rerun_failed(c, args.job)
    old = c.call(calls.JOB_GET, args.job)["job"]
    view = submit(c, rerun_body(old))
    new = view["job"]["id"]
    stderr(f"job {new} is a copy of job {args.job}")
    print(new, flush=True)
    return 0


def _rerun_failed(c: Client, array_id: int) -> int:
    """`rc rerun --failed ARRAY`: its failed, killed and lost elements again,
    as a new array (their indices, items and the cap); prints its id."""
    from rc.proto.arrayspec import ArraySpec
    from rc.proto.arrayspec import format as spec_text

    summary = c.call(calls.ARRAY_GET, array_id)
    params = {"array": array_id, "state": "failed,killed,lost", "limit": 1000}
    elements: list[dict] = []
    while True:
        page = c.call(calls.JOBS, params=params)
        elements += page["jobs"]
        if not page.get("next_before"):
            break
        params["before"] = page["next_before"]
    if not elements:
        raise RcError(f"array {array_id} has no element that failed, was killed or lost")
    elements.sort(key=lambda j: j["array_index"])
    # a listing cuts commands and reasons (README "Limits"): the spec copied
    # is the first element's whole, as GET /v1/jobs/ID gives it
    body = rerun_body(c.call(calls.JOB_GET, elements[0]["id"])["job"])
    indices = tuple(j["array_index"] for j in elements)
    body["array"] = spec_text(ArraySpec(indices, summary.get("max_running") or 0))
    if any(j.get("array_item") for j in elements):
        body["array_items"] = [j["array_item"] for j in elements]
    view = submit(c, body)
    new = view["job"]["id"]
    stderr(
        f"array {new} reruns the {len(indices)} elements of array {array_id} that did not succeed"
    )
    print(new, flush=True)
    return 0
