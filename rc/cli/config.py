"""Where the client finds its controller and token (README "Configuration").

Controller URL (or a comma-separated list of them, rc.proto.client):
RC_CONTROLLER, else `controller` in the config file (""
when neither names one: rc.cli.context then uses the default local socket
when it exists, else http://127.0.0.1:8080). Token: RC_TOKEN, else `token`
in the config file.
CA bundle for https: RC_CACERT, else `cacert` (a relative path there is
relative to the config file's directory). The config file is
$RC_CONFIG, else $XDG_CONFIG_HOME/rc/config.toml (~/.config/rc/config.toml),
TOML. A missing file is fine; an unreadable or malformed one gives one
warning on stderr and is ignored, and so does a key rc does not know (the
warning names the nearest known key: `contoller` → did you mean
`controller`?). Each warning is given once per process.
"""

from __future__ import annotations

import difflib
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_CONTROLLER",
    "ClientConfig",
    "config_path",
    "file_problem",
    "load",
    "read_file",
    "write_config",
]

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
KEYS = ("controller", "token", "cacert")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The effective client settings and where each came from (controller
    and token "" when nothing names them)."""

    controller: str
    token: str
    cacert: str
    path: Path


def config_path() -> Path:
    """The client config file's path (it may not exist)."""
    if os.environ.get("RC_CONFIG"):
        return Path(os.environ["RC_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rc" / "config.toml"


_warned: set[str] = set()


def _warn(text: str) -> None:
    if text not in _warned:
        _warned.add(text)
        print(f"rc: warning: {text}", file=sys.stderr)


def _parse(path: Path) -> tuple[dict | None, str]:
    """(the file's TOML, "") or (None, why it cannot be used); ({}, "") when missing."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f), ""
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return None, str(e)


def file_problem(path: Path) -> str | None:
    """Why the config file at `path` cannot be used as it is ("missing", or
    the reason it cannot be read or parsed), None when it can."""
    if not path.exists():
        return "missing"
    data, why = _parse(path)
    return None if data is not None else why


def read_file(path: Path) -> dict[str, str]:
    """The file's known keys (warning once on stderr if it cannot be used,
    and for each key it has that rc does not know)."""
    data, why = _parse(path)
    if data is None:
        _warn(f"ignoring {path}: {why}")
        return {}
    for key in data:
        if key not in KEYS:
            near = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known: {', '.join(KEYS)})"
            _warn(f"{path}: unknown key {key!r} ignored{hint}")
    out = {}
    for key in KEYS:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            out[key] = value.strip()
    return out


def load() -> ClientConfig:
    """The effective client configuration (environment wins over the file)."""
    path = config_path()
    file = read_file(path)

    def pick(env: str, key: str, default: str = "") -> str:
        value = os.environ.get(env, "").strip()
        return value or file.get(key, default)

    cacert = os.environ.get("RC_CACERT", "").strip()
    if not cacert and file.get("cacert"):
        # a relative path in the file is relative to the file, not to where rc runs
        cacert = str(path.parent / os.path.expanduser(file["cacert"]))
    return ClientConfig(
        controller=pick("RC_CONTROLLER", "controller"),
        token=pick("RC_TOKEN", "token"),
        cacert=cacert,
        path=path,
    )


def write_config(path: Path, controller: str, token: str, cacert: str = "") -> None:
    """Write a client config file, mode 0600 (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = f'controller = "{controller}"\ntoken = "{token}"\n'
    if cacert:
        body += f"cacert = {_toml_string(cacert)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    os.chmod(path, 0o600)


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
