"""What every client command needs: the controller client, the connection
flags (--controller, --token, --cacert), argparse types and small helpers."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Callable

from rc.cli import config as client_config
from rc.cli.output import one_line
from rc.proto import localsocket
from rc.proto.client import Client
from rc.proto.duration import DurationError, parse_duration
from rc.proto.errors import RcError

__all__ = [
    "Hangup",
    "SelectorTerms",
    "UsageError",
    "add_client_flags",
    "client",
    "count_arg",
    "device_arg",
    "device_list_arg",
    "duration_seconds",
    "hangup_interrupts",
    "interrupt_cause",
    "job_cwd",
    "number_in",
    "raise_pending",
    "stderr",
    "token_source",
    "whole_number",
    "whole_seconds_arg",
]


class UsageError(RcError):
    """The command line is wrong in a way argparse cannot see (exit 2)."""


def valid_token_text(token: str) -> bool:
    """Whether `token` can travel in an Authorization header at all."""
    return token.isascii() and token.isprintable() and " " not in token


def _socket_of(args: argparse.Namespace, cfg: client_config.ClientConfig) -> str | None:
    """The local socket `client(args)` takes its URL (and token) from, or
    None: the controller named (flag, RC_CONTROLLER, config file) when it
    is unix:///PATH, else the default socket when nothing names a
    controller and it exists. Raises RcError for a malformed unix:// one."""
    named = getattr(args, "controller", None) or cfg.controller
    if named and "," in named:
        return None  # a list of URLs (Client rejects a unix:// one in it)
    if named:
        return localsocket.socket_path(named)
    default = localsocket.default_socket()
    return default if os.path.exists(default) else None


def client(args: argparse.Namespace, *, timeout: float = 60.0) -> Client:
    """A Client for the configured controller, honouring --controller/--token.

    A `unix:///PATH` controller (or none configured while the default local
    socket exists) is asked for this Unix user's token and the controller's
    URL (rc.cli.localsocket); a token given by --token, RC_TOKEN or the
    config file is used instead of the socket's."""
    cfg = client_config.load()
    cacert = getattr(args, "cacert", None) or cfg.cacert or None
    path = _socket_of(args, cfg)
    token = _token(args, cfg, path)
    if path is not None:
        from rc.cli.localsocket import LocalClient, session

        got = session(path)
        if not token:
            local = LocalClient(path, got, timeout=timeout, cacert=cacert)
            local.on_waiting = lambda why: stderr(
                f"the controller no longer knows this user's token and its socket does not "
                f"answer yet ({why}): it is restarting; still trying"
            )
            return local
        url = got.url
    else:
        url = (
            getattr(args, "controller", None) or cfg.controller or client_config.DEFAULT_CONTROLLER
        )
    if not token:
        raise RcError(
            f'no token: set RC_TOKEN, or put token = "..." in {cfg.path} (rc up writes one; '
            f"on the controller's own box, RC_CONTROLLER=unix:///PATH names its local socket)"
        )
    if not valid_token_text(token):
        raise RcError(
            "the token (RC_TOKEN or the config file) is not valid: a token is printable "
            "ASCII without spaces, like rc_..."
        )
    c = Client(url, token, timeout=timeout, cacert=cacert)
    if len(c.urls) > 1:  # a list: say why a request waits, once, instead of staying silent
        c.on_waiting = lambda why: stderr(
            f"no controller of the list answers yet ({why}); still trying"
        )
    return c


def _token(args: argparse.Namespace, cfg: client_config.ClientConfig, path: str | None) -> str:
    """The token `client(args)` sends: --token, else RC_TOKEN, else the
    config file's, but not the file's when --controller or RC_CONTROLLER
    names a local socket (`path`): that identity comes from the kernel, and
    the file's token belongs to the file's controller."""
    explicit = getattr(args, "token", None) or os.environ.get("RC_TOKEN", "").strip()
    if explicit:
        return explicit
    named_here = getattr(args, "controller", None) or os.environ.get("RC_CONTROLLER", "").strip()
    if path is not None and named_here:
        return ""
    return cfg.token


def token_source(args: argparse.Namespace) -> str:
    """Where `client(args)` takes its token from: "--token", "RC_TOKEN", the
    config file's path or the local socket, for a refused token's message."""
    if getattr(args, "token", None):
        return "--token"
    if os.environ.get("RC_TOKEN", "").strip():
        return "RC_TOKEN"
    cfg = client_config.load()
    try:
        path = _socket_of(args, cfg)
    except RcError:
        path = None
    if path is not None and not _token(args, cfg, path):
        return f"the local socket {path}"
    return str(client_config.config_path())


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """--controller/--token/--cacert overrides, on every client command."""
    g = p.add_argument_group("connection")
    g.add_argument(
        "--controller",
        metavar="URL",
        help="controller URL, or a comma-separated list of them (an active controller "
        "and its standbys, in order of preference; default: RC_CONTROLLER or the config file)",
    )
    g.add_argument(
        "--token",
        metavar="TOKEN",
        help="the token to use (default: RC_TOKEN or the config file; prefer those: "
        "a command line is visible to every user in ps)",
    )
    g.add_argument("--cacert", metavar="PEM", help="CA certificate to verify an https controller")


_WHOLE = re.compile(r"-?[0-9]+")


def whole_number(text: str) -> int:
    """argparse type: a whole number written in ASCII digits, "-" allowed in
    front ("12", "-3"). Anything else is refused: other scripts' digits
    ("１０"), signs, spaces, underscores, exponents."""
    if not _WHOLE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (digits 0-9)")
    return int(text)


def number_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """argparse type: a whole_number from `lo` to `hi` (no upper bound when
    None); out of range is refused naming the range."""

    def check(text: str) -> int:
        value = whole_number(text)
        if value < lo or (hi is not None and value > hi):
            allowed = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({allowed})")
        return value

    check.__name__ = "number"
    return check


def duration_seconds(text: str) -> float:
    """argparse type: a duration ("90s", "5m", "1h30m") in seconds."""
    try:
        return parse_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def job_name_arg(text: str) -> str:
    """argparse type: a job name (rc.proto.model.JOB_NAME_RE)."""
    from rc.proto.model import JOB_NAME_MAX, valid_job_name

    if len(text) > JOB_NAME_MAX:
        raise argparse.ArgumentTypeError(
            f"a job name is at most {JOB_NAME_MAX} characters; this one has {len(text)}"
        )
    if not valid_job_name(text):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a job name (letters, digits and . _ : + = , @ % -, "
            f"starting with a letter, digit or '_'; at most {JOB_NAME_MAX} characters)"
        )
    return text


def whole_seconds_arg(text: str) -> int:
    """argparse type: a duration of whole seconds (the wire's unit; "1500ms" is refused)."""
    seconds = duration_seconds(text)
    if seconds != int(seconds):
        raise argparse.ArgumentTypeError(f"{text!r}: use whole seconds (the smallest unit is 1s)")
    return int(seconds)


def device_arg(text: str) -> str:
    """argparse type: a device id, host:name (rc devices lists them)."""
    from rc.proto.model import valid_device_id

    if not valid_device_id(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device id (host:name, e.g. gpu-box:gpu0; see rc devices)"
        )
    return text


def device_list_arg(text: str) -> tuple[str, ...]:
    """argparse type: one device id, or a comma list of one host's devices
    in the order the job should see them ("box:gpu2,box:gpu0"; a name
    without a host takes the one before it: "box:gpu2,gpu0")."""
    out: list[str] = []
    host = ""
    for part in text.split(","):
        part = part.strip()
        if part and ":" not in part and host:
            part = f"{host}:{part}"
        out.append(device_arg(part))
        host = part.rpartition(":")[0]
    return tuple(out)


def count_arg(text: str) -> int:
    """argparse type: how many devices, 1..COUNT_MAX (ASCII digits)."""
    from rc.proto.model import COUNT_MAX

    value = whole_number(text)
    if not 1 <= value <= COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside 1..{COUNT_MAX}")
    return value


class SelectorTerms(argparse.Action):
    """argparse action for `-s SELECTOR`: repeated, the selectors are ANDed
    (`-s model=h100 -s 'vram>=80G'` is `model=h100,vram>=80G`), so a second
    `-s` never replaces the first. A blank one makes the whole value blank,
    which the command refuses ("-s needs a selector") rather than dropping it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from rc.proto.selector import conjoin

        have = getattr(namespace, self.dest, None)
        if have is None:
            value = values
        elif not have.strip() or not values.strip():
            value = ""
        else:
            value = conjoin([have, values])
        setattr(namespace, self.dest, value)


def stderr(*parts: object) -> None:
    """A diagnostic line on stderr, prefixed "rc: ". One line always: a
    newline, carriage return or tab in it (someone else's reason, a fault
    detail) is shown as an escape (output.one_line), so it cannot forge a
    line of its own; sys.stderr escapes the other control characters."""
    print(one_line(" ".join(["rc:", *map(str, parts)])), file=sys.stderr, flush=True)


def job_cwd(value: str | None) -> str:
    """The working directory a job asks for: `value` made absolute against the
    directory rc runs in (a relative --cwd means the same place here as on
    the device's host), or that directory itself when none was given.
    Raises UsageError when that is needed and rc runs in a directory that
    was removed (the job would otherwise start somewhere else)."""
    try:
        return os.path.abspath(value) if value is not None else os.getcwd()
    except FileNotFoundError:
        given = f" (so --cwd {value!r} names nothing)" if value is not None else ""
        raise UsageError(
            f"the current directory no longer exists{given}; cd somewhere and run again, "
            "or give --cwd /absolute/path"
        ) from None


class Hangup(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as Ctrl-C would be; `why` names the signal."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


_pending: list[str] = []
"""Interruptions raised by hangup_interrupts' handlers and not yet taken by
interrupt_cause: "Ctrl-C", "SIGTERM", "SIGHUP"."""


def interrupt_cause(e: KeyboardInterrupt) -> str:
    """What interrupted: "Ctrl-C", or the signal's name for a Hangup. Taking
    the cause marks the interruption handled (raise_pending stays quiet)."""
    _pending.clear()
    return e.why if isinstance(e, Hangup) else "Ctrl-C"


def raise_pending() -> None:
    """Raise again an interruption whose exception was lost: Python ignores
    an exception raised inside a finalizer, and a signal's handler runs
    wherever the interpreter is, such as in the close() of an HTTP response
    being garbage-collected (a SIGHUP right after rc run printed its queue
    position was lost that way, and rc run waited on). The wait loops call
    this after every long poll. Raises Hangup or KeyboardInterrupt."""
    if _pending:
        why = _pending[-1]
        raise KeyboardInterrupt() if why == "Ctrl-C" else Hangup(why)


def hangup_interrupts() -> None:
    """Make SIGTERM and SIGHUP (a closed terminal, a killed shell) act as
    Ctrl-C (raising Hangup), so a command that cleans up on Ctrl-C (cancel a
    queued job, release a hold) does the same when its terminal goes away.
    Each interruption is also noted until interrupt_cause takes it, so
    raise_pending can raise it again if its exception was lost."""

    def interrupt(signum, frame):
        why = signal.Signals(signum).name
        _pending.append(why)
        raise Hangup(why)

    def ctrl_c(signum, frame):
        _pending.append("Ctrl-C")
        raise KeyboardInterrupt()

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when ignored (nohup, &)
        signal.signal(signal.SIGINT, ctrl_c)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
