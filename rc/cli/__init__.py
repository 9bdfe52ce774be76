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
import os
import sys

from rc import __version__

__all__ = ["GROUPS", "VERBS", "build_parser", "main"]

GROUPS = (
    "run",
    "batch",
    "queueedit",
    "arrays",
    "jobs",
    "devices",
    "usage",
    "admin",
    "dashboard",
    "mcp",
    "relay",
    "copy",
    "forward",
    "serve",
    "up",
    "slurm",
    "doctor",
)
"""Modules of rc.cli that contribute subcommands, in help order."""

VERBS = {
    "run": "run",
    "hold": "run",
    "release": "run",
    "extend": "run",
    "batch": "batch",
    "update": "queueedit",
    "stash": "queueedit",
    "unstash": "queueedit",
    "rerun": "arrays",
    "jobs": "jobs",
    "show": "jobs",
    "logs": "jobs",
    "kill": "jobs",
    "ps": "jobs",
    "explain": "jobs",
    "devices": "devices",
    "describe": "devices",
    "usage": "usage",
    "share": "usage",
    "token": "admin",
    "whoami": "admin",
    "clear": "admin",
    "retire": "admin",
    "drain": "admin",
    "undrain": "admin",
    "events": "admin",
    "dashboard": "dashboard",
    "mcp": "mcp",
    "shell": "relay",
    "exec": "relay",
    "cp": "copy",
    "forward": "forward",
    "serve": "serve",
    "worker": "serve",
    "up": "up",
    "down": "up",
    "shim": "slurm",
    "slurm": "slurm",
    "doctor": "doctor",
}
"""Each verb and the GROUPS module that defines it, so that `rc devices` imports
only rc.cli.devices and not the relay, copy and run machinery (README
"Performance": `rc devices` in ≤ 150 ms). A test checks this table against the parsers."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit 2), naming the
    command and where its help is."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _VerbParser(_Parser):
    """A verb's parser (and its own subcommands'): arguments it does not know
    are its usage error, so the message points at `rc VERB --help`, not at
    `rc --help` (argparse leaves them to the top parser otherwise)."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and "_ARGCOMPLETE" not in os.environ:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        if not getattr(parsed, "usage_prog", None):  # the innermost: `rc token create`
            parsed.usage_prog = self.prog
        return parsed, extras


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The `rc` parser: with a known `verb`, only that verb's group is built
    (all its verbs parse as usual); otherwise the whole parser, as `rc --help`,
    argcomplete and the docs test need it."""
    p = _Parser(
        prog="rc",
        description="rc shares a lab's GPUs: run jobs and hold devices by label selector.",
        epilog="Controller and token come from RC_CONTROLLER / RC_TOKEN or "
        "~/.config/rc/config.toml (rc up writes it).",
    )
    p.add_argument("--version", action="version", version=f"rc {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND", parser_class=_VerbParser)
    sub.required = True
    for name in (VERBS[verb],) if verb in VERBS else GROUPS:
        importlib.import_module(f"rc.cli.{name}").add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command; returns the exit code."""
    if argv is None:
        argv = sys.argv[1:]
    if "_ARGCOMPLETE" in os.environ:  # completing: argcomplete needs every verb
        parser = build_parser()
        try:
            import argcomplete  # optional

            # options are offered once "-" is typed: `rc kill <Tab>` lists job ids
            argcomplete.autocomplete(parser, always_complete_options=False)
        except ImportError:
            pass
    else:
        parser = build_parser(argv[0] if argv else None)
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode (surrogateescape)
            shown = os.fsencode(arg).decode("ascii", "backslashreplace")
            prog = f"rc {argv[0]}" if argv and argv[0] in VERBS else "rc"
            print(
                f"{prog}: argument '{shown}' is not valid UTF-8 (rc sends text as UTF-8; "
                f"see {prog} --help)",
                file=sys.stderr,
            )
            return 2
    args = parser.parse_args(argv)
    args.argv_ = list(argv)  # the command line as given (rc.cli.batch: its flags win)
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
    from rc.cli.output import one_line
    from rc.proto.errors import ApiError, RcError, TransportError

    try:
        return int(handler(args) or 0)
    except UsageError as e:  # as argparse's own: one line, naming the verb's help
        prog = getattr(args, "usage_prog", None) or f"rc {args.verb}"
        print(one_line(f"{prog}: {e} (see {prog} --help)"), file=sys.stderr)
        return 2
    except ApiError as e:
        where = ""
        if e.status == 401 and hasattr(args, "controller"):  # a client command's own token
            from rc.cli.context import token_source

            where = f" (the token came from {token_source(args)})"
        # the controller's message can carry someone else's text: one line
        print(one_line(f"rc: {e.code}: {e.message}{where}"), file=sys.stderr)
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
