"""`rc worker`: load the configuration and run the agent."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from rc.proto.client import Client, parse_controller_urls
from rc.proto.errors import RcError
from rc.worker import config as worker_config
from rc.worker import reaper
from rc.worker.agent import Agent
from rc.worker.hostlock import HostLock, HostLockBusy

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The `rc worker` command line."""
    p = argparse.ArgumentParser(
        prog="rc worker",
        description="Run the worker: registers this host's devices with the controller and "
        "runs the jobs it is given (standard library only; runs from rc.pyz).",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help="worker config (TOML; default /etc/rc/worker.toml when it exists)",
    )
    p.add_argument(
        "--controller",
        default=None,
        metavar="URL",
        help="controller URL, or a comma-separated list of them (followed on a failover)",
    )
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the worker token (else $RC_TOKEN)",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="SPEC",
        help="auto (GPUs from nvidia-smi, else 2 CPU devices), cpu:N, or NAME,NAME...",
    )
    p.add_argument("--host", default=None, help="host name to register as (default: hostname)")
    p.add_argument("--cacert", default=None, metavar="PEM", help="CA certificate for https")
    p.add_argument(
        "--allow-root-jobs",
        action="store_true",
        default=None,
        help="run jobs whose Unix user is root (allow_root_jobs; a root worker only)",
    )
    p.add_argument(
        "--shared-account",
        action="store_true",
        default=None,
        help="run every job as this worker's own user, whoever submitted it (shared_account)",
    )
    p.add_argument("--print-config", action="store_true", help="print the effective config, exit")
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def _still_ignored(signum, frame) -> None:
    """A signal the worker was started ignoring (nohup: SIGHUP): still ignored."""


def unignore_inherited_signals() -> list[int]:
    """Replace every signal disposition this process inherited as "ignore"
    (from nohup, a service manager, a shell) by a handler that does nothing.
    The worker goes on ignoring them, but a handler, unlike "ignore", is
    reset to the default by exec, so jobs start with default dispositions as
    a login would (SIGPIPE and SIGXFSZ, which Python itself ignores, are
    restored by subprocess). Returns the signals changed."""
    changed = []
    skip = {signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ}
    for sig in signal.valid_signals():
        if sig in skip:
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, _still_ignored)
                changed.append(sig)
        except (OSError, ValueError):  # real-time signals the libc keeps for itself
            continue
    return changed


def startup_problems(cfg: worker_config.WorkerConfig) -> list[str]:
    """What the worker lacks to start with `cfg` (no controller URL, no or an
    invalid token), one sentence each; [] when it can start."""
    problems = []
    if not cfg.controller_url:
        problems.append("no controller: give --controller URL or controller_url in the config")
    if not cfg.token:
        problems.append("no token: give --token-file, token_file in the config, or RC_TOKEN")
    elif not (cfg.token.isascii() and cfg.token.isprintable() and " " not in cfg.token):
        problems.append(
            "the token is not valid: a token is printable ASCII without spaces, like rc_..."
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    """`rc worker ...` (argv without the word "worker"); returns the exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run a worker for the parsed `rc worker` arguments; returns the exit code.

    A configuration problem or an unparseable controller URL exits 2 with one
    line on stderr. --print-config prints the effective configuration and
    exits 0, or 2 after a line on stderr for each thing the worker would
    still lack to start (startup_problems). An unreachable controller is
    retried forever. A second worker for a host whose worker already runs on
    this machine (same user) exits 1 with one line naming the other's pid
    (rc.worker.hostlock); so does a registration the controller refuses for
    good (rc.worker.registration.PERMANENT_REFUSALS).
    """
    try:
        cfg = worker_config.load(
            args.config,
            {
                "controller_url": args.controller,
                "token_file": args.token_file,
                "devices": args.devices,
                "host": args.host,
                "cacert": args.cacert,
                "allow_root_jobs": args.allow_root_jobs,
                "shared_account": args.shared_account,
            },
        )
        if args.print_config:
            sys.stdout.write(cfg.as_toml())
            sys.stdout.flush()
            missing = startup_problems(cfg)
            for problem in missing:
                print(f"rc worker: cannot start: {problem}", file=sys.stderr)
            return 2 if missing else 0
        problems = startup_problems(cfg)
        if problems:
            raise worker_config.ConfigError(problems[0])
        url = parse_controller_urls(cfg.controller_url)
        client = Client(url, cfg.token, cacert=cfg.cacert or None)  # reads the CA file
    except RcError as e:
        print(f"rc worker: {e}", file=sys.stderr)
        return 2
    try:
        host_lock = HostLock(cfg.host).acquire()  # held until the process ends
    except HostLockBusy as e:
        print(f"rc worker: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(
            f"rc worker: cannot take the lock of host {cfg.host} in "
            f"{os.path.dirname(HostLock(cfg.host).path)}: {e.strerror or e}",
            file=sys.stderr,
        )
        return 1
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if os.getpid() == 1:
        logging.getLogger("rc.worker").info(
            "running as PID 1: this worker reaps the orphaned processes of the container"
        )
    else:
        reaper.become_subreaper()  # orphans of jobs re-parent to this worker
    orphans = reaper.Reaper().start()
    unignore_inherited_signals()
    # `rc up` learns of the first registration on --ready-fd
    agent = Agent(cfg, client, ready_fd=args.ready_fd)
    client.abandon = agent.stop_event  # a stopping worker does not cycle the list on
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: agent.stop())
    try:
        return agent.run()
    finally:
        orphans.stop()
        host_lock.release()
