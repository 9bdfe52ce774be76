"""What a newcomer hit in `rc run` / `rc hold` and their options (issue "What a
newcomer hit"): repeated -s, a hold on any device, -e NAME and --env-file,
Ctrl-C and SIGTERM on a running job, --kill-on-detach, stdin that is not
passed on. The e2e tests run a real controller and a worker from the zipapp
(devices box:cpu0 model=h100 vram=81920M, box:cpu1 model=a100 vram=40G)."""

from __future__ import annotations

import pytest

from rc.cli import build_parser
from rc.proto.selector import conjoin
from tests.harness import Cli, job
from tests.test_hold import admin, alice, bob, start_fleet  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz):
    tmp = tmp_path_factory.mktemp("runopts")
    ctl, w, env = start_fleet(tmp, pyz, [])
    yield (
        ctl,
        {name: Cli(ctl.url, ctl.token(name), env, tmp) for name in ("alice", "bob")},
        w.proc.pid,
    )
    w.stop()
    ctl.stop()


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


@pytest.mark.e2e
def test_every_selector_verb_ands_its_s_flags(alice, admin):
    res = alice.run("run", "-s", "model=a100", "-s", "vram>=80G", "--", "true")
    assert res.returncode == 1 and b"no_matching_device" in res.stderr, res.stderr
    res = alice.run(
        "run", "-s", "model=h100", "-s", "vram>=80G", "--", "sh", "-c", "echo $RC_DEVICE"
    )
    assert (res.returncode, res.stdout) == (0, b"box:cpu0\n"), res.stderr
    res = alice.run(
        "hold", "-s", "model=a100", "-s", "vram>=80G", "--ttl", "1m", "--reason", "r", "--detach"
    )
    assert res.returncode == 1 and b"no_matching_device" in res.stderr, res.stderr
    res = alice.run("devices", "-s", "model=a100", "-s", "vram>=40G")
    assert res.returncode == 0, res.stderr
    assert b"box:cpu1" in res.stdout and b"box:cpu0" not in res.stdout, res.stdout
    res = alice.run("devices", "-s", "model=a100", "-s", "")
    assert res.returncode == 2 and b"-s needs a selector" in res.stderr, res.stderr
    res = alice.run("explain", "-s", "model=h100", "-s", "vram<80G")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(b"selector: model=h100,vram<80G\nno device matches it")


# -- rc hold on any device -------------------------------------------------------------


@pytest.mark.e2e
def test_hold_without_a_target_takes_any_device(alice, admin):
    """Report 17: `rc hold` without -d/-s was a usage error; `rc run` takes any device."""
    res = alice.run("hold", "--ttl", "1m", "--reason", "a quick look", "--detach")
    assert res.returncode == 0, res.stderr
    h = job(admin, int(res.stdout))
    assert (h["kind"], h["selector"], h["state"]) == ("hold", "*", "running")
    assert h["device_id"] in ("box:cpu0", "box:cpu1")
