"""Where the client finds its controller and token (inventory §2.1).

Controller URL: RC_CONTROLLER, else `controller` in the config file, else
http://127.0.0.1:8080. Token: RC_TOKEN, else `token` in the config file.
CA bundle for https: RC_CACERT, else `cacert` (a relative path there is
relative to the config file's directory). The config file is
$RC_CONFIG, else $XDG_CONFIG_HOME/rc/config.toml (~/.config/rc/config.toml),
TOML, read once per process. A missing file is fine; an unreadable or
malformed one gives one warning on stderr and is ignored.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_CONTROLLER", "ClientConfig", "config_path", "load", "write_config"]

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
KEYS = ("controller", "token", "cacert")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The effective client settings and where each came from."""

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


def read_file(path: Path) -> dict[str, str]:
    """The file's known keys (warning once on stderr if it cannot be used)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        print(f"rc: warning: ignoring {path}: {e}", file=sys.stderr)
        return {}
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
        controller=pick("RC_CONTROLLER", "controller", DEFAULT_CONTROLLER),
        token=pick("RC_TOKEN", "token"),
        cacert=cacert,
        path=path,
    )


def write_config(path: Path, controller: str, token: str) -> None:
    """Write a client config file, mode 0600 (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = f'controller = "{controller}"\ntoken = "{token}"\n'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    os.chmod(path, 0o600)
