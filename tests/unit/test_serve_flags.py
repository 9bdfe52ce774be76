"""`rc serve`'s flag defaults are the controller's config defaults.

The defaults are written in the flags (rc/cli, which ships in the zipapp and so
cannot import the controller), in ControllerConfig, in the flags' help text and
in the README; this test holds the first three together.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from rc.cli import build_parser
from rc.controller.config import ControllerConfig, Limits
from rc.proto.duration import format_duration

# flags whose value is not a ControllerConfig field of the same name
RENAMED = {
    "data": "data_dir",
    "log_cap": ("limits", "log_cap_bytes"),
    "hold_idle_timeout": ("limits", "hold_idle_timeout"),
    "hold_idle_timeout_max": ("limits", "hold_idle_timeout_max"),
    "hold_idle_timeout_min": ("limits", "hold_idle_timeout_min"),
    "hold_ttl_max": ("limits", "hold_ttl_max"),
    "max_queued_spec_bytes": ("limits", "queued_spec_bytes"),
}
NOT_CONFIG = {"verb", "handler", "usage_prog", "ready_fd", "rest"}


def _serve_actions() -> list[argparse.Action]:
    p = build_parser("serve")
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices["serve"]._actions if a.help and "(" in a.help]


def _config_default(dest: str):
    target = RENAMED.get(dest, dest)
    if isinstance(target, tuple):
        return getattr(Limits(), target[1])
    fields = {f.name: f for f in dataclasses.fields(ControllerConfig)}
    assert target in fields, f"--{dest.replace('_', '-')} has no ControllerConfig field"
    return fields[target].default


def test_every_serve_flag_default_is_the_config_default(monkeypatch):
    monkeypatch.delenv("RC_WEBHOOK_URL", raising=False)
    args = build_parser("serve").parse_args(["serve"])
    checked = 0
    for dest, value in vars(args).items():
        if dest in NOT_CONFIG:
            continue
        if dest == "data":  # the data dir has no config default: rc serve's is /var/lib/rc
            continue
        if dest == "socket":  # depends on the user and the data dir (rc.cli.serve.default_socket)
            assert value is None
            continue
        assert value == _config_default(dest), f"--{dest.replace('_', '-')}"
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize(
    "action",
    _serve_actions(),
    ids=lambda a: a.option_strings[-1] if a.option_strings else a.dest,
)
def test_defaults_named_in_help_are_the_real_ones(action):
    """A help text that names a default ("(default 10m)", "(5m)") names the
    flag's actual default, in the form people type it."""
    m = re.search(r"\((?:[^()]*; )?(?:default )?([0-9][0-9a-zA-Z. ]*)\)\s*$", action.help)
    if m is None or "%(default)s" in action.help:
        return
    said = m.group(1).strip()
    default = action.default
    if said.endswith("MiB"):
        assert int(said.split()[0]) << 20 == default
    else:
        assert said == format_duration(default) or said == str(default), (said, default)


@pytest.mark.parametrize("listen", ["127.0.0.1:８０", "127.0.0.1", "127.0.0.1:65536", "h:-1"])
def test_a_listen_address_needs_an_ascii_port(listen):
    """Found by a new user: `rc up --listen 127.0.0.1:８０` (full-width digits)
    served on port 80."""
    from rc.controller.serve import StartupError, parse_listen

    with pytest.raises(StartupError, match="must look like HOST:PORT"):
        parse_listen(listen)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
