"""The flags of `rc run`, shared by `rc batch` (rc.cli.batch), and those
`rc hold` shares: the target (-d/-s/-n), --priority, --name, --after.
"""

from __future__ import annotations

import argparse

from rc.cli.arrays import array_spec_arg
from rc.cli.complete import attach, devices, label_keys
from rc.cli.context import (
    SelectorTerms,
    count_arg,
    device_list_arg,
    job_name_arg,
    whole_number,
    whole_seconds_arg,
)
from rc.cli.follow import add_env_flags, add_export_flag
from rc.cli.queueedit import begin_arg
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN

__all__ = [
    "add_after_flag",
    "add_name_flag",
    "add_run_flags",
    "add_target_flags",
    "after_arg",
    "priority_arg",
]


def priority_arg(text: str) -> int:
    """argparse type: a priority, -10..10 (ASCII digits)."""
    value = whole_number(text)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside {PRIORITY_MIN}..{PRIORITY_MAX}")
    return value


def add_target_flags(p: argparse.ArgumentParser) -> None:
    """-d DEVICE[,DEVICE...] or -s SELECTOR (repeatable); with neither, any
    device (`*`); -n N devices of one host."""
    g = p.add_mutually_exclusive_group()
    attach(
        g.add_argument(
            "-d",
            "--device",
            type=device_list_arg,
            metavar="DEVICE",
            help="a specific device, host:name, or a comma list of one host's devices "
            "(host:gpu0,gpu1), in the order the job sees them",
        ),
        devices,
    )
    p.add_argument(
        "-n",
        "--count",
        type=count_arg,
        default=None,
        metavar="N",
        help="N devices (1..64, default 1), all on one host, each matching the "
        "selector, granted together",
    )
    attach(
        g.add_argument(
            "-s",
            "--select",
            "--selector",
            dest="selector",
            action=SelectorTerms,
            metavar="SELECTOR",
            help="any device matching the selector, e.g. 'model=h100,vram>=40G' "
            "(repeated: every one must match)",
        ),
        label_keys,
    )


def after_arg(text: str) -> str:
    """argparse type: JOB[:ok|:notok|:any] (rc.proto.model.parse_after)."""
    from rc.proto.model import parse_after

    try:
        job_id, cond = parse_after(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return f"{job_id}:{cond.value}"


def add_after_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--after",
        type=after_arg,
        action="append",
        default=[],
        metavar="JOB[:ok|:notok|:any]",
        help="wait until JOB (an array: all its elements) ends: ok (default) when it "
        "succeeded, notok when it did not, any either way; repeatable, at most 64",
    )


def add_name_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--name",
        type=job_name_arg,
        default=None,
        metavar="NAME",
        help=f"a name for the {what}, shown in every listing (RC_JOB_NAME in a job)",
    )


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of `rc run` but its command and the client flags: the
    target, priority, runtime and idle timeout, cwd, environment and
    --export, name, dependencies, arrays, and how rc follows the job."""
    add_target_flags(p)
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
        "--begin",
        type=begin_arg,
        default=0.0,
        metavar="TIME|+D",
        help="not before TIME (HH:MM, YYYY-MM-DD[THH:MM], local) or +D from now (+2h); "
        "it waits in its place until then",
    )
    add_env_flags(p, "the job")
    add_export_flag(p)
    add_name_flag(p, "job")
    add_after_flag(p)
    p.add_argument(
        "--array",
        type=array_spec_arg,
        default=None,
        metavar="SPEC[%K]",
        help="an array: one job per index (0-99, 0-99:2, 1,5,9; at most 10,000), "
        "at most K running at once with %%K; RC_ARRAY_ID and RC_ARRAY_INDEX in each",
    )
    p.add_argument(
        "--array-file",
        default=None,
        metavar="FILE",
        help="an array of one job per non-empty line of FILE, the line as RC_ARRAY_ITEM "
        "(--array %%K caps it)",
    )
    p.add_argument(
        "--no-wait", action="store_true", help="fail at once (exit 1) unless a device is free now"
    )
    p.add_argument(
        "--detach", action="store_true", help="print the job id once submitted and return"
    )
    p.add_argument(
        "--kill-on-detach",
        action="store_true",
        default=None,
        help="kill the job whenever rc stops following it: Ctrl-C, SIGHUP, closed "
        "output (default: RC_KILL_ON_DETACH=1, else only a second Ctrl-C or SIGTERM kills)",
    )
    p.add_argument("--tty", action="store_true", help="an interactive terminal on the device")
    p.add_argument(
        "--requeue-on-hardware",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when a GPU fault (an Xid or ECC event on its GPUs) ends the job, put it back "
        "in the queue away from the faulty device, RC_RESTART_COUNT one higher, at most 3 "
        "times (default: on)",
    )
    p.add_argument(
        "--as",
        dest="as_user",
        default="",
        metavar="USER|token:NAME",
        help="submit on someone's behalf (admins only): USER, a Unix user of the controller's "
        "host (the job is theirs and runs as them), or token:NAME, the API token NAME's",
    )
