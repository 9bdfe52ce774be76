"""`rc run`, `rc hold`, `rc release`: submit, wait in the queue, follow.

`rc run` submits with a fresh idempotency key (a retried submit can never make
two jobs), prints its queue position while it waits, then streams the log and
exits with the job's own exit code. The log stream resumes from the byte
offset it reached after a broken connection or a controller restart, so
nothing is shown twice or lost. Ctrl-C while queued cancels the job; while it
runs, Ctrl-C only detaches (the job keeps its device) and exits 130. SIGTERM
and SIGHUP (a closed terminal) count as Ctrl-C. When rc's own output is closed
(`rc run -- cmd | head`) it says the job goes on and exits 141.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from rc.cli.context import (
    UsageError,
    client,
    device_arg,
    hangup_interrupts,
    interrupt_cause,
    job_cwd,
    stderr,
    whole_seconds_arg,
)
from rc.cli.output import when
from rc.proto.client import Client
from rc.proto.duration import format_duration
from rc.proto.errors import ApiError, RcError, TransportError
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN
from rc.proto.selector import ANY

__all__ = ["add_parsers", "exit_status", "follow_log", "submit", "submit_run", "wait_started"]

SUBMIT_RETRY_S = 30.0
RECONNECT_MAX_S = 300.0
QUEUE_POLL_WAIT_S = 20.0
CANCEL_TIMEOUT_S = 10.0
EXIT_OUTPUT_CLOSED = 141
"""rc run's exit status when its standard output was closed (128 + SIGPIPE)."""


def priority_arg(text: str) -> int:
    """argparse type: a priority, -10..10."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside {PRIORITY_MIN}..{PRIORITY_MAX}")
    return value


def _target_flags(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument(
        "-d", "--device", type=device_arg, metavar="DEVICE", help="a specific device, host:name"
    )
    g.add_argument(
        "-s",
        "--select",
        "--selector",
        dest="selector",
        metavar="SELECTOR",
        help="any device matching the selector, e.g. 'model=h100,vram>=40G'",
    )


def add_parsers(sub) -> None:
    from rc.cli import add_client_flags

    p = sub.add_parser(
        "run",
        help="run a command on a device and stream its output",
        description="Run CMD on a device matching the target (any device by "
        "default), stream its output, exit with its exit code.",
    )
    _target_flags(p, required=False)
    p.add_argument(
        "--priority", type=priority_arg, default=0, help="-10..10, higher first (default 0)"
    )
    p.add_argument(
        "--max-runtime",
        type=whole_seconds_arg,
        default=0,
        metavar="D",
        help="kill it after D (default: the device's ceiling)",
    )
    p.add_argument(
        "--idle-timeout",
        type=whole_seconds_arg,
        default=0,
        metavar="D",
        help="kill it after D without output",
    )
    p.add_argument(
        "--cwd",
        default=None,
        help="working directory on the device's host (default: the current directory)",
    )
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the job (repeatable)",
    )
    p.add_argument(
        "--no-wait", action="store_true", help="fail at once (exit 1) unless a device is free now"
    )
    p.add_argument(
        "--detach", action="store_true", help="print the job id once submitted and return"
    )
    p.add_argument("--tty", action="store_true", help="an interactive terminal on the device")
    p.add_argument(
        "--as",
        dest="as_user",
        default="",
        metavar="NAME",
        help="submit on someone's behalf (admin tokens only)",
    )
    p.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments"
    )
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_run")

    p = sub.add_parser(
        "hold",
        help="hold a device for yourself (with --ttl and --reason)",
        description="Take a device for a person: it stays yours until the ttl, "
        "rc release, or Ctrl-C.",
    )
    _target_flags(p, required=True)
    p.add_argument(
        "--ttl",
        type=whole_seconds_arg,
        required=True,
        metavar="D",
        help="how long to hold it (e.g. 2h)",
    )
    p.add_argument("--reason", required=True, help="what it is for (shown to everyone)")
    p.add_argument("--priority", type=priority_arg, default=0, help="-10..10 (default 0)")
    p.add_argument(
        "--detach", action="store_true", help="print the hold id once granted and return"
    )
    p.add_argument("--as", dest="as_user", default="", metavar="NAME", help=argparse.SUPPRESS)
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_hold")

    p = sub.add_parser("release", help="end a hold (or kill a job) you own")
    p.add_argument("job", type=int, metavar="ID")
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_release")


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-e {item!r}: use KEY=VALUE")
        env[key] = value
    return env


def _target(args) -> tuple[dict, str]:
    if args.device is not None:
        if not args.device.strip():
            raise UsageError("-d needs a device, host:name (rc devices lists them)")
        return {"device_id": args.device}, args.device
    if args.selector is not None and not args.selector.strip():
        raise UsageError("-s needs a selector, e.g. 'kind=gpu' (or '*' for any device)")
    sel = args.selector or ANY
    return {"selector": sel}, ("any device" if sel == ANY else f"selector {sel!r}")


def submit_run(
    c: Client, args: argparse.Namespace, command: list[str], env: dict[str, str], stdio: str = ""
) -> tuple[dict, str]:
    """Submit what `rc run` was asked for (stdio "" or "tty"); returns the
    JobView and a label for the target. Raises ApiError as the controller
    refused (--no-wait on a busy target: no_device_available, one line)."""
    target, label = _target(args)
    body = {
        **target,
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
    }
    return submit(c, body), label


def submit(c: Client, body: dict) -> dict:
    """POST /v1/jobs, retrying transport failures for up to 30 s (the
    idempotency key makes a retry return the same job)."""
    deadline = time.monotonic() + SUBMIT_RETRY_S
    delay = 0.2
    while True:
        try:
            return c.post("/v1/jobs", body)
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command and not args.tty:
        raise UsageError("give a command after --, e.g. rc run -- python3 train.py")
    if args.tty:
        from rc.cli.relay import cmd_run_tty

        return cmd_run_tty(args, command)
    c = client(args)
    view, label = submit_run(c, args, command, _parse_env(args.env))
    job = view["job"]
    if args.detach:
        print(job["id"], flush=True)
        return 0
    hangup_interrupts()
    job = wait_started(c, job, view.get("queue_position", 0), label)
    if job is None:
        return 130
    stderr(f"job {job['id']} on {job['device_id']}")
    still = (
        f"job {job['id']} is still running on {job['device_id']} "
        f"(rc logs -f {job['id']} to follow it, rc kill {job['id']} to stop it)"
    )
    try:
        follow_log(c, job["id"], sys.stdout.buffer)
    except KeyboardInterrupt:
        stderr(f"detached; {still}")
        return 130
    except BrokenPipeError:
        # `rc run -- cmd | head`: the reader is gone, the job is not ours to kill
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        stderr(f"output closed; {still}")
        return EXIT_OUTPUT_CLOSED
    return exit_status(wait_terminal(c, job["id"]))


def wait_started(c: Client, job: dict, position: int, label: str) -> dict | None:
    """Wait while the job is queued, printing its position when it changes.

    Returns the job once it is assigned or running; None after Ctrl-C (the
    queued job is then cancelled). Raises RcError when it ended without
    starting (cancelled by someone, no-wait).
    """
    shown = None
    failures = 0
    try:
        while job["state"] == "queued":
            if position != shown:
                stderr(f"queued at position {position} for {label} (job {job['id']})")
                shown = position
            try:
                view = c.get(
                    f"/v1/jobs/{job['id']}",
                    params={
                        "wait": f"{QUEUE_POLL_WAIT_S:g}s",
                        "state": "queued",
                        "position": position,
                    },
                    timeout=QUEUE_POLL_WAIT_S + 15,
                )
                failures = 0
            except TransportError:
                failures += 1
                if failures >= 16:
                    raise RcError(
                        f"lost track of job {job['id']} (it may still be queued or "
                        "running; see rc ps)"
                    ) from None
                time.sleep(min(0.5 * failures, 5.0))
                continue
            job, position = view["job"], view.get("queue_position", 0)
    except KeyboardInterrupt as e:
        _cancel_queued(c, job, interrupt_cause(e))
        return None
    if job["state"] in ("assigned", "running"):
        return job
    reason = job.get("kill_reason") or "no reason given"
    raise RcError(f"job {job['id']} ended without starting ({job['state']}: {reason})")


def _cancel_queued(c: Client, job: dict, cause: str) -> None:
    failed = _post_kill(c, job["id"], f"cancelled while queued ({cause})")
    if failed:
        stderr(f"job {job['id']} could not be cancelled: {failed} (see rc ps)")
        return
    try:
        now = c.get(f"/v1/jobs/{job['id']}", timeout=CANCEL_TIMEOUT_S)["job"]
    except RcError:
        stderr(f"cancel requested for job {job['id']}")
        return
    if now["state"] == "killed" and not now.get("started_at"):
        stderr(f"cancelled queued job {job['id']}")
    else:
        stderr(f"job {job['id']} started just as it was being cancelled; kill requested")


def _post_kill(c: Client, job_id: int, reason: str) -> str:
    """Kill (or cancel) a job within CANCEL_TIMEOUT_S; "" when the controller
    took it, else why not, in words."""
    try:
        c.post(f"/v1/jobs/{job_id}/kill", {"reason": reason}, timeout=CANCEL_TIMEOUT_S)
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
            for chunk in c.stream(
                "GET",
                f"/v1/jobs/{job_id}/logs",
                params={"offset": offset, "follow": "1" if follow else "0"},
                timeout=60.0,
            ):
                out.write(chunk)
                out.flush()
                offset += len(chunk)
                failures_since, delay = None, 0.2
            if not follow:
                return offset
            state = c.get(f"/v1/jobs/{job_id}", timeout=10.0)["job"]["state"]
            if state in TERMINAL:
                rest = c.request(
                    "GET", f"/v1/jobs/{job_id}/logs", params={"offset": offset, "follow": "0"}
                ).body
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


TERMINAL = ("succeeded", "failed", "killed", "lost")


def wait_terminal(c: Client, job_id: int, give_up_after: float | None = RECONNECT_MAX_S) -> dict:
    """The job once it has ended, by long poll; transport failures are retried
    (for up to `give_up_after` seconds in a row; None: forever)."""
    state, failing_since, delay = "", None, 0.5
    while True:
        try:
            job = c.get(
                f"/v1/jobs/{job_id}",
                params={"wait": "50s", "state": state, "position": 0},
                timeout=65,
            )["job"]
            failing_since, delay = None, 0.5
            if job["state"] in TERMINAL:
                return job
            state = job["state"]
        except TransportError:
            now = time.monotonic()
            failing_since = failing_since or now
            if give_up_after is not None and now - failing_since > give_up_after:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def exit_status(job: dict) -> int:
    """rc run's exit code for a finished job: its own code; never 0 unless it
    succeeded; a code that is a multiple of 256 (or over 255) becomes 1."""
    code = job.get("exit_code")
    state = job["state"]
    reason = job.get("kill_reason") or ""
    if state == "succeeded":
        return 0
    if code and code % 256 != 0 and 0 < code < 256:
        if reason:
            stderr(f"job {job['id']} {state}: {reason}")
        return code
    stderr(f"job {job['id']} {state}" + (f": {reason}" if reason else ""))
    return 1


def cmd_hold(args: argparse.Namespace) -> int:
    """`rc hold`: queue a hold, print it once granted, block until it ends.

    Granted: stdout gets "hold ID granted on DEVICE until TIME (TTL)" (with
    --detach, the id alone, and the command returns). Ctrl-C (or SIGTERM,
    SIGHUP) while queued cancels the hold; once granted it releases it (exit
    130). A hold that
    ends on its own prints why and exits 0 (1 when its device was lost).
    """
    if not args.reason.strip():
        raise UsageError("--reason cannot be blank: say what the hold is for")
    if args.ttl <= 0:
        raise UsageError("--ttl must be positive")
    c = client(args)
    target, label = _target(args)
    body = {
        **target,
        "kind": "hold",
        "max_runtime_seconds": args.ttl,
        "reason": args.reason,
        "priority": args.priority,
        "idempotency_key": uuid.uuid4().hex,
        "as_user": args.as_user,
    }
    view = submit(c, body)
    hold_id = view["job"]["id"]
    hangup_interrupts()
    try:
        job = wait_started(c, view["job"], view.get("queue_position", 0), label)
        if job is None:
            return 130
        job = _wait_running(c, job)
        while job["state"] == "queued":  # its worker stopped before starting it: back in line
            view = c.get(f"/v1/jobs/{hold_id}")
            job = wait_started(c, view["job"], view.get("queue_position", 0), label)
            if job is None:
                return 130
            job = _wait_running(c, job)
        if job["state"] != "running":
            raise RcError(
                f"hold {hold_id} ended before it was granted ({job['state']}: "
                f"{job.get('kill_reason') or 'no reason given'})"
            )
        if args.detach:
            print(hold_id, flush=True)
            return 0
        started = job.get("started_at") or time.time()
        print(
            f"hold {hold_id} granted on {job['device_id']} until {when(started + args.ttl)} "
            f"({format_duration(args.ttl)})",
            flush=True,
        )
        stderr(f"end it with rc release {hold_id}, or Ctrl-C here")
        job = wait_terminal(c, hold_id, give_up_after=None)
    except KeyboardInterrupt as e:
        _release_on_interrupt(c, hold_id, interrupt_cause(e))
        return 130
    why = job.get("kill_reason") or job["state"]
    stderr(f"hold {hold_id} ended: {why.removeprefix('hold ended: ')}")
    return 1 if job["state"] in ("lost", "failed") else 0


def _wait_running(c: Client, job: dict) -> dict:
    """An assigned job once its worker has started it (a hold is granted when
    its sleeper runs, after the device's acquire hook), or once it ended."""
    failures = 0
    while job["state"] == "assigned":
        try:
            job = c.get(
                f"/v1/jobs/{job['id']}",
                params={"wait": "20s", "state": "assigned", "position": 0},
                timeout=35,
            )["job"]
            failures = 0
        except TransportError:
            failures += 1
            if failures >= 16:
                raise RcError(f"lost track of hold {job['id']} (see rc ps)") from None
            time.sleep(min(0.5 * failures, 5.0))
    return job


def _release_on_interrupt(c: Client, hold_id: int, cause: str) -> None:
    """Ctrl-C (or SIGTERM/SIGHUP) on a granted hold: release it (bounded);
    say so either way."""
    failed = _post_kill(c, hold_id, f"released ({cause})")
    if failed:
        stderr(f"could not release hold {hold_id}: {failed}; run rc release {hold_id}")
    else:
        stderr(f"released hold {hold_id}")


def cmd_release(args: argparse.Namespace) -> int:
    """`rc release ID`: end a hold (or kill a job) you own; prints "released ID"."""
    c = client(args)
    c.post(f"/v1/jobs/{args.job}/kill", {"reason": "released"})
    print(f"released {args.job}")
    return 0
