"""--export: what a job takes of the submitting shell's
environment, as the client sends it and as admission builds the job's env
(rc.proto.exports, rc.controller.environment, rc.cli.follow.export_fields).
Pure: the end-to-end half, with real users, is tests/e2e/test_daily_e2e.py."""

from __future__ import annotations

import argparse
import errno

import pytest

from rc.cli.follow import export_fields
from rc.controller.config import Limits
from rc.controller.environment import job_environment
from rc.controller.errors import Refused
from rc.proto import exports
from rc.proto.wire import SubmitRequest
from rc.worker.launch import cannot_start, cannot_start_line

SHELL = {
    "PATH": "/home/a/venv/bin:/usr/bin",
    "VIRTUAL_ENV": "/home/a/venv",
    "LD_LIBRARY_PATH": "/opt/cuda/lib64",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_TOKEN": "hf_x",
    "AWS_SECRET_ACCESS_KEY": "k",
    "WANDB_API_KEY": "w",
    "PGPASSWORD": "p",
    "RC_TOKEN": "rc-secret",
    "RC_JOB_ID": "4",
    "CUDA_VISIBLE_DEVICES": "7",
    "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    "LD_PRELOAD": "/usr/lib/libprof.so",
    "HOME": "/home/a",
    "PWD": "/home/a/src",
    "BASH_FUNC_module%%": "() { :; }",
}


def test_all_takes_the_shell_but_never_rc_devices_session_or_secrets():
    got = exports.taken(exports.parse_export("ALL"), SHELL)
    assert got == {
        "PATH": "/home/a/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/home/a/venv",
        "LD_LIBRARY_PATH": "/opt/cuda/lib64",
        "TOKENIZERS_PARALLELISM": "false",
    }


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SESSION_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("OPENAI_API_KEY", True),
        ("PGPASSWORD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD_LAYOUT", False),
        ("PATH", False),
    ],
)
def test_the_secret_rule_goes_by_words(name, secret):
    assert exports.looks_secret(name) is secret


def test_a_name_list_takes_only_those_and_sends_a_named_secret():
    export = exports.parse_export("PATH,HF_TOKEN,NOT_SET,SSH_AUTH_SOCK")
    assert not export.all and not export.none
    got = exports.taken(export, SHELL)
    assert got == {
        "PATH": SHELL["PATH"],
        "HF_TOKEN": "hf_x",
        "SSH_AUTH_SOCK": SHELL["SSH_AUTH_SOCK"],
    }


def test_all_with_values_and_none():
    export = exports.parse_export("all,A=1,B=x=y")
    assert export.all and export.values == {"A": "1", "B": "x=y"}
    assert exports.parse_export("NONE").none
    assert exports.taken(exports.parse_export("NONE"), SHELL) == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty item"),
        ("ALL,,A", "empty item"),
        ("ALL,NONE", "do not go together"),
        ("1A=2", "not NAME or NAME=VALUE"),
        ("RC_TOKEN", "rc's to set"),
        ("ALL,CUDA_VISIBLE_DEVICES=0", "rc's to set"),
    ],
)
def test_a_bad_export_is_named(text, words):
    with pytest.raises(ValueError, match=words):
        exports.parse_export(text)


def _req(**kw) -> SubmitRequest:
    return SubmitRequest(command=("true",), selector="*", **kw)


def test_admission_lays_values_then_e_over_the_shell():
    req = _req(
        export="ALL,MODE=export,LD_LIBRARY_PATH=/x",
        caller_env=SHELL,
        env={"MODE": "e", "HF_TOKEN": "given"},
    )
    env = job_environment(req, Limits())
    assert env["MODE"] == "e" and env["LD_LIBRARY_PATH"] == "/x"
    assert env["HF_TOKEN"] == "given" and env["PATH"] == SHELL["PATH"]
    assert "RC_TOKEN" not in env and "CUDA_VISIBLE_DEVICES" not in env


def test_admission_takes_the_controller_default_and_none_under_as():
    req = _req(caller_env={"PATH": "/v/bin"}, env={"A": "1"})
    assert job_environment(req, Limits()) == {"PATH": "/v/bin", "A": "1"}
    assert job_environment(req, Limits(), "NONE") == {"A": "1"}
    assert job_environment(_req(caller_env={"PATH": "/v"}, as_user="bob"), Limits()) == {}


def test_admission_drops_reserved_names_a_client_sends():
    """A client that sends RC_* in caller_env gets them dropped, not stored."""
    env = job_environment(_req(export="ALL", caller_env={"RC_TOKEN": "t", "X": "1"}), Limits())
    assert env == {"X": "1"}


def test_an_environment_over_the_limit_says_how_to_send_less():
    big = {f"V{i}": "x" for i in range(20)}
    with pytest.raises(Refused, match="--export NONE"):
        job_environment(_req(caller_env=big), Limits(env_items=10))
    with pytest.raises(Refused, match="export 'NOPE=1,,'"):
        job_environment(_req(export="NOPE=1,,"), Limits())


def test_the_client_sends_the_shell_and_says_what_secrets_stay_home(capsys):
    args = argparse.Namespace(export=None, as_user="")
    fields = export_fields(args, SHELL)
    assert "export" not in fields and fields["caller_env"]["VIRTUAL_ENV"] == "/home/a/venv"
    said = capsys.readouterr().err
    assert "HF_TOKEN" in said and "WANDB_API_KEY" in said and "RC_TOKEN" not in said
    assert export_fields(argparse.Namespace(export=None, as_user="bob"), SHELL) == {}
    named = export_fields(argparse.Namespace(export="PATH", as_user=""), SHELL)
    assert named == {"caller_env": {"PATH": SHELL["PATH"]}, "export": "PATH"}


def test_a_program_not_found_names_the_path_it_was_looked_up_on():
    e = FileNotFoundError(errno.ENOENT, "No such file or directory")
    line = cannot_start_line("python", e, "/usr/bin:/bin")
    assert b"not found on the job's PATH=/usr/bin:/bin" in line
    assert "PATH=/usr/bin:/bin" in cannot_start(e, "python", "/usr/bin:/bin").reason
    assert b"PATH" not in cannot_start_line("./x", e, "/usr/bin")  # a path is not looked up
