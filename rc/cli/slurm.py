"""Slurm's commands over rc, opt-in: `rc shim slurm DIR` writes
`sbatch`, `srun`, `squeue`, `scancel`, `sacct` and `sinfo` into DIR, each a
two-line sh script that runs `rc slurm NAME ARGS`. They map the options the
tools that drive Slurm use (submitit, batchspawner, Snakemake's and
Nextflow's executors, people's scripts) onto rc's calls and print what those
tools parse. An option a shim does not map is named and refused (exit 1),
never silently dropped.

Never onto PATH by default (the user puts DIR there) and never over a real
Slurm: a DIR holding a Slurm command that is not one of these shims is
refused.

Mapping (rc → Slurm words): a job's id is its Slurm id; an array element is
ARRAYID_INDEX; the partition is "rc"; a host is a node. States: queued →
PENDING (PD), assigned → CONFIGURING (CF), running → RUNNING (R),
succeeded → COMPLETED (CD), failed → FAILED (F), killed → CANCELLED (CA) or
TIMEOUT (TO) when its max runtime ended it, lost → NODE_FAIL (NF).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from rc.cli.context import UsageError, add_client_flags, client
from rc.cli.slurmview import SlurmError, parser, sacct, scancel, sinfo, squeue
from rc.proto.errors import RcError

__all__ = ["SHIMS", "cmd_shim", "cmd_slurm"]

SHIMS = ("sbatch", "srun", "squeue", "scancel", "sacct", "sinfo")
"""The commands `rc shim slurm` writes."""

_MARK = "# rc shim slurm: rc's stand-in for Slurm's"
"""The second line of every shim: how a shim is told from a real Slurm command."""

# -- srun and sbatch ------------------------------------------------------------------------


def srun(c, argv: list[str]) -> int:
    """srun CMD inside an rc job (RC_JOB_ID set: the job already has its
    devices) runs CMD there, as submitit's batch scripts do; outside a job it
    is `rc run` attached (-n/--gpus, -t/--time, -J, --pty)."""
    p = parser("srun")
    p.add_argument("-n", "--ntasks", "-G", "--gpus", "--gres", dest="gpus")
    p.add_argument("-N", "--nodes")
    p.add_argument("-t", "--time")
    p.add_argument("-J", "--job-name")
    p.add_argument("--pty", action="store_true")
    p.add_argument("-u", "--unbuffered", action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("-e", "--error")
    p.add_argument("--cpu-bind", "--mpi", "--kill-on-bad-exit", "--label", dest="ignored")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SlurmError("srun: fatal: No command given to execute.")
    if os.environ.get("RC_JOB_ID"):
        if args.output or args.error:
            raise SlurmError("srun: error: rc's srun inside a job does not redirect output")
        os.execvp(command[0], command)
    if args.nodes and args.nodes != "1":
        raise SlurmError("srun: error: rc's srun runs on one host (-N 1)")
    run = ["run"]
    if args.gpus:
        run += ["-n", args.gpus.rpartition(":")[2]]
    if args.time:
        run += ["--max-runtime", _slurm_time(args.time, "srun")]
    if args.job_name:
        run += ["--name", args.job_name]
    if args.pty:
        run += ["--tty"]
    from rc.cli import main

    return main([*run, "--", *command])


def _slurm_time(text: str, prog: str) -> str:
    """Slurm's --time (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) as rc's seconds ("90s")."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise SlurmError(f"{prog}: error: Invalid time limit specification: {text}")
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-HH[:MM[:SS]]
        secs = d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # HH:MM:SS
        secs = a * 3600 + b * 60 + c
    elif b is not None:  # MM:SS
        secs = a * 60 + b
    else:  # MM
        secs = a * 60
    return f"{secs}s"


def sbatch(c, argv: list[str]) -> int:
    """sbatch [--parsable] [--wrap CMD | SCRIPT [ARGS]] (the script on stdin
    when neither, as batchspawner sends it): `rc batch`, whose #SBATCH subset
    reads the script's directives; prints "Submitted batch job ID" (submitit
    reads it) or, with --parsable, the id alone (batchspawner)."""
    p = parser("sbatch")
    p.add_argument("--parsable", action="store_true")
    p.add_argument("--wrap")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    from rc.cli import main  # the verbs' table imports this module: main only when run

    with tempfile.TemporaryDirectory(prefix="rc-sbatch-") as tmp:
        script = args.script
        if args.wrap is not None or script is None:
            text = f"#!/bin/sh\n{args.wrap}\n" if args.wrap is not None else sys.stdin.read()
            if not text.strip():
                raise SlurmError("sbatch: error: no script given (a file, --wrap or stdin)")
            script = os.path.join(tmp, "script.sh")
            Path(script).write_text(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["batch", script, *args.args])
    if code != 0:
        return code
    job_id = out.getvalue().strip().splitlines()[-1]
    print(job_id if args.parsable else f"Submitted batch job {job_id}")
    return 0


EMULATIONS: dict[str, Callable] = {
    "squeue": squeue,
    "sacct": sacct,
    "scancel": scancel,
    "sinfo": sinfo,
    "srun": srun,
    "sbatch": sbatch,
}


# -- rc shim slurm DIR, rc slurm NAME ARGS --------------------------------------------------


def _runner() -> list[str]:
    """How a shim starts rc: the zipapp this rc runs from, else this
    interpreter with the rc package."""
    here = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if here is not None and here.suffix == ".pyz" and here.is_file():
        return [sys.executable, str(here)]
    return [sys.executable, "-m", "rc"]


def cmd_shim(args: argparse.Namespace) -> int:
    """`rc shim slurm DIR`: write the shims into DIR (made if missing, 0755
    scripts); refuses a DIR holding a real Slurm command (one that is not a
    shim of rc's). Prints what it wrote and the PATH line to use."""
    if args.system != "slurm":
        raise UsageError(f"rc shim knows only slurm, not {args.system!r}")
    d = Path(args.dir).expanduser().absolute()
    d.mkdir(parents=True, exist_ok=True)
    for name in SHIMS:
        f = d / name
        if f.exists() and _MARK not in f.read_text(errors="replace")[:400]:
            raise RcError(
                f"{f} exists and is not one of rc's shims (a real Slurm?): rc shim never "
                "writes over it; give another directory"
            )
    runner = " ".join(shlex.quote(x) for x in _runner())
    for name in SHIMS:
        f = d / name
        tmp = d / f".{name}.rc-shim"
        tmp.write_text(f'#!/bin/sh\n{_MARK} {name}\nexec {runner} slurm {name} "$@"\n')
        tmp.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
        tmp.replace(f)
    print(f"wrote {', '.join(SHIMS)} into {d}")
    print(f'use them with: export PATH="{d}:$PATH"')
    return 0


class _Connect:
    """The controller client, made at the first call (after the shim's own
    arguments parsed: `squeue --help` needs no controller)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.made = None

    def call(self, *a, **kw):
        if self.made is None:
            self.made = client(self.args)
        return self.made.call(*a, **kw)


def cmd_slurm(args: argparse.Namespace) -> int:
    """`rc slurm NAME ARGS`: what a shim runs. A shim's refusal is printed in
    Slurm's words (`squeue: error: ...`), exit 1."""
    try:
        return EMULATIONS[args.name](_Connect(args), list(args.args))
    except SlurmError as e:
        print(str(e), file=sys.stderr)
        return 1


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "shim",
        help="write Slurm's commands (sbatch, squeue, ...) mapped onto rc into a directory",
        description="Write sbatch, srun, squeue, scancel, sacct and sinfo into DIR: small "
        "scripts that map Slurm's common options onto rc, for tools and scripts that drive "
        "Slurm (submitit, batchspawner). Put DIR on PATH yourself; a DIR with a real Slurm "
        "command in it is refused.",
    )
    p.add_argument("system", choices=["slurm"], help="the scheduler to stand in for")
    p.add_argument("dir", metavar="DIR", help="where to write the commands")
    p.set_defaults(handler="slurm:cmd_shim")
    p = sub.add_parser(
        "slurm",
        help="run one of rc's Slurm commands (what the scripts of rc shim slurm run)",
        description="Run sbatch, srun, squeue, scancel, sacct or sinfo as rc maps them; "
        "ARGS are that command's own (NAME --help lists them).",
        add_help=False,
    )
    p.add_argument("name", choices=sorted(EMULATIONS), help="the Slurm command")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, as Slurm takes them")
    add_client_flags(p)
    p.set_defaults(handler="slurm:cmd_slurm")
