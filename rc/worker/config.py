"""The worker's configuration: /etc/rc/worker.toml (README "Operating a worker").

Every key, its default and unit (top-level keys first, as TOML requires):

    controller_url      = "http://ctl:8080"   # required (or --controller); a comma list
                                              # "http://a:8080,http://b:8080" follows failovers
    token               = "..."               # else token_file, else $RC_TOKEN
    token_file          = "/etc/rc/worker.token"
    cacert              = ""                  # PEM bundle for an https controller
    host                = "gpu-host-1"        # default: the short hostname
    devices             = "auto"              # "auto", "cpu:N", "gpu0,gpu1", or tables:
    labels              = { site = "b2" }     # declared host-wide labels
    heartbeat_interval  = "10s"
    poll_wait           = "30s"               # long-poll wait
    kill_grace          = "10s"               # SIGTERM → SIGKILL
    reregister_after    = "5m"                # contact back after this much silence → re-register
    reregister_jitter   = "30s"               # re-registrations wait a random [0, this)
    hooks               = { timeout = "60s", release_linger = "30s" }
    probe_dir           = "/etc/rc/probe.d"
    probe_interval      = "5m"
    probe_timeout       = "5s"                # per drop-in
    verify_dir          = "/etc/rc/verify.d"
    verify_timeout      = "30s"               # per script
    verify_pass_budget  = "2m"                # the whole pass
    sheet_dir           = "/etc/rc"           # host.md and host.d/DEVICE.md
    require_manual_clear = false
    spool_dir           = ""                  # default: a private temporary directory
    spool_max_bytes     = 268435456           # on-disk log spool (all jobs); 0: none
    allow_root_jobs     = false               # a root worker runs jobs whose Unix user is root
    shared_account      = false               # every job runs as this worker's own user
    job_path            = ""                  # jobs' PATH (default: the standard system PATH)
    pass_env            = []                  # names of worker variables passed to jobs
    cgroup_root         = ""                  # cgroup hierarchy to track jobs in; "": detect
    recheck_interval    = "30s"               # survivor rescan of a quarantined device
    kernel_log          = "/dev/kmsg"         # where Xid events are read; unreadable: dmesg

    [[devices]]                               # one table per device, or a list of names
    name           = "gpu0"
    max_runtime    = "24h"                    # the device's ceiling; 0 or >= 1s
    on_acquire     = "/etc/rc/hooks/acquire"  # lease hooks (rc.worker.hooks)
    on_release     = "/etc/rc/hooks/release"
    timeout        = "60s"                    # this device's hook timeout
    release_linger = "30s"
    labels         = { tier = "a" }           # declared labels of this device

Whom jobs run as (rc.worker.account): a worker running as root runs every
job as the job's Unix user, and root's jobs only with allow_root_jobs; a
worker that is not root runs only its own user's jobs. shared_account runs
any identity's job as the worker's own user, giving up that separation.

Durations are strings such as "30s", "5m", "500ms" (or plain seconds).
Defaults are applied to configs built in code too (`WorkerConfig()`), so no
timeout is ever zero-means-unbounded by accident. RC_TOKEN fills a missing
token (the file wins; blank is ignored); RC_REQUIRE_MANUAL_CLEAR can only
switch require_manual_clear on (an unparseable non-blank value counts as true).
Command-line flags (--controller, --devices, --host, ...) override the file.

Errors raise ConfigError naming the file, the key and the problem (a token
file that cannot be read or is empty: the flag or the file that named it).
A key the worker does not know is such an error too, naming the nearest
known key (`require_manual_claer` → did you mean `require_manual_clear`?):
the worker refuses to start rather than run without a setting its operator
meant to give (a misspelt safety setting must not be dropped quietly).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import socket
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any

from rc.proto.client import parse_controller_urls
from rc.proto.duration import DurationError, format_duration, parse_duration
from rc.proto.errors import RcError
from rc.proto.model import DEVICES_PER_WORKER_MAX

__all__ = [
    "DEFAULT_PATH",
    "MAX_DEVICES",
    "ConfigError",
    "DeviceConfig",
    "WorkerConfig",
    "load",
    "parse_bool_env",
]

DEFAULT_PATH = "/etc/rc/worker.toml"

MAX_DEVICES = DEVICES_PER_WORKER_MAX
"""Most devices one worker may declare: the controller's limit
(rc.controller.config Limits.devices_per_worker, which answers more with 400
limit_exceeded), kept in rc.proto so the CLI's `rc up --devices` checks it
too; tests/e2e/test_worker_operator.py checks that the two agree."""


class ConfigError(RcError):
    """The worker configuration is wrong; the message names file, key and problem."""


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """One device this worker offers. Durations in seconds; hooks are paths."""

    name: str
    max_runtime: float = 0.0
    on_acquire: str = ""
    on_release: str = ""
    timeout: float = 0.0
    release_linger: float = -1.0
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The effective worker configuration (see the module docstring)."""

    controller_url: str = ""
    token: str = ""
    token_file: str = ""
    cacert: str = ""
    host: str = ""
    devices: tuple[DeviceConfig, ...] | str = "auto"
    labels: dict[str, str] = field(default_factory=dict)
    heartbeat_interval: float = 10.0
    poll_wait: float = 30.0
    kill_grace: float = 10.0
    reregister_after: float = 300.0
    reregister_jitter: float = 30.0
    hook_timeout: float = 60.0
    release_linger: float = 30.0
    probe_dir: str = "/etc/rc/probe.d"
    probe_interval: float = 300.0
    probe_timeout: float = 5.0
    verify_dir: str = "/etc/rc/verify.d"
    verify_timeout: float = 30.0
    verify_pass_budget: float = 120.0
    sheet_dir: str = "/etc/rc"
    require_manual_clear: bool = False
    spool_dir: str = ""
    spool_max_bytes: int = 256 << 20
    allow_root_jobs: bool = False
    shared_account: bool = False
    job_path: str = ""
    pass_env: tuple[str, ...] = ()
    cgroup_root: str = ""
    recheck_interval: float = 30.0
    kernel_log: str = "/dev/kmsg"

    def __post_init__(self) -> None:
        # Defaults for configs built in code: a zero or negative timeout never
        # means "unbounded".
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in (
            "heartbeat_interval",
            "poll_wait",
            "kill_grace",
            "hook_timeout",
            "probe_interval",
            "probe_timeout",
            "verify_timeout",
            "verify_pass_budget",
            "reregister_after",
            "recheck_interval",
        ):
            if getattr(self, name) <= 0:
                object.__setattr__(self, name, defaults[name])
        if self.release_linger < 0:
            object.__setattr__(self, "release_linger", defaults["release_linger"])
        if not self.host:
            object.__setattr__(self, "host", default_host())

    def device_timeout(self, d: DeviceConfig) -> float:
        """A device's hook timeout (its own, else the host default)."""
        return d.timeout if d.timeout > 0 else self.hook_timeout

    def device_linger(self, d: DeviceConfig) -> float:
        """A device's release linger (its own, else the host default)."""
        return d.release_linger if d.release_linger >= 0 else self.release_linger

    def as_toml(self) -> str:
        """The effective configuration as TOML that `load` reads back to the
        same config (durations as "30s", the token left out: only whether one
        is set is shown, in a comment)."""
        lines = ["# rc worker: effective configuration"]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("hook_timeout", "release_linger"):
                continue
            if f.name == "token":
                lines.append(f"# token: {'set' if value else 'not set'} (never printed)")
                continue
            if f.name == "devices":
                lines.append(f"devices = {_toml_devices(value)}")
            elif f.name in _DURATIONS:
                lines.append(f"{f.name} = {_toml_value(_duration_text(value))}")
            else:
                lines.append(f"{f.name} = {_toml_value(value)}")
            if f.name == "kill_grace":
                lines.append(
                    f"hooks = {{ timeout = {_toml_value(_duration_text(self.hook_timeout))}, "
                    f"release_linger = {_toml_value(_duration_text(self.release_linger))} }}"
                )
        return "\n".join(lines) + "\n"


def default_host() -> str:
    """The short hostname, as a valid rc host name."""
    name = socket.gethostname().split(".")[0] or "localhost"
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:63]


def _duration_text(seconds: float) -> str:
    """Seconds as a duration string that parses back exactly ("1m30s", "1500ms")."""
    if seconds == int(seconds):
        return format_duration(seconds)
    return f"{round(seconds * 1000)}ms"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, dict):
        if not v:
            return "{}"
        return (
            "{ "
            + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items())
            + " }"
        )
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return _toml_value(str(v))


def _toml_devices(spec: tuple[DeviceConfig, ...] | str) -> str:
    if isinstance(spec, str):
        return _toml_value(spec)
    rows = []
    for d in spec:
        item: dict[str, Any] = {"name": d.name}
        if d.max_runtime:
            item["max_runtime"] = _duration_text(d.max_runtime)
        for key in ("on_acquire", "on_release"):
            if getattr(d, key):
                item[key] = getattr(d, key)
        if d.timeout > 0:
            item["timeout"] = _duration_text(d.timeout)
        if d.release_linger >= 0:
            item["release_linger"] = _duration_text(d.release_linger)
        if d.labels:
            item["labels"] = d.labels
        rows.append("  " + _toml_value(item) + ",")
    return "[\n" + "\n".join(rows) + "\n]"


def parse_bool_env(value: str | None) -> bool | None:
    """RC_REQUIRE_MANUAL_CLEAR: None/blank → None (unset); a boolean word → it;
    anything else → True (the cautious reading), with a warning."""
    if value is None or not value.strip():
        return None
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    print(
        f"rc worker: warning: RC_REQUIRE_MANUAL_CLEAR={value!r} is not a boolean; "
        "treating it as true",
        file=sys.stderr,
    )
    return True


_DURATIONS = {
    "heartbeat_interval",
    "poll_wait",
    "kill_grace",
    "reregister_after",
    "reregister_jitter",
    "probe_interval",
    "probe_timeout",
    "verify_timeout",
    "verify_pass_budget",
    "recheck_interval",
}
_STRINGS = {
    "job_path",
    "controller_url",
    "token",
    "token_file",
    "cacert",
    "host",
    "probe_dir",
    "verify_dir",
    "sheet_dir",
    "spool_dir",
    "cgroup_root",
    "kernel_log",
}
_BOOLS = {"require_manual_clear", "allow_root_jobs", "shared_account"}
_DEVICE_KEYS = {
    "name",
    "max_runtime",
    "on_acquire",
    "on_release",
    "timeout",
    "release_linger",
    "labels",
}


def load(
    path: str | None, overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> WorkerConfig:
    """Read `path` (None: /etc/rc/worker.toml if it exists), apply command-line
    `overrides` (keys as in the file) and the environment. Raises ConfigError."""
    env = os.environ if env is None else env
    where = path or DEFAULT_PATH
    data: dict[str, Any] = {}
    if path is not None or os.path.exists(DEFAULT_PATH):
        try:
            with open(where, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such file") from None
        except OSError as e:
            raise ConfigError(f"{where}: cannot read: {e.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: not valid TOML: {e}") from None
    kw = _parse(where, data)
    # Where token_file came from, for its errors: the flag, or the file's key.
    token_file_source = f"{where}: token_file"
    for key, value in (overrides or {}).items():
        if value is not None:
            kw.update(_parse("command line", {key: value}))
            if key == "token_file":
                token_file_source = "--token-file"
    cfg = WorkerConfig(**kw)
    if not cfg.token and cfg.token_file:
        named = f"{token_file_source} {cfg.token_file}"
        try:
            with open(cfg.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise ConfigError(f"{named}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{named}: not a token (not UTF-8 text)") from None
        if not token:
            raise ConfigError(
                f"{named}: the file is empty (it should hold the worker token, rc_...)"
            )
        cfg = dataclasses.replace(cfg, token=token)
    if not cfg.token and env.get("RC_TOKEN", "").strip():
        cfg = dataclasses.replace(cfg, token=env["RC_TOKEN"].strip())
    if parse_bool_env(env.get("RC_REQUIRE_MANUAL_CLEAR")):
        cfg = dataclasses.replace(cfg, require_manual_clear=True)
    return cfg


def _parse(where: str, data: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key in _DURATIONS:
            kw[key] = _duration(where, key, value)
        elif key in _STRINGS:
            kw[key] = _string(where, key, value)
            if key == "host" and kw[key] and not _valid_name(kw[key]):
                raise ConfigError(
                    f"{where}: host {kw[key]!r}: letters, digits, '.', '_', '-' only, at most 63"
                )
            if key == "controller_url" and kw[key]:
                try:
                    parse_controller_urls(kw[key])
                except RcError as e:
                    raise ConfigError(f"{where}: controller_url: {e}") from None
        elif key in _BOOLS:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} must be true or false")
            kw[key] = value
        elif key == "pass_env":
            kw[key] = _pass_env(where, value)
        elif key == "spool_max_bytes":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{where}: {key} must be a non-negative integer (bytes)")
            kw[key] = value
        elif key == "labels":
            kw[key] = _labels(where, key, value)
        elif key == "hooks":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: hooks must be a table {{ timeout, release_linger }}")
            for k, v in value.items():
                if k == "timeout":
                    kw["hook_timeout"] = _duration(where, "hooks.timeout", v)
                elif k == "release_linger":
                    kw["release_linger"] = _duration(where, "hooks.release_linger", v)
                else:
                    raise _unknown(where, f"hooks.{k}", k, ("timeout", "release_linger"))
        elif key == "devices":
            kw[key] = _devices(where, value)
        else:
            raise _unknown(where, key, key, _TOP_KEYS)
    return kw


_TOP_KEYS = (
    *sorted(_STRINGS | _DURATIONS),
    *sorted(_BOOLS),
    "pass_env",
    "spool_max_bytes",
    "labels",
    "hooks",
    "devices",
)


def _unknown(where: str, shown: str, key: str, known) -> ConfigError:
    """The error for an unknown key, naming the nearest known one (difflib)."""
    near = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"{where}: {shown} is not a known key{hint}")


def _valid_name(name: str) -> bool:
    """Host and device names: ASCII letters, digits, '.', '_', '-'; 1 to 63, not
    starting with a punctuation mark (the controller's rule)."""
    return (
        0 < len(name) <= 63
        and name[0].isascii()
        and name[0].isalnum()
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    )


def _duration(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ConfigError(f'{where}: {key} must be a duration such as "30s"')
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except DurationError as e:
            raise ConfigError(f"{where}: {key}: {e}") from None
    else:
        raise ConfigError(f'{where}: {key} must be a duration such as "30s"')
    if seconds < 0:
        raise ConfigError(f"{where}: {key} cannot be negative")
    return seconds


def _string(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string")
    return value.strip()


def _labels(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a table of strings")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, (int, float)):
            v = str(v)
        if not isinstance(v, str):
            raise ConfigError(f"{where}: {key}.{k} must be a string")
        out[str(k)] = v
    return out


def _pass_env(where: str, value: Any) -> tuple[str, ...]:
    """pass_env: a list of environment variable names (not RC_*: the
    worker's own settings never reach a job)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}: pass_env must be a list of names, e.g. ["LD_LIBRARY_PATH"]')
    for name in value:
        if (
            not name
            or not (name[0].isalpha() or name[0] == "_")
            or not all(c.isascii() and (c.isalnum() or c == "_") for c in name)
        ):
            raise ConfigError(f"{where}: pass_env: {name!r} is not a variable name")
        if name.startswith("RC_"):
            raise ConfigError(
                f"{where}: pass_env: {name!r}: RC_* settings of the worker never reach a job"
            )
    return tuple(value)


def _check_count(where: str, what: Any, n: int) -> None:
    if n > MAX_DEVICES:
        shown = what if isinstance(what, str) and what.startswith("a list") else repr(what)
        raise ConfigError(
            f"{where}: devices {shown}: {n} devices; a worker may declare at most "
            f"{MAX_DEVICES} (the controller's limit)"
        )


def _devices(where: str, value: Any) -> tuple[DeviceConfig, ...] | str:
    """devices: "auto", "cpu:N" (returned as that text), "NAME,NAME,..." or a
    list of names and tables (returned as DeviceConfigs, at most
    MAX_DEVICES). Raises ConfigError naming the bad entry."""
    if isinstance(value, str):
        value = _device_text(where, value)
        if isinstance(value, str):
            return value
    if not isinstance(value, list) or not value:
        raise ConfigError(f'{where}: devices must be "auto", "cpu:N" or a non-empty list')
    _check_count(where, f"a list of {len(value)}", len(value))
    out = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        out.append(_device(where, f"devices[{i}]", item, seen))
    return tuple(out)


def _device_text(where: str, value: str) -> str | list[str]:
    """devices given as text: "auto" or "cpu:N" (1 <= N <= MAX_DEVICES),
    returned stripped, or "NAME,NAME,...", returned as the list of names.
    Raises ConfigError."""
    spec = value.strip()
    if spec.startswith("cpu:") and not (spec[4:].isascii() and spec[4:].isdigit()):
        raise ConfigError(f"{where}: devices {value!r}: cpu:N takes N in digits 0-9")
    if spec.startswith("cpu:"):
        n = int(spec[4:])
        if n == 0:
            raise ConfigError(f"{where}: devices {value!r}: cpu:N needs N of at least 1")
        _check_count(where, value, n)
        return spec
    if spec == "auto":
        return spec
    names = [n.strip() for n in spec.split(",")]
    if not all(names):
        raise ConfigError(f"{where}: devices {value!r}: use auto, cpu:N or NAME,NAME,...")
    return names


def _device(where: str, at: str, item: Any, seen: set[str]) -> DeviceConfig:
    """One entry `at` ("devices[2]") of a devices list: a name, or a table
    of _DEVICE_KEYS with a name none before it in the list had (`seen`, the
    names so far; this one is added). Raises ConfigError."""
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: {at} must be a name or a table")
    for k in item:
        if k not in _DEVICE_KEYS:
            raise _unknown(where, f"{at}.{k}", k, sorted(_DEVICE_KEYS))
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: {at} needs a name")
    name = name.strip()
    if not _valid_name(name):
        raise ConfigError(f"{where}: {at}.name {name!r}: letters, digits, '.', '_', '-' only")
    if name in seen:
        raise ConfigError(f"{where}: {at}: device {name!r} is listed twice")
    seen.add(name)
    return DeviceConfig(name=name, **_device_settings(where, at, item))


def _device_settings(where: str, at: str, item: dict) -> dict[str, Any]:
    """The settings a device table `item` gives besides its name
    (max_runtime, on_acquire, on_release, timeout, release_linger, labels),
    as DeviceConfig's keyword arguments. Raises ConfigError."""
    kw: dict[str, Any] = {}
    if "max_runtime" in item:
        mr = _duration(where, f"{at}.max_runtime", item["max_runtime"])
        if 0 < mr < 1:
            raise ConfigError(f"{where}: {at}.max_runtime must be 0 (none) or at least 1s")
        if mr != int(mr):
            raise ConfigError(f"{where}: {at}.max_runtime must be whole seconds")
        kw["max_runtime"] = mr
    for hook in ("on_acquire", "on_release"):
        if hook in item:
            path = item[hook]
            if not isinstance(path, str) or not path.strip():
                raise ConfigError(f"{where}: {at}.{hook} is set but blank")
            kw[hook] = path.strip()
    if "timeout" in item:
        kw["timeout"] = _duration(where, f"{at}.timeout", item["timeout"])
    if "release_linger" in item:
        kw["release_linger"] = _duration(where, f"{at}.release_linger", item["release_linger"])
    if "labels" in item:
        kw["labels"] = _labels(where, f"{at}.labels", item["labels"])
    return kw
