"""Operator mistakes get one line, not a traceback or a silently broken
controller: two `rc serve` on one data dir, the last admin token revoked,
numeric `rc serve` options out of range."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.harness import Controller


def _serve(env, data, *flags, timeout: float = 60):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rc",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(data),
            *flags,
        ],
        env=env,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_second_serve_on_the_same_data_dir_is_refused(tmp_path, env):
    data = tmp_path / "data"
    ctl = Controller(data, env).start()
    try:
        state = (data / "controller.json").read_text()
        res = _serve(env, data)
        assert res.returncode != 0
        lines = res.stderr.decode().strip().splitlines()
        want = f"rc serve: data dir {data} is in use by another rc serve (pid {ctl.proc.pid})"
        assert lines == [want], lines
        # the first controller is untouched: its state file and its API
        assert (data / "controller.json").read_text() == state
        assert ctl.client().get("/v1/whoami")
    finally:
        ctl.stop()
    # once the first has stopped, the data dir is free again
    again = Controller(data, env).start()
    again.stop()


def test_the_last_admin_token_cannot_be_revoked(tmp_path, env):
    from tests.helpers.harness import Cli

    ctl = Controller(tmp_path / "data", env).start()
    try:
        admin = ctl.client()
        names = [t["name"] for t in admin.get("/v1/tokens")["tokens"] if t["role"] == "admin"]
        assert len(names) == 1
        first = names[0]
        cli = Cli(ctl.url, ctl.admin_token, env, tmp_path)
        res = cli.run("token", "revoke", first)
        assert res.returncode == 1
        lines = res.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rc: last_admin_token: "), lines
        assert first in lines[0]
        # still an admin: the refusal changed nothing
        assert admin.get("/v1/tokens")["tokens"]
        # with a second admin token the first can go; then the second is the last
        second = ctl.token("admin2", role="admin")
        Cli(ctl.url, second, env, tmp_path).run("token", "revoke", first, check=True)
        res = Cli(ctl.url, second, env, tmp_path).run("token", "revoke", "admin2")
        assert res.returncode == 1 and b"last_admin_token" in res.stderr
        # user tokens are revoked as before
        ctl.client(second).post("/v1/tokens", {"name": "u", "role": "user"})
        Cli(ctl.url, second, env, tmp_path).run("token", "revoke", "u", check=True)
    finally:
        ctl.stop()


BAD_SERVE_VALUES = [
    ("--sweep-interval", "0"),
    ("--sweep-interval", "-1s"),
    ("--sweep-interval", "2h"),
    ("--heartbeat-interval", "0"),
    ("--heartbeat-interval", "0s"),
    ("--log-cap", "-1"),
    ("--log-cap", "0"),
    ("--log-cap", "12x"),
    ("--aging", "-5m"),
    ("--aging", "400d"),
    ("--max-devices-per-user", "-1"),
    ("--unknown-after", "0"),
    ("--lost-after", "0"),
    ("--startup-grace", "-1s"),
    ("--lease-renewal", "0"),
    ("--flap-limit", "0"),
    ("--flap-limit", "-3"),
    ("--flap-window", "0"),
    ("--lease-default", "0"),
    ("--lease-grace", "0"),
]


@pytest.mark.parametrize(
    "flag,value", BAD_SERVE_VALUES, ids=[f"{f}={v}" for f, v in BAD_SERVE_VALUES]
)
def test_serve_numeric_options_are_range_checked(tmp_path, env, flag, value):
    res = _serve(env, tmp_path / "d", f"{flag}={value}", timeout=30)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rc serve: ") and flag in lines[0], lines
    assert "Traceback" not in lines[0]
    assert "allowed" in lines[0], lines
    assert not (tmp_path / "d").exists()  # refused at argument parsing, before anything


def test_serve_numeric_options_accept_their_documented_values():
    from rc.cli import build_parser

    args = build_parser().parse_args(
        [
            "serve",
            "--aging",
            "0",
            "--max-devices-per-user",
            "0",
            "--startup-grace",
            "0",
            "--sweep-interval",
            "0.05s",
            "--heartbeat-interval",
            "1s",
            "--log-cap",
            str(8 << 20),
            "--flap-limit",
            "3",
            "--lost-after",
            "30s",
        ]
    )
    assert (args.aging, args.max_devices_per_user, args.startup_grace) == (0, 0, 0)
    assert args.sweep_interval == 0.05 and args.log_cap == 8 << 20
    defaults = build_parser().parse_args(["serve"])
    assert defaults.sweep_interval == 10.0 and defaults.log_cap == 256 << 20
