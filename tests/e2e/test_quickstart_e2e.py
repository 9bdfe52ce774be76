"""The README's first command, as written, as root and as a normal user.

As rc-test-alice (a real Unix user) from her own copy of the source tree:
the README's venv and `pip install . && rc up -d && rc run -- ...` make a
single-user box whose jobs run as her, and another user's job is refused
with the words that say how a shared box is made. As root, the same command
makes a shared box. The dependencies are built into wheels once (as root)
and installed from there, so nothing is fetched while the test runs; the
one-box's port and host come from its data dir's up.json, as `rc down`
leaves them there (README "The one-box deployment").
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.harness import PY, REPO, RUNUSER, UserCli, base_env

ALICE, BOB = "rc-test-alice", "rc-test-bob"
SKIP = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", ".ruff_cache",
    "dist", "build", "*.egg-info",
)  # fmt: skip


def _readme_first_command() -> str:
    """The README's first command block (Try it), as one shell line."""
    text = (REPO / "README.md").read_text()
    block = text.split("From a clone, in a virtual environment", 1)[1].split("\n\n")[1]
    lines = textwrap.dedent(block).strip().splitlines()
    assert lines[0].startswith("python3 -m venv") and "rc up -d" in lines[1], lines
    return " && ".join(lines)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Iterator[Path]:
    """rc's dependencies (and the build backend) as wheels, in a directory
    every user may read."""
    where = Path(tempfile.mkdtemp(prefix="rc-wheels-", dir="/tmp"))
    src = tmp_path_factory.mktemp("wheel-src") / "rc"
    shutil.copytree(REPO, src, ignore=SKIP)
    for args in (
        ["wheel", "-q", "-w", str(where), str(src)],
        ["download", "-q", "-d", str(where), "setuptools>=68", "wheel"],
    ):
        done = subprocess.run(
            [PY, "-m", "pip", *args], capture_output=True, timeout=600, check=False
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    where.chmod(0o755)
    for p in where.iterdir():
        p.chmod(0o644)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _seed_up_json(data: Path, host: str) -> None:
    """What `rc down` leaves in a data dir: the port (any free one) and host."""
    data.mkdir(parents=True, mode=0o700, exist_ok=True)
    (data / "up.json").write_text(
        json.dumps({"listen": "127.0.0.1:0", "devices": "2", "host": host})
    )


def test_the_readme_first_command_as_a_normal_user_makes_a_single_user_box(
    unix_users, wheels, public_pyz
):
    entry = pwd.getpwnam(ALICE)
    top = Path(entry.pw_dir) / f"rc-quickstart-{uuid.uuid4().hex[:8]}"
    clone = top / "rc"
    shutil.copytree(REPO, clone, ignore=SKIP)
    host = f"alicebox-{uuid.uuid4().hex[:6]}"
    data = top / "share" / "rc"
    _seed_up_json(data, host)
    for path in [top, *top.rglob("*")]:
        os.lchown(path, entry.pw_uid, entry.pw_gid)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": entry.pw_dir,
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(top / "config"),
        "XDG_DATA_HOME": str(top / "share"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_QUIET": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }

    def as_alice(line: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [RUNUSER, "-u", ALICE, "--", "sh", "-c", line],
            env=env,
            cwd=clone,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    try:
        res = as_alice(_readme_first_command(), timeout=600)
        assert res.returncode == 0, res.stderr.decode(errors="replace")
        assert res.stdout.endswith(f"hello from {host}:cpu0\n".encode()), res.stdout
        assert (
            f"a single-user box: jobs run as {ALICE} only, and other users' jobs are refused "
            "(sudo rc up -d makes a box every local user can use)"
        ).encode() in res.stderr, res.stderr
        st = data.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (entry.pw_uid, 0o700)
        assert as_alice(". .venv/bin/activate && rc run -- id -un").stdout == f"{ALICE}\n".encode()
        # bob, with a token alice's admin made him, is refused by name
        url = json.loads((data / "up.json").read_text())["url"]
        admin = (data / "admin.token").read_text().strip()
        made = as_alice(f". .venv/bin/activate && RC_TOKEN={admin} rc token create {BOB}")
        assert made.returncode == 0, made.stderr
        bob = UserCli(
            BOB,
            public_pyz,
            {"RC_CONTROLLER": url, "RC_TOKEN": made.stdout.decode().strip()},
        )
        res = bob.run("run", "--", "id", "-un")
        assert res.returncode == 1
        assert res.stderr.decode().startswith(
            f"rc: no_matching_device: no device matching '*' runs jobs as {BOB}: {host} runs "
            f"jobs as {ALICE} only ("
        ), res.stderr
        assert b"sudo rc up -d" in res.stderr
    finally:
        as_alice(". .venv/bin/activate && rc down")
        shutil.rmtree(top, ignore_errors=True)


def test_the_readme_first_command_as_root_makes_a_shared_box(
    unix_users, wheels, public_pyz, tmp_path
):
    """As root (sudo rc up -d): root's own job runs as root, and every local
    user then runs rc with no token, as that user."""
    home = tmp_path / "home"
    home.mkdir()
    env = base_env(home)
    env.update(
        {
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels),
            "PIP_QUIET": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }
    )
    env.pop("PYTHONPATH", None)  # the installed rc, not this checkout
    env.pop("VIRTUAL_ENV", None)
    clone = tmp_path / "rc"
    shutil.copytree(REPO, clone, ignore=SKIP)
    host = f"rootbox-{uuid.uuid4().hex[:6]}"
    data = Path(env["XDG_DATA_HOME"]) / "rc"
    _seed_up_json(data, host)
    line = _readme_first_command()

    def sh(cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["sh", "-c", cmd], env=env, cwd=clone, capture_output=True, timeout=timeout, check=False
        )

    try:
        res = sh(line, timeout=600)
        assert res.returncode == 0, res.stderr.decode(errors="replace")
        assert res.stdout.endswith(f"hello from {host}:cpu0\n".encode()), res.stdout
        assert b"a shared box: every local user may run rc here with no token" in res.stderr
        assert sh(". .venv/bin/activate && rc run -- id -un").stdout == b"root\n"
        st = data.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
        # every local user finds the socket (RC_SOCKET stands for /run/rc/rc.sock)
        alice = UserCli(ALICE, public_pyz, {"RC_SOCKET": env["RC_SOCKET"]})
        res = alice.run("run", "--", "id", "-un")
        assert res.stdout == f"{ALICE}\n".encode(), res.stderr
    finally:
        sh(". .venv/bin/activate && rc down")
