"""What a newcomer hit in `rc run` / `rc hold` and their options: repeated
-s, a hold on any device, -e NAME and --env-file,
Ctrl-C and SIGTERM on a running job, --kill-on-detach, stdin that is not
passed on. The e2e tests run a real controller and a worker from the zipapp
(devices box:cpu0 model=h100 vram=81920M, box:cpu1 model=a100 vram=40G)."""

from __future__ import annotations

import pytest

from rc.cli import build_parser
from rc.cli.context import UsageError
from rc.cli.follow import job_env, read_env_file
from rc.proto.selector import conjoin
from tests.helpers.fleet_users import admin, alice, bob, read_line, start_fleet  # noqa: F401  (fixtures)
from tests.helpers.run_options import fleet  # noqa: F401 (fixtures)

# -- repeated -s ---------------------------------------------------------------------


def test_conjoin_joins_terms_and_drops_any():
    assert conjoin(["model=h100", "vram>=80G"]) == "model=h100,vram>=80G"
    assert conjoin(["*", " model=h100 "]) == "model=h100"
    assert conjoin(["*", " * "]) == "*"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-s", "model=h100", "-s", "vram>=80G", "--", "true"],
        ["run", "--tty", "-s", "model=h100", "--select", "vram>=80G"],
        ["hold", "-s", "model=h100", "--selector", "vram>=80G", "--ttl", "1m", "--reason", "r"],
        ["devices", "-s", "model=h100", "-s", "vram>=80G"],
        ["explain", "-s", "model=h100", "-s", "vram>=80G"],
    ],
)
def test_a_second_s_is_anded_never_a_replacement(argv):
    """Report 2: `rc run -s model=h100 -s 'vram>=80G'` dropped the model."""
    args = build_parser(argv[0]).parse_args(argv)
    assert args.selector == "model=h100,vram>=80G"


@pytest.mark.parametrize("blank", [["-s", "", "-s", "a=1"], ["-s", "a=1", "-s", " "]])
def test_a_blank_s_among_several_is_kept_blank_for_the_command_to_refuse(blank):
    assert build_parser("devices").parse_args(["devices", *blank]).selector == ""


# -- rc hold on any device -------------------------------------------------------------


# -- the environment -----------------------------------------------------------------


def test_e_name_alone_passes_the_local_value(monkeypatch):
    """Report 6: `-e FOO` was a usage error; it now passes this machine's FOO."""
    monkeypatch.setenv("RC_TEST_FOO", "from here")
    monkeypatch.delenv("RC_TEST_UNSET", raising=False)
    assert job_env(["RC_TEST_FOO", "B=x=y", "C="]) == {
        "RC_TEST_FOO": "from here",
        "B": "x=y",
        "C": "",
    }
    with pytest.raises(UsageError, match="-e 'RC_TEST_UNSET': RC_TEST_UNSET is not set here"):
        job_env(["RC_TEST_UNSET"])


@pytest.mark.parametrize("item", ["A B=1", "1X=2", "=x", "A\nB=1", "É=1", "A-B=1", ""])
def test_e_refuses_a_name_a_shell_could_not_name(item):
    with pytest.raises(UsageError, match="is not a variable name"):
        job_env([item])


def test_env_file_lines_comments_and_precedence(tmp_path):
    first = tmp_path / "first.env"
    first.write_bytes(
        b'# a comment\n\nA=1\n  # an indented comment\nQUOTED="kept as is"\r\n'
        b"EMPTY=\nB=from-first\nEQ=a=b\n"
    )
    second = tmp_path / "second.env"
    second.write_text("B=from-second\nC=3")
    env = job_env(["C=from-e"], [str(first), str(second)])
    assert env == {
        "A": "1",
        "QUOTED": '"kept as is"',
        "EMPTY": "",
        "B": "from-second",  # a later file wins
        "EQ": "a=b",
        "C": "from-e",  # -e wins over every file
    }


@pytest.mark.parametrize(
    "text,words",
    [
        ("A=1\nNOEQUALS\n", ":2: 'NOEQUALS' is not NAME=VALUE"),
        ("A=1\n\n# c\nBAD NAME=1\n", ":4: 'BAD NAME' is not a variable name"),
        ("export A=1\n", ":1: 'export A' is not a variable name"),
        ("A=\0\n", ":1: the value of A contains a NUL character"),
    ],
)
def test_env_file_errors_name_the_file_and_line(tmp_path, text, words):
    path = tmp_path / "bad.env"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        read_env_file(str(path))
    assert str(e.value) == f"{path}{words}" or str(e.value).startswith(f"{path}{words}")


def test_env_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(UsageError, match=f"--env-file {tmp_path}/nope.env: cannot read it"):
        read_env_file(str(tmp_path / "nope.env"))
    (tmp_path / "latin1.env").write_bytes(b"A=1\nB=caf\xe9\n")
    with pytest.raises(UsageError, match="latin1.env:2: not UTF-8 text"):
        read_env_file(str(tmp_path / "latin1.env"))


# -- Ctrl-C, SIGTERM, SIGHUP on a running job ----------------------------------------------


# -- a controller that cannot be reached -------------------------------------------
