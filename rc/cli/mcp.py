"""`rc mcp`: an MCP server on stdio for coding agents (README "Agents: rc mcp").

It acts as the user who runs it, with the CLI's credentials (rc.api.connect:
--controller/--token, RC_CONTROLLER/RC_TOKEN, the config file, the local
socket), and is read-only unless told otherwise: list, show and explain
jobs, wait for one, list devices, explain a selector, the usage ledger, and
the logs of the caller's own jobs. `--allow submit,kill` adds the two
writes, each still under the caller's identity and limits (the controller
checks them as for `rc run` and `rc kill`), and each sent with
rc.proto.VIA_HEADER "mcp", so the activity feed records it "via mcp".

The tools themselves (`Tools`) are plain functions on an rc.api
Connection returning JSON-ready dicts; `serve` registers them with the
official MCP Python SDK (the optional extra `rc[mcp]`), imported only when
the command runs: rc/cli is standard library only (it ships in the zipapp).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rc.cli.context import add_client_flags
from rc.proto import calls
from rc.proto.codec import encode
from rc.proto.errors import ApiError, RcError

__all__ = [
    "LIST_MAX",
    "LOG_TAIL_DEFAULT",
    "LOG_TAIL_MAX",
    "WAIT_MAX_S",
    "WRITES",
    "Tools",
    "add_parsers",
    "cmd_mcp",
    "require_sdk",
    "serve",
]

WRITES = ("submit", "kill")
"""The tools `--allow` may add; none is on by default."""
LIST_MAX = 200
"""The most jobs `list_jobs` answers (agents' context is small)."""
LOG_TAIL_DEFAULT = 16 << 10
"""The bytes of a job's log `job_logs` answers by default: its end."""
LOG_TAIL_MAX = 256 << 10
"""The most bytes of a log one `job_logs` call answers."""
WAIT_MAX_S = 120
"""The longest `wait_job` blocks (seconds); it answers the job as it is then."""
INSTALL_HINT = "pip install 'rc[mcp]'"


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "mcp",
        help="an MCP server on stdio for coding agents, acting as you (read-only by default)",
        description="Serve rc to an MCP client (a coding agent) on stdin/stdout, as the "
        "user who runs it, with this rc's credentials. Read-only by default: jobs "
        "(list, show, explain, wait), devices, selectors, usage, and the logs of your "
        "own jobs. --allow submit,kill adds the writes, each checked by the controller "
        "against your identity and limits and recorded in the activity feed 'via mcp'. "
        f"Needs the MCP Python SDK: {INSTALL_HINT}.",
    )
    p.add_argument(
        "--allow",
        type=_allowed,
        default=frozenset(),
        metavar="WRITES",
        help=f"comma list of writes to enable: {', '.join(WRITES)} (default: none)",
    )
    add_client_flags(p)
    p.set_defaults(handler="mcp:cmd_mcp")


def _allowed(text: str) -> frozenset[str]:
    """argparse type: a comma list of WRITES ("submit,kill"); "" for none."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in WRITES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{bad[0]!r} is not a write rc mcp can allow (choose from {', '.join(WRITES)})"
        )
    return frozenset(names)


def _job(view_or_record: Any) -> dict:
    """A job as a tool answers it: the record's fields, enums as strings."""
    return encode(view_or_record)


class Tools:
    """What each MCP tool does, on `conn` (an rc.api.Connection), as the
    principal `me` (rc.api.Connection.whoami()). Each method returns a dict
    of JSON values, or raises RcError (the server turns it into the tool's
    error, the controller's code and words kept). What each one does, its
    limits and its costs are its DESCRIPTIONS entry, which the agent reads."""

    def __init__(self, conn, allow: frozenset[str] = frozenset()) -> None:
        self.conn = conn
        self.allow = allow
        self.me = conn.whoami()

    def _own(self, job_id: int, what: str):
        """The handle on job `job_id` when the caller owns it, else RcError:
        rc mcp reads logs and kills only its caller's own jobs, even for an
        admin (the agent acts for one person)."""
        job = self.conn.job(job_id)
        if job.record.owner and job.record.owner != self.me.principal:
            raise RcError(
                f"job {job_id} belongs to {job.record.submitter}; rc mcp {what} only "
                f"the jobs of its caller ({self.me.label or self.me.name})"
            )
        return job

    def whoami(self) -> dict:
        return {**encode(self.me), "allowed_writes": sorted(self.allow)}

    def list_jobs(
        self, state: list[str] | None = None, mine: bool = True, name: str = "", limit: int = 20
    ) -> dict:
        if not 1 <= limit <= LIST_MAX:
            raise RcError(f"limit is 1..{LIST_MAX}, not {limit}")
        got = self.conn.jobs(mine=mine, state=state or None, name=name or None, limit=limit)
        return {"jobs": [_job(j.record) for j in got]}

    def show_job(self, job_id: int) -> dict:
        return self.conn.client.call(calls.JOB_GET, job_id, params={"detail": "1"})

    def explain_job(self, job_id: int) -> dict:
        return encode(self.conn.job(job_id).explain())

    def wait_job(self, job_id: int, timeout_seconds: int = 60) -> dict:
        if not 1 <= timeout_seconds <= WAIT_MAX_S:
            raise RcError(f"timeout_seconds is 1..{WAIT_MAX_S}, not {timeout_seconds}")
        from rc.api import WaitTimeout

        job = self.conn.job(job_id)
        try:
            return {"ended": True, "job": _job(job.wait(timeout=timeout_seconds))}
        except WaitTimeout as e:
            return {"ended": False, "job": _job(e.job)}

    def job_logs(self, job_id: int, tail_bytes: int = LOG_TAIL_DEFAULT) -> dict:
        if not 1 <= tail_bytes <= LOG_TAIL_MAX:
            raise RcError(f"tail_bytes is 1..{LOG_TAIL_MAX}, not {tail_bytes}")
        job = self._own(job_id, "reads the logs of")
        return {"job_id": job_id, "state": job.state.value, "log": job.logs(tail_bytes=tail_bytes)}

    def list_devices(self) -> dict:
        return {"devices": [encode(d) for d in self.conn.devices()]}

    def explain_selector(self, selector: str) -> dict:
        return encode(self.conn.explain(selector))

    def usage(self, since: str = "7d", by: str = "user") -> dict:
        return encode(self.conn.usage(since=since, by=by))

    def submit_job(
        self,
        command: list[str],
        selector: str = "*",
        count: int = 1,
        name: str = "",
        max_runtime_seconds: int = 0,
        priority: int = 0,
        env: dict[str, str] | None = None,
        cwd: str = "",
        after: list[str] | None = None,
    ) -> dict:
        if "submit" not in self.allow:
            raise RcError("rc mcp was started without --allow submit")
        job = self.conn.submit(
            command,
            selector=selector,
            count=count,
            name=name,
            max_runtime=max_runtime_seconds,
            priority=priority,
            env=env or {},
            cwd=cwd or None,
            after=after or (),
        )
        return {"job": _job(job.record), "queue_position": job.queue_position}

    def kill_job(self, job_id: int, reason: str = "") -> dict:
        if "kill" not in self.allow:
            raise RcError("rc mcp was started without --allow kill")
        job = self._own(job_id, "kills")
        return {"job_id": job_id, "message": job.kill(reason or "killed by an agent (rc mcp)")}


DESCRIPTIONS = {
    "whoami": "Who this server acts as (token name, role, Unix user, principal) and which "
    "writes it allows. Free: one small request.",
    "list_jobs": "List jobs newest first: yours (mine=true, the default) or everyone's; "
    "state filters by any of queued, assigned, running, succeeded, failed, killed, lost; "
    f"name is a glob. At most {LIST_MAX} jobs (limit, default 20); commands are cut to 256 "
    "characters (show_job has them whole). Free: one request.",
    "show_job": "One job in full: its record, queue position and details (waited and ran "
    "seconds, runtime ceiling, log size, why it waits). Free: one request.",
    "explain_job": "Why a queued job is not running, in sentences, with the devices that "
    "block it and who holds them. Free: one request.",
    "wait_job": "Wait for a job to end, at most timeout_seconds (1.."
    f"{WAIT_MAX_S}, default 60); answers ended=false and the job as it is when the time "
    "passes first. Blocks this call, costs nothing on the devices.",
    "job_logs": "The end of one of YOUR jobs' stored output (stdout and stderr together): "
    f"its last tail_bytes bytes (default {LOG_TAIL_DEFAULT}, at most {LOG_TAIL_MAX}), as "
    "text. Someone else's job is refused; a terminal (tty) job's output is never stored.",
    "list_devices": "Every device: id host:name, state (ready = free, busy, unknown, "
    "unhealthy), labels (model, memory...), who holds it and since when. Free: one request.",
    "explain_selector": "Which devices a selector (e.g. 'kind=gpu,vram>=40G', '*' for any) "
    "matches, which of them are free, and how many queued jobs compete. Free.",
    "usage": "The usage ledger over the last `since` (e.g. 7d, 30d) by user, host, device, "
    "day or week: device-seconds held, jobs by state, queue wait percentiles. Free.",
    "submit_job": "Submit a job AS YOUR USER: command is an argv list (a shell line is "
    "['sh','-c',LINE]); it runs in cwd (default: where rc mcp runs) on `count` devices of "
    "one host matching `selector`. COSTS: it holds those devices until it ends or "
    "max_runtime_seconds passes (0: the devices' ceiling), counts toward your per-user "
    "device cap, queue limits and fair-share usage, and delays other people's jobs. "
    "Refused by the controller as rc run would be (bad_selector, no_matching_device, "
    "runtime_above_ceiling, queue_full, priority_not_allowed). Recorded in the activity "
    "feed 'via mcp'. Returns the job id at once; use wait_job and job_logs after.",
    "kill_job": "Kill one of YOUR jobs (or cancel it while queued). Its process is stopped; "
    "what it had not saved is lost. Someone else's job is refused. Recorded in the "
    "activity feed 'via mcp'.",
}
"""Each tool's description as the agent reads it: what it does, its limits, its costs."""
READ_ONLY = (
    "whoami",
    "list_jobs",
    "show_job",
    "explain_job",
    "wait_job",
    "job_logs",
    "list_devices",
    "explain_selector",
    "usage",
)


def require_sdk() -> None:
    """Raise RcError naming `pip install 'rc[mcp]'` when the MCP Python SDK
    (mcp >= 2, whose server is mcp.server.mcpserver) cannot be imported."""
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError as e:
        raise RcError(
            f"rc mcp needs the MCP Python SDK 2.x, which is not installed here ({e}): "
            f"{INSTALL_HINT}"
        ) from None


def serve(tools: Tools) -> None:
    """Register `tools` with the MCP SDK and serve them on stdio until the
    client closes its end. Raises RcError as require_sdk does."""
    require_sdk()
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    from rc import __version__

    server = MCPServer(
        name="rc",
        version=__version__,
        instructions="rc shares a lab's GPUs. You act as "
        f"{tools.me.label or tools.me.name}. Read-only tools are free; "
        + (
            f"writes allowed: {', '.join(sorted(tools.allow))} (each recorded 'via mcp')."
            if tools.allow
            else "no writes are allowed (rc mcp --allow submit,kill enables them)."
        ),
        log_level="WARNING",
    )

    def wrap(name: str):
        method = getattr(tools, name)

        def run(*args, **kw):
            try:
                return method(*args, **kw)
            except ApiError as e:
                raise ToolError(f"{e.code}: {e.message}") from None
            except RcError as e:
                raise ToolError(str(e)) from None

        run.__name__ = name
        run.__doc__ = DESCRIPTIONS[name]
        run.__signature__ = _signature(method)
        run.__annotations__ = dict(getattr(method, "__annotations__", {}))
        return run

    for name in READ_ONLY:
        server.add_tool(
            wrap(name),
            name=name,
            description=DESCRIPTIONS[name],
            annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
            structured_output=False,
        )
    if "submit" in tools.allow:
        server.add_tool(
            wrap("submit_job"),
            name="submit_job",
            description=DESCRIPTIONS["submit_job"],
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
            structured_output=False,
        )
    if "kill" in tools.allow:
        server.add_tool(
            wrap("kill_job"),
            name="kill_job",
            description=DESCRIPTIONS["kill_job"],
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
            structured_output=False,
        )
    server.run("stdio")


def _signature(method):
    """`method`'s signature without `self`, its annotations resolved (the
    SDK builds each tool's input schema from it)."""
    import inspect
    import typing

    hints = typing.get_type_hints(method)
    sig = inspect.signature(method)
    return sig.replace(
        parameters=[
            p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
        ],
        return_annotation=hints.get("return", sig.return_annotation),
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    """`rc mcp [--allow submit,kill]`: serve until the client closes stdin.
    Diagnostics on stderr; stdout carries only the protocol."""
    import rc.api
    from rc.proto import VIA_HEADER

    require_sdk()
    conn = rc.api.connect(
        controller=args.controller,
        token=args.token,
        cacert=args.cacert,
        headers={VIA_HEADER: "mcp"},
    )
    tools = Tools(conn, args.allow)  # who we are, before serving: a bad token fails here
    out, err = sys.stdout, sys.stderr
    sys.stdout = getattr(out, "_stream", out)  # the protocol's bytes, not rc's escaping
    sys.stderr = getattr(err, "_stream", err)
    try:
        serve(tools)
    finally:
        sys.stdout, sys.stderr = out, err
        conn.close()
    return 0
