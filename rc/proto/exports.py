"""What of the submitting shell's environment a job takes (`--export`, as sbatch's).

Grammar of an export (`rc run --export`, `#SBATCH --export`, `rc serve
--export-default`), items separated by commas:

    ALL                 the submitting shell's environment (minus the deny list)
    NONE                nothing of it: the clean start (launch.clean_env on the worker)
    ALL,NAME=V,...      the shell's environment, and these values on top
    NAME,NAME=V,...     only these names of the shell (an unset one is skipped), and
                        these values (a list without ALL is NONE plus the names)

A value cannot hold a comma (as in sbatch): `-e NAME=V` can. `-e` values are
laid on top of whatever --export gave. README "Your environment in a job".

The deny list: what `ALL` never carries, because it belongs to rc
or to the submitting host's session, or looks like a secret:

- RESERVED: rc's own variables (`RC_*`: the client's RC_TOKEN and RC_URL, a
  submitting job's RC_JOB_ID...) and the device variables rc sets
  (CUDA_VISIBLE_DEVICES...). Nothing sends these, not even a name list: the
  worker sets them for the job.
- SESSION: the submitting session's own: its host, directory, terminal
  multiplexer, ssh agent, X display, D-Bus and Kerberos caches, loader hooks
  (LD_PRELOAD, LD_AUDIT: a library path of the submitting host), and the
  account variables HOME, USER, LOGNAME, SHELL (the worker sets those of the
  job's user on its host).
- secrets: a name one of whose '_'-separated words ends in TOKEN, SECRET,
  PASSWORD or PASSWD, or is KEY, APIKEY, CREDENTIAL(S) or COOKIE (HF_TOKEN,
  AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, PGPASSWORD; not
  TOKENIZERS_PARALLELISM).

A SESSION name or a secret travels only when named: `--export NAME` or `-e
NAME`. Standard library only (the CLI and the controller both use it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rc.proto.names import valid_env_name

__all__ = [
    "RESERVED_NAMES",
    "RESERVED_PREFIX",
    "SESSION_NAMES",
    "Export",
    "implicitly_denied",
    "looks_secret",
    "parse_export",
    "reserved",
    "taken",
]

RESERVED_PREFIX = "RC_"
"""rc's own variables: never exported (the worker sets the job's)."""
RESERVED_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)
"""The device variables: which GPUs a job sees is rc's to say."""
SESSION_NAMES = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "MAIL",
        "COLUMNS",
        "LINES",
        "TMUX",
        "TMUX_PANE",
        "STY",
        "WINDOWID",
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_CONNECTION",
        "SSH_CLIENT",
        "SSH_TTY",
        "DISPLAY",
        "XAUTHORITY",
        "WAYLAND_DISPLAY",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "DBUS_SESSION_BUS_ADDRESS",
        "KRB5CCNAME",
        "LD_PRELOAD",
        "LD_AUDIT",
    }
)
"""The submitting session's own variables: ALL leaves them out."""
_SECRET_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD")
_SECRET_WORDS = frozenset({"KEY", "APIKEY", "CREDENTIAL", "CREDENTIALS", "COOKIE"})


def reserved(name: str) -> bool:
    """Whether `name` is rc's own (RC_*) or a device variable (RESERVED_NAMES)."""
    return name.startswith(RESERVED_PREFIX) or name in RESERVED_NAMES


def looks_secret(name: str) -> bool:
    """Whether `name` looks like it holds a secret (the module's rule)."""
    for word in name.upper().split("_"):
        if word.endswith(_SECRET_ENDINGS) or word in _SECRET_WORDS:
            return True
    return False


def implicitly_denied(name: str) -> bool:
    """Whether ALL leaves `name` out: reserved, a session variable, a secret,
    or no variable name a job may set (an exported shell function,
    BASH_FUNC_f%%)."""
    return not valid_env_name(name) or reserved(name) or name in SESSION_NAMES or looks_secret(name)


@dataclass(frozen=True, slots=True)
class Export:
    """A parsed export: `all` (ALL given), the `names` listed, and the
    `values` given (NAME=V items, in order, a later one winning)."""

    all: bool
    names: tuple[str, ...] = ()
    values: dict[str, str] = field(default_factory=dict)

    @property
    def none(self) -> bool:
        """Whether nothing of the shell's environment is taken."""
        return not self.all and not self.names


def parse_export(text: str) -> Export:
    """Parse an export (the grammar above; ALL and NONE in any case).
    Raises ValueError naming the bad item: an empty item, ALL with NONE, a
    bad name, or a reserved one (rc sets those itself)."""
    items = [i.strip() for i in text.split(",")]
    if not text.strip() or any(not i for i in items):
        raise ValueError(f"{text!r}: an empty item (give ALL, NONE, or NAME[=VALUE] items)")
    keywords = {i.upper() for i in items if i.upper() in ("ALL", "NONE")}
    if len(keywords) > 1:
        raise ValueError(f"{text!r}: ALL and NONE do not go together")
    names: list[str] = []
    values: dict[str, str] = {}
    for item in items:
        if item.upper() in ("ALL", "NONE"):
            continue
        name, sep, value = item.partition("=")
        if not valid_env_name(name):
            raise ValueError(
                f"{item!r} is not NAME or NAME=VALUE (a name is letters, digits and '_', "
                "not starting with a digit)"
            )
        if reserved(name):
            raise ValueError(f"{name} is rc's to set (RC_* and the device variables never travel)")
        if sep:
            values[name] = value
        elif name not in names:
            names.append(name)
    return Export("ALL" in keywords, tuple(names), values)


def taken(export: Export, shell: Mapping[str, str]) -> dict[str, str]:
    """What a job takes of `shell` (the submitting shell's environment, or
    what of it a client sent) under `export`, its NAME=V values aside: all
    of it but the implicitly denied names when export.all, and with it (or
    alone) the listed names that are set there, reserved ones never."""
    out: dict[str, str] = {}
    if export.all:
        out = {k: v for k, v in shell.items() if not implicitly_denied(k) and "\0" not in v}
    for name in export.names:
        if name in shell and not reserved(name) and "\0" not in shell[name]:
            out[name] = shell[name]
    return out
