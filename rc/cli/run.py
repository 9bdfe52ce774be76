"""`rc run`, `rc hold`, `rc release`: submit, wait in the queue, follow.

`rc run` submits with a fresh idempotency key (a retried submit can never make
two jobs), prints its queue position while it waits, then streams the log and
exits with the job's own exit code. The log stream resumes from the byte
offset it reached after a broken connection or a controller restart, so
nothing is shown twice or lost.

Interruptions (exit 130), as srun users expect them:
- while queued (or assigned, not yet started), Ctrl-C, SIGTERM and SIGHUP
  cancel the job;
- while it runs, a first Ctrl-C detaches (the job keeps its device) and a
  second within DOUBLE_INTERRUPT_S kills it; SIGTERM kills it (so `timeout
  60 rc run ...` bounds the job); SIGHUP (a closed terminal, a dropped ssh)
  detaches;
- when rc's own output is closed (`rc run -- cmd | head`) it says the job
  goes on and exits 141.
With --kill-on-detach (or RC_KILL_ON_DETACH=1) every way of leaving a running
job (Ctrl-C, SIGHUP, SIGTERM, closed output) kills it.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
import threading
import time
import uuid

from rc.cli.arrays import array_items, follow_array
from rc.cli.batch import add_lenient_flag, with_script
from rc.cli.complete import attach, holds
from rc.cli.context import (
    UsageError,
    add_client_flags,
    client,
    hangup_interrupts,
    interrupt_cause,
    number_in,
    stderr,
    whole_seconds_arg,
)
from rc.cli.follow import (
    CANCEL_TIMEOUT_S,
    TERMINAL,
    exit_status,
    follow_log,
    job_env,
    once,
    post_kill,
    submit,
    submit_run,
    target,
    wait_running,
    wait_terminal,
)
from rc.cli.output import escape_controls, hold_end, on_devices, print_line, when
from rc.cli.relay import cmd_run_tty
from rc.cli.runflags import (
    add_after_flag,
    add_name_flag,
    add_run_flags,
    add_target_flags,
    priority_arg,
)
from rc.proto import calls
from rc.proto.client import Client
from rc.proto.duration import format_duration
from rc.proto.errors import RcError
from rc.proto.wire import ExtendRequest, KillRequest

__all__ = ["add_parsers", "kill_on_detach_default", "stdin_is_data"]

DOUBLE_INTERRUPT_S = 2.0
"""After a first Ctrl-C on a running `rc run`, how long a second one kills the job."""
EXIT_OUTPUT_CLOSED = 141
"""rc run's exit status when its standard output was closed (128 + SIGPIPE)."""


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run a command on a device and stream its output",
        description="Run CMD on a device matching the target (any device by "
        "default), stream its output, exit with its exit code.",
    )
    add_run_flags(p)
    p.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command and its arguments"
    )
    p.add_argument(
        "--script",
        default=None,
        metavar="SCRIPT",
        help="run SCRIPT (its #RC and #SBATCH directives, then the flags here; the "
        'arguments after -- are its own; README "Batch scripts")',
    )
    add_lenient_flag(p)
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_run")

    p = sub.add_parser(
        "hold",
        help="hold a device for yourself (with --ttl and --reason)",
        description="Take a device matching the target (any device by default) for "
        "a person: it stays yours until the ttl, rc release, or Ctrl-C.",
    )
    add_target_flags(p)
    p.add_argument(
        "--ttl",
        type=whole_seconds_arg,
        required=True,
        metavar="D",
        help="how long to hold it (e.g. 2h)",
    )
    p.add_argument("--reason", required=True, help="what it is for (shown to everyone)")
    p.add_argument(
        "--idle-timeout",
        type=whole_seconds_arg,
        default=None,
        metavar="D",
        help="release it after D without use (input, GPU or CPU use, a forward); "
        "0: never (default: rc serve --hold-idle-timeout)",
    )
    p.add_argument("--priority", type=priority_arg, default=0, help="-10..10 (default 0)")
    add_name_flag(p, "hold")
    add_after_flag(p)
    p.add_argument(
        "--detach", action="store_true", help="print the hold id once granted and return"
    )
    p.add_argument("--as", dest="as_user", default="", metavar="NAME", help=argparse.SUPPRESS)
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_hold")

    p = sub.add_parser(
        "release",
        help="end a hold you own",
        description="End hold ID now: the device goes back to the pool once its "
        "worker has checked it. A job is refused (rc kill ends it).",
    )
    attach(
        p.add_argument("job", type=number_in(1), metavar="ID", help="the hold id"),
        holds,
    )
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_release")

    p = sub.add_parser(
        "extend",
        help="give a hold of yours more time",
        description="Add D to hold HOLD's ttl, up to the runtime ceiling of its "
        "devices (above it is refused, naming the ceiling). Its worker applies "
        "the new ttl by its next heartbeat.",
    )
    attach(
        p.add_argument("job", type=number_in(1), metavar="HOLD", help="the hold id"),
        holds,
    )
    p.add_argument("add", type=_more_time, metavar="D", help="how much more (e.g. 1h)")
    # "-5m" is a D (refused: a hold only grows), not an unknown option: argparse
    # takes an argument that matches this for a positional when no option does
    p._negative_number_matcher = re.compile(r"^-\d")
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_extend")


def stdin_is_data() -> bool:
    """Whether stdin is a pipe, a file or a socket: data someone meant to send
    (a terminal or /dev/null is not)."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if getattr(args, "script", None):
        if args.tty:
            raise UsageError("--script and --tty do not go together (a script has no terminal)")
        command = with_script(args, args.script, command)
    if not command and not args.tty:
        raise UsageError("give a command after --, e.g. rc run -- python3 train.py")
    if args.tty and (args.array or args.array_file is not None):
        raise UsageError("--array and --tty do not go together (an element has no terminal)")
    if args.tty:
        return cmd_run_tty(args, command)
    if args.detach and args.kill_on_detach:
        raise UsageError("--detach and --kill-on-detach do not go together (rc would not stay)")
    kill_on_detach = args.kill_on_detach or kill_on_detach_default()
    env = job_env(args.env, args.env_files)
    if args.array_file is not None:
        if args.array and not args.array.startswith("%"):
            raise UsageError("with --array-file, --array takes only %K (the cap)")
        args.array_items = array_items(args.array_file)
    elif args.array and args.array.startswith("%"):
        raise UsageError(
            f"--array {args.array!r} names no indices: give SPEC%K (0-99%8), or %K with "
            "--array-file"
        )
    if args.array or args.array_file is not None:
        if args.no_wait:
            raise UsageError("--array and --no-wait do not go together")
        c = client(args)
        view, _label = submit_run(c, args, command, env)
        array_id = view["job"]["id"]
        print(array_id, flush=True)
        return 0 if args.detach else follow_array(c, array_id)
    c = client(args)
    view, label = submit_run(c, args, command, env)
    job = view["job"]
    if stdin_is_data():
        stderr(
            f"job {job['id']}'s stdin is empty (/dev/null): rc run does not pass its "
            "stdin on; to pipe data in, use rc exec HOLD -- CMD inside a hold"
        )
    if args.detach:
        print(job["id"], flush=True)
        return 0
    hangup_interrupts()
    job = wait_running(c, job, view.get("queue_position", 0), label)
    if job is None:
        return 130
    stderr(f"job {job['id']} on {on_devices(job)}")
    try:
        follow_log(c, job["id"], sys.stdout.buffer)
    except KeyboardInterrupt as e:
        return _interrupted(c, job, interrupt_cause(e), kill_on_detach)
    except BrokenPipeError:
        # `rc run -- cmd | head`: the reader is gone; the job goes on unless asked
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if kill_on_detach:
            _kill_running(c, job, "output closed", "rc run's output closed")
        else:
            stderr(f"output closed; {_still_running(job)}")
        return EXIT_OUTPUT_CLOSED
    return exit_status(wait_terminal(c, job["id"]))


def cmd_batch(args: argparse.Namespace) -> int:
    """`rc batch SCRIPT [ARGS]` (rc.cli.batch): rc run --detach --script
    SCRIPT -- ARGS; prints the job's (or array's) id."""
    if args.tty:
        raise UsageError("a batch script has no terminal: rc run --tty -- CMD gives one")
    if args.kill_on_detach:
        raise UsageError("rc batch returns once the job is queued: --kill-on-detach has no use")
    args.command = with_script(args, args.script, args.script_args)
    args.script = None
    args.detach = True
    return cmd_run(args)


def kill_on_detach_default() -> bool:
    """RC_KILL_ON_DETACH: 1/true/yes/on, or 0/false/no/off/unset. Raises
    UsageError for any other value."""
    text = os.environ.get("RC_KILL_ON_DETACH", "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise UsageError(f"RC_KILL_ON_DETACH={text!r}: use 1 (kill the job on detach) or 0")


def _still_running(job: dict) -> str:
    return (
        f"job {job['id']} is still running on {on_devices(job)} "
        f"(rc logs -f {job['id']} to follow it, rc kill {job['id']} to stop it)"
    )


def _interrupted(c: Client, job: dict, cause: str, kill_on_detach: bool) -> int:
    """rc run interrupted while its job runs (exit 130). SIGTERM kills the job
    (srun forwards it; `timeout 60 rc run ...` bounds the job), and so does
    any interruption with kill_on_detach. Otherwise SIGHUP detaches, and a
    first Ctrl-C detaches after giving DOUBLE_INTERRUPT_S for a second one,
    which kills the job (srun's convention)."""
    if cause == "SIGTERM" or kill_on_detach:
        _kill_running(c, job, cause)
        return 130
    if cause == "Ctrl-C":
        deadline = time.monotonic() + DOUBLE_INTERRUPT_S
        try:  # armed before the line is written: a second Ctrl-C that comes
            # as it is (the reader acts on it at once) kills too, never exits quietly
            stderr(
                f"detached from job {job['id']}; press Ctrl-C again within "
                f"{DOUBLE_INTERRUPT_S:g} s to kill job {job['id']}"
            )
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(left)
        except KeyboardInterrupt as e:
            again = interrupt_cause(e)
            if again != "SIGHUP":
                _kill_running(c, job, "Ctrl-C twice" if again == "Ctrl-C" else again)
                return 130
    stderr(f"detached; {_still_running(job)}")
    return 130


def _kill_running(c: Client, job: dict, why: str, reason: str = "") -> None:
    """Kill a running job on rc run's behalf (`why`: "SIGTERM", "Ctrl-C
    twice"...; the kill reason is `reason`, else "rc run got WHY") and wait
    at most CANCEL_TIMEOUT_S for it to end, saying what came of it."""
    job_id = job["id"]
    failed = post_kill(c, job_id, reason or f"rc run got {why}")
    if failed == "it had already ended":
        stderr(f"{why}: job {job_id} had already ended")
        return
    if failed:
        stderr(f"{why}: job {job_id} could not be killed: {failed}; run rc kill {job_id}")
        return
    deadline = time.monotonic() + CANCEL_TIMEOUT_S
    state = job["state"]
    while (left := deadline - time.monotonic()) > 0:
        try:
            state = c.call(
                calls.JOB_GET,
                job_id,
                params={"wait": f"{max(1, int(left))}s", "state": state, "position": 0},
                timeout=left + 5,
            )["job"]["state"]
        except RcError:
            break
        if state in TERMINAL:
            stderr(f"{why}: killed job {job_id}")
            return
    stderr(f"{why}: kill requested for job {job_id}; it is still ending (see rc ps)")


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
    where, label = target(args)
    body = {
        **where,
        "kind": "hold",
        "max_runtime_seconds": args.ttl,
        "reason": args.reason,
        "priority": args.priority,
        "idempotency_key": uuid.uuid4().hex,
        "as_user": args.as_user,
        "name": args.name or "",
        "after": args.after,
    }
    if args.idle_timeout is not None:
        body["hold_idle_timeout_seconds"] = args.idle_timeout
    view = submit(c, body)
    label += once(args.after)
    hold_id = view["job"]["id"]
    hangup_interrupts()
    try:
        job = wait_running(c, view["job"], view.get("queue_position", 0), label, "hold")
        if job is None:
            return 130
        if job["state"] != "running":
            # granted and ended unseen (an outage), or never granted
            when_ = "ended" if job.get("started_at") is not None else "ended before it was granted"
            raise RcError(
                f"hold {hold_id} {when_} ({job['state']}: "
                f"{job.get('kill_reason') or 'no reason given'})"
            )
        if args.detach:
            print(hold_id, flush=True)
            return 0
        started = job.get("started_at") or time.time()
        print(
            f"hold {hold_id} granted on {on_devices(job)} until {when(started + args.ttl)} "
            f"({format_duration(args.ttl)})",
            flush=True,
        )
        stderr(f"end it with rc release {hold_id}, or Ctrl-C here")
        threading.Thread(
            target=_say_idle_warnings, args=(c, hold_id), name="rc-idle-warnings", daemon=True
        ).start()
        job = wait_terminal(c, hold_id, give_up_after=None)
    except KeyboardInterrupt as e:
        _release_on_interrupt(c, hold_id, interrupt_cause(e))
        return 130
    stderr(f"hold {hold_id} ended: {hold_end(job)}")
    return 1 if job["state"] in ("lost", "failed") else 0


def _say_idle_warnings(c: Client, hold_id: int) -> None:
    """Say each idle warning of hold `hold_id` on stderr as the feed gets it
    (a long poll of GET /v1/events), as its terminal sessions are told
    (README "Holds: the idle rule"). Runs until the process ends; a failed
    poll is retried every 2 s from the last event seen."""
    after = None
    while True:
        try:
            if after is None:
                newest = c.call(calls.EVENTS, params={"limit": 1})["events"]
                after = newest[-1]["id"] if newest else 0
            got = c.call(
                calls.EVENTS, params={"after": after, "wait": "50s", "limit": 1000}, timeout=70
            )["events"]
        except RcError:
            time.sleep(2)
            continue
        for e in got:
            after = max(after, e["id"])
            if e.get("kind") == "hold_idle_warning" and e.get("job_id") == hold_id:
                stderr(escape_controls(e.get("text") or f"hold {hold_id} is idle"))


def _release_on_interrupt(c: Client, hold_id: int, cause: str) -> None:
    """Ctrl-C (or SIGTERM/SIGHUP) on a granted hold: release it (bounded);
    say so either way."""
    failed = post_kill(c, hold_id, f"released ({cause})")
    if failed:
        stderr(f"could not release hold {hold_id}: {failed}; run rc release {hold_id}")
    else:
        stderr(f"released hold {hold_id}")


def cmd_release(args: argparse.Namespace) -> int:
    """`rc release ID`: end a hold you own (or any, as admin); prints
    "released ID". A job is refused: rc kill ends it."""
    c = client(args)
    held = c.call(calls.JOB_GET, args.job)["job"]
    if held.get("kind") != "hold":
        raise RcError(f"job {args.job} is not a hold; rc kill {args.job} ends it")
    c.call(calls.JOB_KILL, args.job, body=KillRequest("released"))
    print_line(f"released {args.job}")
    return 0


_GROWS_ONLY = "must be positive (e.g. 1h): a hold only grows; rc release ends it now"


def _more_time(text: str) -> int:
    """argparse type of `rc extend`'s D: whole seconds, more than none."""
    if text.startswith("-"):
        raise argparse.ArgumentTypeError(_GROWS_ONLY)
    return whole_seconds_arg(text)


def cmd_extend(args: argparse.Namespace) -> int:
    """`rc extend HOLD D`: prints "hold 12 now ends at TIME (ttl 3h)"."""
    if args.add <= 0:
        raise UsageError(f"D {_GROWS_ONLY}")
    c = client(args)
    got = c.call(calls.JOB_EXTEND, args.job, body=ExtendRequest(args.add))
    held = c.call(calls.JOB_GET, args.job)["job"]
    ttl = got["ttl_seconds"]
    start = held.get("started_at")
    end = f"now ends at {when(start + ttl)}" if start else "will last"
    print_line(f"hold {args.job} {end} (ttl {format_duration(ttl)})")
    return 0
