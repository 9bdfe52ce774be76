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
    "SHARED_DEFAULTS",
    "defaults_for",
    "differences",
    "keep_settings",
    "read_state",
    "same_address",
    "same_value",
    "scheduling_given",
    "serve_flags",
    "shared_line",
]

SETTINGS = ("listen", "devices", "host", "socket", "scheduling")
"""What up.json keeps of an rc up once its processes are stopped, for the next
one in that data dir (unless given again)."""


SHARED_DEFAULTS = {"fair_share": "7d", "hold_ttl_max": "24h", "hold_idle_timeout_min": "10m"}
"""What `sudo rc up -d` (a one-box every local user shares) runs with unless
told otherwise: fair share with a 7-day half-life, holds of at most 24 h,
and idle holds reclaimed after at least 10 min (README "Shared-box
defaults"). rc up --fair-share 0 (and the like) turns one off."""
_SHARED_WORDS = {
    "fair_share": ("fair share", "half-life {}", "off"),
    "hold_ttl_max": ("a hold's ttl", "at most {}", "up to the devices' ceiling"),
    "hold_idle_timeout_min": ("a hold's idle timeout", "at least {}", "any, or off"),
}


def defaults_for(root: bool) -> dict[str, str]:
    """The scheduling options an rc up starts from before up.json's and the
    flags: SHARED_DEFAULTS for root's shared box, none for a single user's."""
    return dict(SHARED_DEFAULTS) if root else {}


def shared_line(scheduling: dict[str, str]) -> str:
    """The shared-box settings in words, from the scheduling options a
    controller runs with: "fair share: half-life 7d; a hold's ttl: at most
    24h; a hold's idle timeout: at least 10m (change: rc down, then rc up
    --fair-share D / --hold-ttl-max D / --hold-idle-timeout-min D; 0 turns
    one off)"."""
    parts = []
    for dest, (what, on, off) in _SHARED_WORDS.items():
        text = scheduling.get(dest, "0")
        try:
            value = scheduling_value(dest, text)
        except argparse.ArgumentTypeError:
            value = 0
        parts.append(f"{what}: {on.format(text) if value else off}")
    flags = " / ".join(f"--{d.replace('_', '-')} D" for d in _SHARED_WORDS)
    return f"{'; '.join(parts)} (to change: rc down, then rc up {flags}; 0 turns one off)"


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
