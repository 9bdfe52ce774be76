"""The library half of `rc run`: submit a job, wait in the queue, follow its
log, turn its end into an exit status, and read the environment a job or
session asks for. `rc run`, `rc hold`, `rc run --tty`, `rc shell`, `rc
exec`, `rc cp` and `rc logs` are built on it.

A submit carries a fresh idempotency key, so a retried submit can never make
two jobs. Following a log resumes from the byte offset it reached after a
broken connection or a controller restart, so nothing is shown twice or lost.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable

from rc.cli.context import UsageError, interrupt_cause, job_cwd, raise_pending, stderr
from rc.cli.output import job_state, one_line
from rc.proto import calls, exports
from rc.proto.client import Client
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.model import device_list, valid_env_name
from rc.proto.selector import ANY
from rc.proto.wire import KillRequest

__all__ = [
    "CANCEL_TIMEOUT_S",
    "RECONNECT_MAX_S",
    "TERMINAL",
    "Outage",
    "add_env_flags",
    "add_export_flag",
    "exit_status",
    "export_arg",
    "export_fields",
    "follow_log",
    "job_env",
    "once",
    "post_kill",
    "read_env_file",
    "submit",
    "submit_run",
    "target",
    "wait_running",
    "wait_started",
    "wait_terminal",
]

SUBMIT_RETRY_S = 30.0
"""How long a submit is retried over transport failures."""
RECONNECT_MAX_S = 300.0
"""How long following a log (or waiting for a job's end) retries transport
failures in a row before giving up."""
QUEUE_POLL_WAIT_S = 20.0
"""The long poll on a queued job, in seconds."""
CANCEL_TIMEOUT_S = 10.0
"""Bound on a kill or cancel request, and on waiting for the kill to take."""
TERMINAL = ("succeeded", "failed", "killed", "lost")
"""The states a job ends in."""


class Outage:
    """The transport failures in a row of a follower riding out a controller
    restart: `wait()` after each one sleeps a backoff (0.2 s doubling to
    `most` s) and returns True, or returns False at once when they have
    lasted more than `give_up_after` s (None: never give up); `over()`
    after a success starts afresh."""

    def __init__(self, give_up_after: float | None = RECONNECT_MAX_S, most: float = 5.0) -> None:
        self.give_up_after = give_up_after
        self.most = most
        self.since: float | None = None
        self.delay = 0.2

    def over(self) -> None:
        """The controller answered."""
        self.since, self.delay = None, 0.2

    def wait(self) -> bool:
        """After a failure: False when it is time to give up, else sleep the
        backoff and True."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if self.give_up_after is not None and now - self.since > self.give_up_after:
            return False
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.most)
        return True


def add_env_flags(p: argparse.ArgumentParser, whose: str) -> None:
    """-e NAME[=VALUE] and --env-file FILE (both repeatable), read by job_env()."""
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help=f"an environment variable for {whose}; NAME alone passes its value here (repeatable)",
    )
    p.add_argument(
        "--env-file",
        dest="env_files",
        action="append",
        default=[],
        metavar="FILE",
        help="NAME=VALUE lines (# comments and blank lines allowed); -e wins (repeatable)",
    )


def add_export_flag(p: argparse.ArgumentParser) -> None:
    """--export ALL|NONE|[ALL,]NAME[=VALUE],... (rc.proto.exports), read by
    export_fields()."""
    p.add_argument(
        "--export",
        type=export_arg,
        default=None,
        metavar="ALL|NONE|NAMES",
        help="what the job takes of this shell's environment: ALL (the controller's "
        "default unless rc serve --export-default says otherwise; secrets and rc's own "
        "variables stay out), NONE (a clean start), NAME,... (only those), ALL,NAME=V,...; "
        "-e goes on top",
    )


def export_arg(text: str) -> str:
    """argparse type of --export: the text, once rc.proto.exports parses it."""
    try:
        exports.parse_export(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def export_fields(args: argparse.Namespace, environ=None) -> dict:
    """The submit's "export" and "caller_env": with no --export,
    what ALL takes of `environ` (this process's environment by default) and
    no export (the controller's default decides), or nothing at all under
    --as (the job is someone else's); with --export, that and what it takes.
    Says on stderr which set variables ALL leaves out as secrets."""
    environ = os.environ if environ is None else environ
    text = getattr(args, "export", None)
    if text is None and getattr(args, "as_user", ""):
        return {}
    export = exports.parse_export(text or "ALL")
    if export.all:
        secret = sorted(k for k in environ if exports.looks_secret(k) and not exports.reserved(k))
        secret = [k for k in secret if k not in export.names]
        if secret:
            stderr(
                f"not sent to the job (they look like secrets): {', '.join(secret)}; "
                "-e NAME sends one"
            )
    fields: dict = {"caller_env": exports.taken(export, environ)}
    if text is not None:
        fields["export"] = text
    return fields


_NAME_RULE = "letters, digits and '_', not starting with a digit"


def job_env(items: list[str], files: list[str] = ()) -> dict[str, str]:
    """The environment a job or session asks for: each --env-file in order,
    then each -e in order, a later value of a name replacing an earlier one.
    `-e NAME=VALUE` gives a value; `-e NAME` passes this process's value of
    NAME. Names are checked as the controller checks them (valid_env_name).
    Raises UsageError naming the bad item (a file's name and line number)."""
    env: dict[str, str] = {}
    for path in files:
        env.update(read_env_file(path))
    for item in items:
        key, sep, value = item.partition("=")
        if not valid_env_name(key):
            raise UsageError(f"-e {item!r}: {key!r} is not a variable name ({_NAME_RULE})")
        if not sep:
            if key not in os.environ:
                raise UsageError(f"-e {item!r}: {key} is not set here (give it: -e {key}=VALUE)")
            value = os.environ[key]
        if "\0" in value:
            raise UsageError(f"-e {item!r}: the value contains a NUL character")
        env[key] = value
    return env


def read_env_file(path: str) -> dict[str, str]:
    """The NAME=VALUE lines of an --env-file, in order (a later line of a name
    wins). The value is everything after the first '=', taken as it is
    (quotes included, like `docker run --env-file`; a final CR is dropped);
    lines that are blank or start with '#' are skipped. Raises UsageError
    naming the file, and the line for a bad one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"--env-file {path}: cannot read it: {e.strerror or e}") from None
    env: dict[str, str] = {}
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode().removesuffix("\r")
        except UnicodeDecodeError:
            raise UsageError(f"{path}:{n}: not UTF-8 text") from None
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.lstrip().partition("=")
        if not sep:
            raise UsageError(f"{path}:{n}: {line[:60]!r} is not NAME=VALUE")
        if not valid_env_name(key):
            raise UsageError(f"{path}:{n}: {key[:60]!r} is not a variable name ({_NAME_RULE})")
        if "\0" in value:
            raise UsageError(f"{path}:{n}: the value of {key} contains a NUL character")
        env[key] = value
    return env


def target(args: argparse.Namespace) -> tuple[dict, str]:
    """The target of `rc run`/`rc hold` from its -d/-s/-n flags: the
    submit's {"device_id": ...}, {"device_ids": [...]} (a list of one host's
    devices) or {"selector": ...} (any device, `*`, with neither), with its
    "count" (-n, default 1); and a label for messages ("any device",
    "selector 'kind=gpu'", "3 devices matching any device", the devices).
    Raises UsageError for a blank -d or -s, and for -n with a -d list of
    another length."""
    count = getattr(args, "count", None) or 1
    if args.device is not None:
        pins = tuple(args.device) if not isinstance(args.device, str) else (args.device,)
        if not all(d.strip() for d in pins):
            raise UsageError("-d needs a device, host:name (rc devices lists them)")
        if getattr(args, "count", None) is not None and count != len(pins):
            raise UsageError(
                f"-n {count} asks for {count} device{'s' if count != 1 else ''} "
                f"but -d names {len(pins)}; give one of them, or as many devices as -n says"
            )
        if len(pins) == 1:
            return {"device_id": pins[0]}, pins[0]
        return {"device_ids": list(pins), "count": len(pins)}, device_list(pins)
    if args.selector is not None and not args.selector.strip():
        raise UsageError("-s needs a selector, e.g. 'kind=gpu' (or '*' for any device)")
    sel = args.selector or ANY
    label = "any device" if sel == ANY else f"selector {sel!r}"
    if count == 1:
        return {"selector": sel}, label
    if sel == ANY:
        return {"selector": sel, "count": count}, f"{count} devices of one host"
    return {"selector": sel, "count": count}, f"{count} devices of one host matching {sel!r}"


def submit_run(
    c: Client, args: argparse.Namespace, command: list[str], env: dict[str, str], stdio: str = ""
) -> tuple[dict, str]:
    """Submit what `rc run` was asked for (stdio "" or "tty"), with what its
    --export takes of this shell's environment (export_fields); returns the
    JobView and a label for the target. Raises ApiError as the controller
    refused (--no-wait on a busy target: no_device_available, one line)."""
    where, label = target(args)
    body = {
        **where,
        "command": command,
        "stdio": stdio,
        "cwd": job_cwd(args.cwd),
        "env": env,
        "idempotency_key": uuid.uuid4().hex,
        "priority": args.priority,
        "max_runtime_seconds": args.max_runtime,
        "idle_timeout_seconds": args.idle_timeout,
        "no_wait": args.no_wait,
        "as_user": args.as_user,
        "name": getattr(args, "name", None) or "",
        "array": getattr(args, "array", None) or "",
        "array_items": getattr(args, "array_items", None) or [],
        "after": getattr(args, "after", None) or [],
        **export_fields(args),
    }
    if getattr(args, "begin", 0.0):  # sent only when given: a request without it digests as before
        body["begin_at"] = args.begin
    if not getattr(args, "requeue_on_hardware", True):  # sent only when off: the default
        body["requeue_on_hardware"] = False
    return submit(c, body), label + once(body["after"])


_ONCE = {"ok": "has succeeded", "notok": "has ended unsuccessfully", "any": "has ended"}


def once(after: list[str]) -> str:
    """What a queued dependent waits for, to follow its target in the queued
    line: " once job 4 has succeeded and job 7 has ended" ("" with none).
    `after` holds --after's "JOB:COND" strings."""
    parts = []
    for text in after:
        job_id, _, cond = text.partition(":")
        parts.append(f"job {job_id} {_ONCE.get(cond, 'has ended')}")
    return f" once {' and '.join(parts)}" if parts else ""


def submit(c: Client, body: dict) -> dict:
    """POST /v1/jobs, retrying transport failures for up to SUBMIT_RETRY_S
    (the idempotency key makes a retry return the same job). The first
    failure is said at once on stderr, with how long rc goes on trying;
    the last one is raised (TransportError)."""
    deadline = time.monotonic() + SUBMIT_RETRY_S
    delay = 0.2
    said = False
    while True:
        try:
            return c.call(calls.JOB_SUBMIT, body=body)
        except TransportError as e:
            if time.monotonic() > deadline:
                raise
            if not said:
                stderr(
                    f"cannot reach the controller ({e}); retrying for up to {SUBMIT_RETRY_S:g} s"
                )
                said = True
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def wait_started(c: Client, job: dict, position: int, label: str) -> dict | None:
    """Wait while the job is queued, printing its position when it changes.

    Returns the job once it is assigned or running, or once it ended after
    it started (its start came and went unseen: the client lost sight of it
    during an outage, say); None after Ctrl-C (the queued job is then
    cancelled). Raises RcError when it ended without starting (cancelled by
    someone, no-wait).
    """
    shown = None
    outage = Outage()
    try:
        while job["state"] == "queued":
            if position != shown:
                stderr(f"queued at position {position} for {label} (job {job['id']})")
                shown = position
            try:
                view = c.call(
                    calls.JOB_GET,
                    job["id"],
                    params={
                        "wait": f"{QUEUE_POLL_WAIT_S:g}s",
                        "state": "queued",
                        "position": position,
                    },
                    timeout=QUEUE_POLL_WAIT_S + 15,
                )
                raise_pending()
                outage.over()
            except TransportError:
                if not outage.wait():
                    raise RcError(
                        f"lost track of job {job['id']} (it may still be queued or "
                        "running; see rc ps)"
                    ) from None
                continue
            job, position = view["job"], view.get("queue_position", 0)
    except KeyboardInterrupt as e:
        _cancel_queued(c, job, interrupt_cause(e))
        return None
    if job["state"] in ("assigned", "running") or job.get("started_at") is not None:
        return job
    raise RcError(one_line(f"job {job['id']} ended without starting ({job_state(job, None)})"))


def wait_running(
    c: Client,
    job: dict,
    position: int,
    label: str,
    what: str = "job",
    on_assigned: Callable[[dict], None] | None = None,
) -> dict | None:
    """Wait until the job (`what`: "job" or "hold", for messages) runs: in the
    queue (wait_started), then while it is assigned until its worker starts
    it. A job its worker hands back unstarted (the worker stopped first:
    assigned → queued) is said ("job 42 went back to the queue: ...") and
    waited for again, so the device it finally runs on is the one named.
    `on_assigned(job)` is called each time the job leaves the queue for a
    worker (assigned or running), before waiting for it to run: `rc run
    --tty` attaches there, so its window size reaches the worker before the
    command starts.

    Returns the job once it runs or has ended; None after Ctrl-C (or SIGTERM,
    SIGHUP) before it started, which cancels it. Raises RcError as
    wait_started does.
    """
    while True:
        job = wait_started(c, job, position, label)
        if job is None:
            return None
        was_on = device_list(job.get("device_ids") or [job["device_id"]])
        try:
            if on_assigned is not None and job["state"] in ("assigned", "running"):
                on_assigned(job)
            job = _wait_assigned(c, job, what)
        except KeyboardInterrupt as e:
            _cancel_queued(c, job, interrupt_cause(e))
            return None
        if job["state"] != "queued":
            return job
        stderr(
            f"{what} {job['id']} went back to the queue: the worker of {was_on} "
            "stopped before starting it"
        )
        view = c.call(calls.JOB_GET, job["id"])
        job, position = view["job"], view.get("queue_position", 0)


def _wait_assigned(c: Client, job: dict, what: str) -> dict:
    """The job once it is no longer `assigned` (its worker started it, it
    ended, or it went back to the queue), by long poll."""
    outage = Outage()
    while job["state"] == "assigned":
        try:
            job = c.call(
                calls.JOB_GET,
                job["id"],
                params={"wait": f"{QUEUE_POLL_WAIT_S:g}s", "state": "assigned", "position": 0},
                timeout=QUEUE_POLL_WAIT_S + 15,
            )["job"]
            raise_pending()
            outage.over()
        except TransportError:
            if not outage.wait():
                raise RcError(f"lost track of {what} {job['id']} (see rc ps)") from None
    return job


def _cancel_queued(c: Client, job: dict, cause: str) -> None:
    failed = post_kill(c, job["id"], f"cancelled while queued ({cause})")
    if failed:
        stderr(f"job {job['id']} could not be cancelled: {failed} (see rc ps)")
        return
    try:
        now = c.call(calls.JOB_GET, job["id"], timeout=CANCEL_TIMEOUT_S)["job"]
    except RcError:
        stderr(f"cancel requested for job {job['id']}")
        return
    if now["state"] == "killed" and not now.get("started_at"):
        stderr(f"cancelled queued job {job['id']}")
    elif now["state"] == "assigned":
        stderr(f"cancel requested for job {job['id']}, which its worker was about to start")
    else:
        stderr(f"job {job['id']} started just as it was being cancelled; kill requested")


def post_kill(c: Client, job_id: int, reason: str) -> str:
    """Kill (or cancel) a job within CANCEL_TIMEOUT_S; "" when the controller
    took it, else why not, in words."""
    try:
        c.call(calls.JOB_KILL, job_id, body=KillRequest(reason), timeout=CANCEL_TIMEOUT_S)
        return ""
    except ApiError as e:
        return "it had already ended" if e.code == "not_cancellable" else f"{e.code}: {e.message}"
    except TransportError as e:
        return str(e)


def follow_log(c: Client, job_id: int, out, offset: int = 0, follow: bool = True) -> int:
    """Copy the job's stored output to `out` until it has ended and every byte
    was shown; reconnects from the byte offset reached. Returns the offset."""
    failures_since = None
    delay = 0.2
    while True:
        try:
            for chunk in c.call_stream(
                calls.JOB_LOGS,
                job_id,
                params={"offset": offset, "follow": "1" if follow else "0"},
                timeout=60.0,
            ):
                raise_pending()
                out.write(chunk)
                out.flush()
                offset += len(chunk)
                failures_since, delay = None, 0.2
            if not follow:
                return offset
            state = c.call(calls.JOB_GET, job_id, timeout=10.0)["job"]["state"]
            if state in TERMINAL:
                rest = c.call(calls.JOB_LOGS, job_id, params={"offset": offset, "follow": "0"})
                if rest:
                    out.write(rest)
                    out.flush()
                    offset += len(rest)
                return offset
        except TransportError:
            now = time.monotonic()
            failures_since = failures_since or now
            if now - failures_since > RECONNECT_MAX_S:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        except ApiError as e:
            if e.status >= 500:
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            raise


def wait_terminal(c: Client, job_id: int, give_up_after: float | None = RECONNECT_MAX_S) -> dict:
    """The job once it has ended, by long poll; transport failures are retried
    (for up to `give_up_after` seconds in a row; None: forever)."""
    state, position, failing_since, delay = "", 0, None, 0.5
    while True:
        try:
            view = c.call(
                calls.JOB_GET,
                job_id,
                params={"wait": "50s", "state": state, "position": position},
                timeout=65,
            )
            raise_pending()
            failing_since, delay = None, 0.5
            job = view["job"]
            if job["state"] in TERMINAL:
                return job
            # the position too: a job put back in the queue (a requeue) waits at
            # its place, and a poll naming another position is answered at once
            state, position = job["state"], view.get("queue_position", 0)
        except TransportError:
            now = time.monotonic()
            failing_since = failing_since or now
            if give_up_after is not None and now - failing_since > give_up_after:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def exit_status(job: dict) -> int:
    """rc run's exit code for a finished job: its own code; never 0 unless it
    succeeded; a code that is a multiple of 256 (or over 255) becomes 1.
    Says on stderr how it ended, in the listings' words ("job 82 killed:
    disk full (by bob, an admin)"; output.job_state), unless it simply
    exited with a code and no reason."""
    code = job.get("exit_code")
    if job["state"] == "succeeded":
        return 0
    if code and code % 256 != 0 and 0 < code < 256:
        if job.get("kill_reason"):
            stderr(f"job {job['id']} {job_state(job, None)}")
        return code
    stderr(f"job {job['id']} {job_state(job, None)}")
    return 1
