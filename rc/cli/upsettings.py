"""An rc up's settings: what the data directory's up.json keeps of the last
rc up, how the flags of a new one compare with a running one, and the
scheduling options it hands to its rc serve.

up.json holds, while an `rc up -d` runs, its processes and settings (see
rc.cli.up); once they are stopped, only the settings (SETTINGS), which the
next `rc up` in that data dir starts with unless given again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rc.cli.serve import SCHEDULING_OPTIONS, scheduling_value

__all__ = [
    "SETTINGS",
    "differences",
    "keep_settings",
    "read_state",
    "same_address",
    "same_value",
    "scheduling_given",
    "serve_flags",
]

SETTINGS = ("listen", "devices", "host", "socket", "scheduling")
"""What up.json keeps of an rc up once its processes are stopped, for the next
one in that data dir (unless given again)."""


def keep_settings(path: Path, st: dict) -> None:
    """Leave in up.json (`path`) only the settings of the stopped rc up `st`
    (SETTINGS), no process: the next `rc up` there starts with them, and
    `rc down` finds nothing to stop. Removes the file when there are none."""
    kept = {k: st[k] for k in SETTINGS if st.get(k)}
    if kept:
        path.write_text(json.dumps(kept))
    else:
        path.unlink(missing_ok=True)


def read_state(path: Path) -> dict:
    """up.json at `path` as a dict; {} when it is missing, unreadable or not
    a JSON object."""
    try:
        st = json.loads(path.read_text())
        return st if isinstance(st, dict) else {}
    except (OSError, ValueError):
        return {}


def same_address(listen: str, st: dict) -> bool:
    """Whether `--listen listen` names the controller recorded in up.json
    (as given then, or as it listens now; port 0 matches any port)."""
    if listen == st.get("listen"):
        return True
    at = str(st.get("url", "")).rpartition("//")[2]
    if listen == at:
        return True
    host, _, port = listen.rpartition(":")
    return port == "0" and host == at.rpartition(":")[0]


def differences(
    args: argparse.Namespace, st: dict, worker_runs: bool, serve_runs: bool = False
) -> list[str]:
    """The flags given to this rc up that the running one (up.json `st`)
    does not have and cannot take while it runs: --listen while any part
    runs, --devices and --host while its worker runs, the scheduling
    options while its controller runs."""
    out = []
    if args.listen is not None and st.get("url") and not same_address(args.listen, st):
        out.append(f"--listen {args.listen} (it listens at {st['url']})")
    if serve_runs:
        running = st.get("scheduling") or {}
        for dest, text in scheduling_given(args).items():
            if dest in running and same_value(dest, running[dest], text):
                continue
            if running.get(dest) != text:
                flag = "--" + dest.replace("_", "-")
                now = f"{flag} {running[dest]}" if dest in running else "its default"
                out.append(f"{flag} {text} (its controller runs with {now})")
    if worker_runs:
        if args.devices is not None and args.devices != st.get("devices", args.devices):
            out.append(f"--devices {args.devices} (it runs with --devices {st['devices']})")
        if args.host is not None and args.host != st.get("host", args.host):
            out.append(f"--host {args.host} (its worker is host {st['host']})")
    return out


def same_value(dest: str, a: str, b: str) -> bool:
    """Whether two texts of scheduling option `dest` give one value ("5m" is
    "300s"); a text the option does not take (an older up.json) is no match."""
    try:
        return scheduling_value(dest, a) == scheduling_value(dest, b)
    except argparse.ArgumentTypeError:
        return False


def scheduling_given(args: argparse.Namespace) -> dict[str, str]:
    """The scheduling options given to this rc up (dest → the text given)."""
    return {d: getattr(args, d) for d in SCHEDULING_OPTIONS if getattr(args, d) is not None}


def serve_flags(scheduling: dict[str, str]) -> list[str]:
    """rc serve's flags for these scheduling options (dest → text)."""
    out = []
    for dest in SCHEDULING_OPTIONS:
        if dest in scheduling:
            out += ["--" + dest.replace("_", "-"), scheduling[dest]]
    return out
