"""The `rc` command line (standard library only; argcomplete when installed).

Each command group lives in its own module with an `add_parsers(sub)`
function; a parser names its handler as "module:function" so that only the
command being run is imported (`rc devices` starts fast).

Exit codes: 0 success; 1 failure (the controller refused, the job failed to
start...); 2 usage; 130 interrupted; `rc run` exits with the job's own code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rc import __version__

__all__ = ["main", "build_parser", "GROUPS"]

GROUPS = ("run", "jobs", "devices", "admin", "relay", "copy", "local")
"""Modules of rc.cli that contribute subcommands, in help order."""


def build_parser() -> argparse.ArgumentParser:
    """The whole `rc` parser (used by main, argcomplete and the docs test)."""
    p = argparse.ArgumentParser(
        prog="rc",
        description="rc shares a lab's GPUs: run jobs and hold devices by label selector.",
        epilog="Controller and token come from RC_CONTROLLER / RC_TOKEN or "
        "~/.config/rc/config.toml (rc up writes it).",
    )
    p.add_argument("--version", action="version", version=f"rc {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND")
    sub.required = True
    for name in GROUPS:
        importlib.import_module(f"rc.cli.{name}").add_parsers(sub)
    return p


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """--controller/--token/--cacert overrides, on every client command."""
    g = p.add_argument_group("connection")
    g.add_argument("--controller", metavar="URL", help="controller URL (default: RC_CONTROLLER "
                   "or the config file)")
    g.add_argument("--token", metavar="TOKEN", help=argparse.SUPPRESS)
    g.add_argument("--cacert", metavar="PEM", help="CA certificate to verify an https controller")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; returns the exit code."""
    parser = build_parser()
    try:
        import argcomplete  # optional

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    from rc.cli.output import EscapingStream

    sys.stdout, sys.stderr = EscapingStream(sys.stdout), EscapingStream(sys.stderr)
    try:
        return _dispatch(args)
    finally:
        sys.stdout, sys.stderr = sys.stdout._stream, sys.stderr._stream


def _dispatch(args: argparse.Namespace) -> int:
    module, _, func = args.handler.partition(":")
    handler = getattr(importlib.import_module(f"rc.cli.{module}"), func)
    from rc.cli.context import UsageError
    from rc.proto.errors import ApiError, RcError, TransportError

    try:
        return int(handler(args) or 0)
    except UsageError as e:
        print(f"rc {args.verb}: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        print(f"rc: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except TransportError as e:
        print(f"rc: cannot reach the controller: {e}", file=sys.stderr)
        return 1
    except RcError as e:
        print(f"rc: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. `rc jobs | head`): not an error worth a traceback
        sys.stderr.close()
        return 0
