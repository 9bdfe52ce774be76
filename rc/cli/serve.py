"""`rc serve` (the controller) and the `rc worker` entry in `rc --help`.

`rc serve` is one of the two entry points allowed to load rc.controller
(docs/design.md#layering); it does so by name at run time, so the zipapp (which carries
no controller) still parses every command. `rc worker` itself is routed to
rc.worker by rc/__main__.py before this parser runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os

from rc.cli.context import UsageError, duration_seconds, whole_seconds_arg
from rc.proto import localsocket
from rc.proto.errors import RcError
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN

__all__ = [
    "SCHEDULING_OPTIONS",
    "add_parsers",
    "add_scheduling_options",
    "default_socket",
    "scheduling_value",
]


def _in_range(parse, lo: float, hi: float, allowed: str, zero_ok: bool = False):
    """argparse type: `parse(text)` (a duration or an integer) within lo..hi
    (and 0 when `zero_ok`); out of range is a one-line usage error naming the
    allowed range (exit 2), at argument parsing."""

    def check(text: str):
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e}; allowed {allowed}") from None
        if not (lo <= value <= hi or (zero_ok and value == 0)):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: allowed {allowed}")
        return value

    check.__name__ = getattr(parse, "__name__", "value")
    return check


def _integer(text: str) -> int:
    """A whole number in ASCII digits; '_' may group them ("1_000")."""
    digits = text.strip().replace("_", "")
    if not (digits.isascii() and digits.lstrip("-").isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (digits 0-9)")
    return int(digits, 10)


_DAY = 86400.0
_D = duration_seconds
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_bytes(text: str) -> int:
    """A size: a whole number of bytes, or of KiB, MiB, GiB or TiB with the
    suffix K, M, G or T (an optional "iB" or "B" after it: "10G", "512MiB")."""
    t = text.strip().upper().replace("_", "")
    for tail in ("IB", "B"):
        if t.endswith(tail) and t[: -len(tail)][-1:] in "KMGT" and len(t) > len(tail):
            t = t[: -len(tail)]
            break
    unit = t[-1:] if t[-1:] in "KMGT" else ""
    digits = t[: len(t) - len(unit)]
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size (a whole number of bytes, or with K, M, G or T: 10G)"
        )
    return int(digits, 10) * _UNITS[unit]


SCHEDULING_OPTIONS = (
    "aging",
    "max_devices_per_user",
    "max_user_priority",
    "fair_share",
    "hold_idle_timeout",
    "hold_idle_timeout_max",
    "hold_idle_timeout_min",
    "hold_ttl_max",
    "retain",
    "log_quota",
)
"""The scheduling options `rc serve` takes and `rc up` passes on (argparse dests)."""


def _as_given(check):
    """argparse type: `check(text)` must accept it; the text itself is kept
    (rc up hands it to rc serve as given)."""

    def keep(text: str) -> str:
        check(text)
        return text

    keep.__name__ = check.__name__
    return keep


_SCHEDULING_SPECS = (
    (
        "--aging",
        _in_range(_D, 1, 30 * _DAY, "0 (off) or 1s to 30d", True),
        600.0,
        "D",
        "a queued job gains one priority step per D waited (0: off; default 10m)",
    ),
    (
        "--max-devices-per-user",
        _in_range(_integer, 1, 1_000_000, "0 (no cap) or 1 to 1000000", True),
        0,
        "N",
        "most devices one user may hold at once (0: no cap)",
    ),
    (
        "--max-user-priority",
        _in_range(_integer, PRIORITY_MIN, PRIORITY_MAX, f"{PRIORITY_MIN} to {PRIORITY_MAX}"),
        0,
        "P",
        (
            f"highest --priority a user may ask for (admins: up to {PRIORITY_MAX}; a "
            "negative one is always allowed; default 0)"
        ),
    ),
    (
        "--fair-share",
        _in_range(_D, 60, 365 * _DAY, "0 (off) or 1m to 365d", True),
        0.0,
        "HALF_LIFE",
        (
            "order the queue by fair share too: each user's device-time decays with this "
            'half-life, e.g. 7d (0: off, the default; README "Sharing fairly")'
        ),
    ),
    (
        "--hold-idle-timeout",
        _in_range(whole_seconds_arg, 1, 365 * _DAY, "0 (off) or 1s to 365d", True),
        7200,
        "D",
        (
            "a hold unused for D is released, unless rc hold --idle-timeout says "
            'otherwise (0: off; default 2h; README "Holds: the idle rule")'
        ),
    ),
    (
        "--hold-idle-timeout-max",
        _in_range(whole_seconds_arg, 1, 365 * _DAY, "0 (none) or 1s to 365d", True),
        0,
        "D",
        (
            "the longest idle timeout a user may give rc hold; when set, users may "
            "not turn the rule off (admins may; default 0: no maximum)"
        ),
    ),
    (
        "--hold-idle-timeout-min",
        _in_range(whole_seconds_arg, 1, 365 * _DAY, "0 (none) or 1s to 365d", True),
        0,
        "D",
        (
            "the shortest idle timeout a user may give rc hold; when set, users may "
            'not turn the rule off either (admins may; default 0: none; README "Shared-box defaults")'
        ),
    ),
    (
        "--hold-ttl-max",
        _in_range(whole_seconds_arg, 1, 365 * _DAY, "0 (none) or 1s to 365d", True),
        0,
        "D",
        (
            "the longest ttl a user's hold may have, at rc hold and after rc extend "
            "(admins may go past it; default 0: the devices' ceiling alone)"
        ),
    ),
    (
        "--retain",
        _in_range(_D, 1, 3660 * _DAY, "0 (keep everything) or 1s to 3660d", True),
        90 * _DAY,
        "D",
        (
            "delete finished jobs, their logs and events, and events, older than D; "
            'the ledger keeps their usage as daily rollups (0: keep everything; default 90d; README "History that ends")'
        ),
    ),
    (
        "--log-quota",
        _in_range(size_bytes, 1 << 20, 1 << 50, "0 (no quota) or 1M to 1024T", True),
        0,
        "SIZE",
        (
            "most bytes of job logs per user (10G, 512M); past it the logs of their "
            "finished jobs are deleted, oldest first (0: no quota, the default)"
        ),
    ),
)
"""(flag, check, rc serve's default, metavar, help) of each of SCHEDULING_OPTIONS."""


def scheduling_value(dest: str, text: str):
    """The value of scheduling option `dest` (one of SCHEDULING_OPTIONS) given
    as `text` ("5m" and "300s" are one value). Raises
    argparse.ArgumentTypeError when `text` is not a valid value for it."""
    for flag, check, *_ in _SCHEDULING_SPECS:
        if flag == "--" + dest.replace("_", "-"):
            return check(text)
    raise KeyError(dest)


def add_scheduling_options(p, passed_on: bool = False) -> None:
    """Add the scheduling options (SCHEDULING_OPTIONS) to parser `p`: with
    their defaults and parsed values for rc serve; for rc up (`passed_on`),
    default None and the checked text, handed to its rc serve as given."""
    for flag, check, default, metavar, text in _SCHEDULING_SPECS:
        if passed_on:
            p.add_argument(flag, type=_as_given(check), default=None, metavar=metavar, help=text)
        else:
            p.add_argument(flag, type=check, default=default, metavar=metavar, help=text)


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="run the controller",
        description="Run the controller: API, scheduler, sweeper, dashboard.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to listen on (port 0 picks a free one; default %(default)s)",
    )
    p.add_argument(
        "--data",
        default="/var/lib/rc",
        metavar="DIR",
        help="data directory: rc.db, logs/, admin.token (default %(default)s)",
    )
    p.add_argument(
        "--database",
        default=os.environ.get("RC_DATABASE", ""),
        metavar="URL",
        help="keep the state in this PostgreSQL database (postgresql://USER@HOST/DB; needs "
        "pip install 'rc[postgres]'; logs stay files, see --log-dir; default: $RC_DATABASE, "
        "else the embedded SQLite file DATA/rc.db). Several rc serve may share one "
        "database: one is active, the others are standbys that take over when it stops "
        '(README "More than one box")',
    )
    p.add_argument(
        "--advertise-url",
        type=advertise_url,
        default="",
        metavar="URL",
        help="with --database: the URL standbys name for this controller while it is the "
        "active one (http(s)://HOST:PORT; default: the URL of --listen, 127.0.0.1 for "
        "all interfaces)",
    )
    p.add_argument(
        "--leader-ttl",
        type=_in_range(_D, 1, 600, "1s to 10m"),
        default=5.0,
        metavar="D",
        help="with --database: the leadership lease's length; the active renews it every "
        "0.4 of it, a standby takes over once it has expired (default 5s)",
    )
    p.add_argument(
        "--log-dir",
        default="",
        metavar="DIR",
        help="where job logs live (default DATA/logs); controllers sharing one database "
        "must share this directory",
    )
    p.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="also listen on this Unix socket, where local users get a token for their own "
        "Unix user from the kernel (default: $RC_SOCKET or /run/rc/rc.sock as root, "
        "DATA/rc.sock otherwise; '' for none)",
    )
    p.add_argument(
        "--local-users",
        default="all",
        metavar="all|group:NAME",
        help="who may take a token from the socket: every local user (default), or the "
        "members of group NAME (root always may)",
    )
    p.add_argument("--certfile", default="", help="TLS certificate (PEM); enables https")
    p.add_argument("--keyfile", default="", help="TLS private key (PEM)")
    p.add_argument(
        "--webhook-url",
        default=os.environ.get("RC_WEBHOOK_URL", ""),
        help="POST every activity-feed event here (default: $RC_WEBHOOK_URL)",
    )
    p.add_argument(
        "--retain-disconnected-jobs",
        action="store_true",
        help="keep jobs of silent workers running instead of marking them lost",
    )
    p.add_argument(
        "--drain-degraded",
        action="store_true",
        help="drain a GPU whose health label says degraded (a narrowed PCIe link, "
        'sustained hardware throttling: README "GPU health")',
    )
    add_scheduling_options(p)
    p.add_argument(
        "--unknown-after",
        type=_in_range(_D, 1, _DAY, "1s to 1d"),
        default=30.0,
        metavar="D",
        help="silence after which a device shows unknown (default 30s)",
    )
    p.add_argument(
        "--lost-after",
        type=_in_range(_D, 1, 30 * _DAY, "1s to 30d"),
        default=300.0,
        metavar="D",
        help="silence after which a device is quarantined and its jobs lost (5m)",
    )
    p.add_argument(
        "--startup-grace",
        type=_in_range(_D, 0, _DAY, "0 to 1d"),
        default=30.0,
        metavar="D",
        help="after a start, nothing expires for this long (default 30s)",
    )
    p.add_argument(
        "--lease-renewal",
        type=_in_range(_D, 1, 30 * _DAY, "1s to 30d"),
        default=900.0,
        metavar="D",
        help="a heartbeat keeps a running job's lease at least this long (15m)",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=_in_range(_D, 0.1, 3600, "100ms to 1h"),
        default=10.0,
        metavar="D",
        help="how often workers are told to heartbeat (default 10s)",
    )
    p.add_argument(
        "--heartbeat-flush",
        type=_in_range(_D, 0, 60, "0 to 1m"),
        default=2.0,
        metavar="D",
        help="heartbeats that change no state are written together this often; "
        "0: each before its reply (default 2s)",
    )
    p.add_argument(
        "--sweep-interval",
        type=_in_range(_D, 0.05, 3600, "50ms to 1h"),
        default=10.0,
        metavar="D",
        help="how often silent workers and expired leases are swept (10s)",
    )
    p.add_argument(
        "--flap-limit",
        type=_in_range(_integer, 1, 1000, "1 to 1000"),
        default=3,
        metavar="N",
        help="automatic recoveries per device per --flap-window before a human "
        "must clear it (default 3)",
    )
    p.add_argument(
        "--flap-window",
        type=_in_range(_D, 1, 30 * _DAY, "1s to 30d"),
        default=3600.0,
        metavar="D",
        help="the window of --flap-limit (default 1h)",
    )
    p.add_argument(
        "--lease-default",
        type=_in_range(_D, 1, 30 * _DAY, "1s to 30d"),
        default=300.0,
        metavar="D",
        help="first lease of a job without a runtime, until a heartbeat renews it (5m)",
    )
    p.add_argument(
        "--lease-grace",
        type=_in_range(_D, 1, 30 * _DAY, "1s to 30d"),
        default=600.0,
        metavar="D",
        help="a job's lease outlives its max runtime by this much (10m)",
    )
    p.add_argument(
        "--log-cap",
        type=_in_range(_integer, 1024, 1 << 40, "1024 to 1099511627776 (1 TiB)"),
        default=256 << 20,
        metavar="BYTES",
        help="per-job log cap in bytes (default 256 MiB)",
    )
    p.add_argument(
        "--max-queued-spec-bytes",
        type=_in_range(_integer, 1024, 1 << 40, "0 (no budget) or 1024 to 1099511627776", True),
        default=256 << 20,
        metavar="BYTES",
        help="most bytes of job specs (commands, environments) one user may have queued; "
        'past it a submission is refused, 429 queued_spec_bytes (0: no budget; default 256 MiB; README "Limits")',
    )
    p.add_argument(
        "--export-default",
        type=_export_arg,
        default="ALL",
        metavar="EXPORT",
        help="what a job takes of its submitter's shell environment when rc run names no "
        "--export: ALL (the default, as sbatch), NONE (a clean start) or NAME,... "
        '(README "Your environment in a job")',
    )
    p.add_argument(
        "--retain-interval",
        type=_in_range(_D, 1, _DAY, "1s to 1d"),
        default=60.0,
        metavar="D",
        help="how often finished jobs are rolled up, and --retain and --log-quota applied (1m)",
    )
    p.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(handler="serve:cmd_serve")

    p = sub.add_parser(
        "worker",
        help="run the device agent on a GPU host (rc worker --help)",
        description="Run the device agent (its own options: rc worker --help).",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler="serve:cmd_worker")


def _export_arg(text: str) -> str:
    """argparse type of --export-default: an export (rc.proto.exports), kept as given."""
    from rc.proto.exports import parse_export

    try:
        parse_export(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def have_controller() -> bool:
    """Whether this rc carries the controller (a pip install does; the
    zipapp, worker and client only, does not)."""
    return importlib.util.find_spec("rc.controller") is not None


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = importlib.import_module("rc.controller.config")
        serve = importlib.import_module("rc.controller.serve")
    except ImportError as e:
        raise RcError(
            f"rc serve needs the controller's packages ({e.name}); "
            "install rc with pip (the zipapp carries only worker and client)"
        ) from None
    if args.database and not args.database.startswith(("postgresql://", "postgres://")):
        raise RcError(
            f"--database must be a postgresql:// URL (got {args.database.split('://')[0]!r}); "
            "leave it out for the embedded SQLite file in --data"
        )
    check_hold_idle(args.hold_idle_timeout, args.hold_idle_timeout_max, args.hold_idle_timeout_min)
    cfg = config.ControllerConfig(
        data_dir=args.data,
        database=args.database,
        log_dir=args.log_dir,
        advertise_url=args.advertise_url,
        leader_ttl=args.leader_ttl,
        listen=args.listen,
        socket=default_socket(args.data) if args.socket is None else args.socket,
        local_users=args.local_users,
        certfile=args.certfile,
        keyfile=args.keyfile,
        webhook_url=args.webhook_url,
        retain_disconnected_jobs=args.retain_disconnected_jobs,
        drain_degraded=args.drain_degraded,
        aging=args.aging,
        max_devices_per_user=args.max_devices_per_user,
        max_user_priority=args.max_user_priority,
        fair_share=args.fair_share,
        unknown_after=args.unknown_after,
        lost_after=args.lost_after,
        startup_grace=args.startup_grace,
        lease_renewal=args.lease_renewal,
        heartbeat_interval=args.heartbeat_interval,
        sweep_interval=args.sweep_interval,
        heartbeat_flush=args.heartbeat_flush,
        flap_limit=args.flap_limit,
        flap_window=args.flap_window,
        lease_default=args.lease_default,
        lease_grace=args.lease_grace,
        export_default=args.export_default,
        retain=args.retain,
        log_quota=args.log_quota,
        retain_interval=args.retain_interval,
        limits=config.Limits(
            log_cap_bytes=args.log_cap,
            queued_spec_bytes=args.max_queued_spec_bytes,
            hold_idle_timeout=args.hold_idle_timeout,
            hold_idle_timeout_max=args.hold_idle_timeout_max,
            hold_idle_timeout_min=args.hold_idle_timeout_min,
            hold_ttl_max=args.hold_ttl_max,
        ),
    )
    return serve.run(cfg, args.ready_fd)


def advertise_url(text: str) -> str:
    """argparse type of --advertise-url: http(s)://HOST[:PORT] with no path,
    query or credentials (a trailing / is dropped; "" is the default: the
    listen address's URL); anything else is a usage error naming the problem."""
    import urllib.parse

    t = text.strip().rstrip("/")
    if not t:
        return ""
    try:
        u = urllib.parse.urlsplit(t)
        port = u.port
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({e})") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} must look like http://HOST:PORT")
    if u.path or u.query or u.fragment or u.username or u.password or not t.isascii():
        raise argparse.ArgumentTypeError(
            f"{text!r} must be only http(s)://HOST:PORT (no path, query or user)"
        )
    del port
    return t


def check_hold_idle(default: int, top: int, least: int = 0) -> None:
    """Refuse (UsageError) a default hold idle timeout the maximum or the
    minimum forbids (above or below it, or off while either is set), and a
    minimum above the maximum."""
    from rc.proto.duration import format_duration

    what = "0 (off)" if default == 0 else format_duration(default)
    if top and (default == 0 or default > top):
        raise UsageError(
            f"--hold-idle-timeout {what} is not allowed by --hold-idle-timeout-max "
            f"{format_duration(top)}: give a default from 1s to the maximum"
        )
    if least and top and least > top:
        raise UsageError(
            f"--hold-idle-timeout-min {format_duration(least)} is above "
            f"--hold-idle-timeout-max {format_duration(top)}"
        )
    if least and (default == 0 or default < least):
        raise UsageError(
            f"--hold-idle-timeout {what} is not allowed by --hold-idle-timeout-min "
            f"{format_duration(least)}: give a default of at least the minimum"
        )


def default_socket(data_dir: str) -> str:
    """Where `rc serve` listens for local users unless told: $RC_SOCKET or
    /run/rc/rc.sock when run as root (every local user can reach it),
    DATA/rc.sock otherwise (inside the private data dir: only its owner)."""
    if os.geteuid() == 0:
        return localsocket.default_socket()
    return os.path.join(data_dir, "rc.sock")


def cmd_worker(args: argparse.Namespace) -> int:
    # `rc worker` is routed to rc.worker by rc/__main__.py before the client
    # parser runs; this stub only lists it in `rc --help`.
    raise UsageError("run the worker as `rc worker ...` or `python3 rc.pyz worker ...`")
