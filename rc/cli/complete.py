"""Shell completion of what only the controller knows: job ids, device ids,
label keys in a selector.

Each completer is an argcomplete completer (set as `action.completer`;
argcomplete itself stays optional, this module does not import it): it asks
the controller named by the command line (--controller, else RC_CONTROLLER or
the config file) with a short timeout and returns {completion: description}.
Anything that goes wrong (no controller, no token, a refusal, a timeout)
gives no completions, silently: a Tab press never prints an error.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rc.cli.context import client
from rc.cli.output import job_state, job_what
from rc.proto import calls

__all__ = [
    "COMPLETE_TIMEOUT_S",
    "attach",
    "devices",
    "holds",
    "label_keys",
    "live_jobs",
    "recent_jobs",
]

COMPLETE_TIMEOUT_S = 1.0
"""Bound on each request a completion makes (connect and read), in seconds."""
RECENT_JOBS = 100
"""How many of the newest jobs `recent_jobs` offers."""
BUILT_IN_KEYS = ("host", "device", "id")
"""Label keys every device has (README: Selectors)."""
_OPERATOR_CHARS = "=!<>"


def _ask(
    parsed_args: argparse.Namespace | None, call: calls.Call, params: dict | None = None
) -> Any:
    c = client(parsed_args or argparse.Namespace(), timeout=COMPLETE_TIMEOUT_S)
    c.connect_timeout = COMPLETE_TIMEOUT_S
    try:
        return c.call(call, params=params)
    finally:
        c.close_all()


def _quiet(fn: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
    """`fn` returning {} instead of raising (a completion never errors)."""

    def completer(prefix: str = "", parsed_args=None, **_kw) -> dict[str, str]:
        try:
            return fn(prefix, parsed_args)
        except Exception:  # noqa: BLE001 - no completions is the whole error handling
            return {}

    completer.__name__ = fn.__name__
    completer.__doc__ = fn.__doc__
    return completer


def _describe(job: dict) -> str:
    return f"{job_state(job)}, {job['submitter']}: {job_what(job, 40)}"


@_quiet
def live_jobs(prefix: str, parsed_args) -> dict[str, str]:
    """Ids of the jobs and holds that are running or queued (rc kill, rc
    explain)."""
    st = _ask(parsed_args, calls.STATE)
    return {
        str(j["id"]): _describe(j)
        for j in (*st["jobs"], *st["queued"])
        if str(j["id"]).startswith(prefix)
    }


@_quiet
def holds(prefix: str, parsed_args) -> dict[str, str]:
    """Ids of the holds that have not ended, granted ones first (rc shell,
    rc exec, rc release): never a plain job."""
    st = _ask(parsed_args, calls.STATE)
    return {
        str(j["id"]): _describe(j)
        for j in (*st["jobs"], *st["queued"])
        if j.get("kind") == "hold" and str(j["id"]).startswith(prefix)
    }


@_quiet
def recent_jobs(prefix: str, parsed_args) -> dict[str, str]:
    """Ids of the newest RECENT_JOBS jobs, finished ones included (rc logs)."""
    got = _ask(parsed_args, calls.JOBS, {"limit": RECENT_JOBS})["jobs"]
    return {str(j["id"]): _describe(j) for j in got if str(j["id"]).startswith(prefix)}


@_quiet
def devices(prefix: str, parsed_args) -> dict[str, str]:
    """Device ids, host:name, with their state."""
    views = _ask(parsed_args, calls.DEVICES, {"labels": "false"})["devices"]
    return {
        v["device"]["id"]: v["device"]["state"]
        for v in views
        if v["device"]["id"].startswith(prefix)
    }


@_quiet
def label_keys(prefix: str, parsed_args) -> dict[str, str]:
    """The label key of a selector's last term, while it has no operator yet:
    `vr` → `vram`, `model=h100,dr` → `model=h100,driver`."""
    head, _, term = prefix.rpartition(",")
    if any(ch in term for ch in _OPERATOR_CHARS):
        return {}
    head = head + "," if head else ""
    typed = term.strip()
    keys = set(BUILT_IN_KEYS)
    for v in _ask(parsed_args, calls.DEVICES)["devices"]:
        keys.update(lb["key"] for lb in v["device"]["labels"])
    return {head + k: "label" for k in sorted(keys) if k.startswith(typed)}


def attach(action: argparse.Action, completer: Callable[..., dict[str, str]]) -> argparse.Action:
    """Set `completer` on `action` (what argcomplete reads); returns the action."""
    action.completer = completer  # type: ignore[attr-defined]
    return action
