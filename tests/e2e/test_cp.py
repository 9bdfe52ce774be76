"""`rc cp`: byte-exact copies both ways, odd trees, and archives that would
escape their destination refused on both ends."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from rc.cli import archive
from tests.helpers.copying import (
    cp,
    fingerprint,
    fleet,  # noqa: F401 (fixtures)
    leftovers,
    make_tree,
    sha,
)
from tests.helpers.fleet import hold
from tests.helpers.harness import PY, SYSTEM_PY

# -- the archive, without processes -------------------------------------------------------


"""Run by SYSTEM_PY with the zipapp's path: a tree whose second file turns
unreadable after the scan, sent; the stream it made on stdout."""


# -- end to end ----------------------------------------------------------------------------


def test_a_200_mb_file_both_ways_through_a_job(fleet, tmp_path):
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        f.writelines(os.urandom(1 << 20) for _ in range(200))
    remote = tmp_path / "remote"
    remote.mkdir()
    res = cp(fleet.alice, str(src), f"box:cpu0:{remote}/")
    assert res.returncode == 0, res.stderr
    assert sha(remote / "big.bin") == sha(src)
    back = tmp_path / "back.bin"
    res = cp(fleet.alice, f"box:cpu0:{remote}/big.bin", str(back))
    assert res.returncode == 0, res.stderr
    assert sha(back) == sha(src)
    assert leftovers(remote) == [] and leftovers(tmp_path) == []


def test_an_odd_tree_both_ways_inside_a_hold(fleet, tmp_path):
    src = make_tree(tmp_path / "tree")
    held = hold(fleet.alice, "box:cpu1")
    (tmp_path / "remote").mkdir()
    try:
        res = cp(fleet.alice, "--hold", str(held), str(src), f"box:cpu1:{tmp_path}/remote/copy")
        assert res.returncode == 0, res.stderr
        assert fingerprint(tmp_path / "remote" / "copy") == fingerprint(src)
        (tmp_path / "local").mkdir()
        res = cp(fleet.alice, f"box:cpu1:{tmp_path}/remote/copy", str(tmp_path / "local"))
        assert res.returncode == 0, res.stderr
        assert b"inside your hold" in res.stderr  # found the caller's hold by itself
        assert fingerprint(tmp_path / "local" / "copy") == fingerprint(src)
        assert leftovers(tmp_path / "local") == [] and leftovers(tmp_path / "remote") == []
    finally:
        fleet.alice.run("release", str(held))


def test_a_remote_tree_with_an_escaping_symlink_is_refused_and_leaves_nothing(fleet, tmp_path):
    bad = tmp_path / "bad"
    (bad / "d").mkdir(parents=True)
    (bad / "d" / "f").write_text("x")
    os.symlink("/etc/passwd", bad / "d" / "passwd")
    dest = tmp_path / "dest"
    dest.mkdir()
    res = cp(fleet.alice, f"box:cpu0:{bad}", str(dest) + "/")
    assert res.returncode == 1
    assert b"refusing" in res.stderr and b"passwd" in res.stderr
    assert os.listdir(dest) == [], "a refused copy leaves neither the copy nor its temporary"


def test_remote_errors_are_shown(fleet, tmp_path):
    res = cp(fleet.alice, "box:cpu0:/no/such/thing", str(tmp_path) + "/")
    assert res.returncode == 1
    assert b"no such file or directory" in res.stderr
    (tmp_path / "taken" / "x").mkdir(parents=True)
    (tmp_path / "taken" / "x" / "keep").write_text("old")
    (tmp_path / "x").mkdir()
    res = cp(fleet.alice, str(tmp_path / "x"), f"box:cpu0:{tmp_path}/taken/")
    assert res.returncode == 1, res.stderr
    assert (
        f"{tmp_path}/taken/x is a directory that is not empty; rc cp never merges".encode()
        in res.stderr
    )  # the path once, without a doubled slash
    assert (tmp_path / "taken" / "x" / "keep").read_text() == "old"
    assert leftovers(tmp_path / "taken") == []
    # the same refusal, in the same words, on the way down
    (tmp_path / "src" / "x").mkdir(parents=True)
    res = cp(fleet.alice, f"box:cpu0:{tmp_path}/src/x", f"{tmp_path}/taken/")
    assert res.returncode == 1, res.stderr
    assert (
        f"{tmp_path}/taken/x is a directory that is not empty; rc cp never merges".encode()
        in res.stderr
    )
    assert (tmp_path / "taken" / "x" / "keep").read_text() == "old"
    assert leftovers(tmp_path / "taken") == []


def test_usage_errors_and_someone_elses_device(fleet, tmp_path):
    for args, what in [
        (("a", "b"), b"one side must be on a device"),
        (("box:cpu0:/a", "box:cpu1:/b"), b"only one side"),
        (("dgx:/x", "."), b"dgx:gpu0:/x"),
    ]:
        res = cp(fleet.alice, *args)
        assert res.returncode == 2 and what in res.stderr, res.stderr
    held = hold(fleet.bob, "box:cpu1")
    try:
        (tmp_path / "f").write_text("x")
        res = cp(fleet.alice, str(tmp_path / "f"), "box:cpu1:/tmp/")
        assert res.returncode == 1 and b"held by bob" in res.stderr
        res = cp(fleet.alice, "--hold", str(held), str(tmp_path / "f"), "box:cpu1:/tmp/")
        assert res.returncode == 1 and b"not_job_owner" in res.stderr
    finally:
        fleet.bob.run("release", str(held))


def test_a_missing_parent_directory_is_refused_both_ways(fleet, tmp_path):
    """Found by a new user: a typo in the destination of `rc cp` up silently
    created a nested directory (mkdir -p), and down into `DIR/` made DIR.
    Both ways now refuse, as scp does, naming the missing directory."""
    (tmp_path / "f").write_text("x")
    for dst, missing in [
        (f"{tmp_path}/tpyo/sub/f", f"{tmp_path}/tpyo/sub"),
        (f"{tmp_path}/tpyo/", f"{tmp_path}/tpyo"),
    ]:
        res = cp(fleet.alice, str(tmp_path / "f"), f"box:cpu0:{dst}")
        assert res.returncode == 1, res.stderr
        assert res.stderr.decode() == (
            f"rc: copy to box:cpu0 failed: rc cp: no such directory: {missing} "
            f"({archive.NO_PARENT})\n"
        )
        assert not (tmp_path / "tpyo").exists()
    res = cp(fleet.alice, str(tmp_path / "f"), f"box:cpu0:{tmp_path}/f/g")
    assert res.returncode == 1 and f"rc cp: {tmp_path}/f is not a directory".encode() in res.stderr
    # down: the same refusal, before anything is asked of the device
    for dst, missing in [
        (f"{tmp_path}/tpyo/sub/f", f"{tmp_path}/tpyo/sub"),
        (f"{tmp_path}/tpyo/", f"{tmp_path}/tpyo"),
    ]:
        res = cp(fleet.alice, f"box:cpu0:{tmp_path}/f", dst)
        assert res.returncode == 1, res.stderr
        assert res.stderr.decode() == (f"rc: no such directory: {missing} ({archive.NO_PARENT})\n")
        assert not (tmp_path / "tpyo").exists()
    # an existing directory, with or without the slash, is still "into it"
    (tmp_path / "into").mkdir()
    for dst in (f"{tmp_path}/into", f"{tmp_path}/into/"):
        assert cp(fleet.alice, str(tmp_path / "f"), f"box:cpu0:{dst}").returncode == 0
        assert (tmp_path / "into" / "f").read_text() == "x"
        (tmp_path / "into" / "f").unlink()
        assert cp(fleet.alice, f"box:cpu0:{tmp_path}/f", dst).returncode == 0
        assert (tmp_path / "into" / "f").read_text() == "x"
        (tmp_path / "into" / "f").unlink()


def test_a_download_refused_here_says_why_not_that_the_remote_was_stopped(fleet, tmp_path):
    """Found by a new user: when this side refused the archive (a symlink out
    of the tree), rc cp said only that the remote job was killed because the
    pipe closed; the reason it was refused here is what to show."""
    bad = tmp_path / "bad"
    bad.mkdir()
    os.symlink("/etc/passwd", bad / "passwd")
    # a file the remote tar is still reading when the refusal comes: it must
    # come after the link in directory order (tar's order), so try names
    for i in range(64):
        big = bad / f"big{i}"
        with open(big, "wb") as f:
            f.truncate(4 << 30)  # sparse: 4 GiB of zeros to read, nothing on disk
        order = os.listdir(bad)
        if order.index("passwd") < order.index(big.name):
            break
        big.unlink()
    else:
        pytest.fail(f"no name put a file after the link in directory order: {order}")
    dest = tmp_path / "dest"
    dest.mkdir()
    res = cp(fleet.alice, f"box:cpu0:{bad}", f"{dest}/")
    assert res.returncode == 1
    assert res.stderr.decode() == (
        "rc: copy from box:cpu0 refused: refusing 'bad/passwd': a symlink to "
        "'/etc/passwd', outside what is copied\n"
    )
    assert os.listdir(dest) == []


def test_a_download_this_side_cannot_receive_is_one_line_before_any_job(
    fleet, tmp_path, public_pyz
):
    """Found by a new user: `rc cp DEVICE:PATH ./` from a directory that was
    removed, or into one the caller may not write, started the copy job and
    then ended in a traceback (tempfile.mkdtemp), the job left killed. Both
    are one line now, and nothing is asked of the device."""
    before = len(fleet.ctl.client().get("/v1/jobs", params={"limit": 1000})["jobs"])
    gone = tmp_path / "gone"
    gone.mkdir()
    res = subprocess.run(
        ["sh", "-c", 'cd "$1" && rmdir "$1" && exec "$0" -m rc cp box:cpu0:/etc/hostname ./']
        + [PY, str(gone)],
        env=fleet.alice.env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (res.returncode, res.stderr) == (
        1,
        b"rc: the current directory no longer exists; cd somewhere and copy again\n",
    ), res
    if os.geteuid() == 0 and os.path.exists(SYSTEM_PY):  # root writes everywhere: as nobody
        shut = Path(tempfile.mkdtemp(prefix="rc-test-shut-", dir="/tmp"))  # reachable by nobody
        os.chmod(shut, 0o555)
        res = subprocess.run(
            [SYSTEM_PY, str(public_pyz), "cp", "box:cpu0:/etc/hostname", f"{shut}/"],
            env={**fleet.alice.env, "HOME": str(shut), "XDG_CONFIG_HOME": str(shut)},
            capture_output=True,
            timeout=60,
            check=False,
            cwd="/",
            user="nobody",
            group="nogroup",
        )
        assert (res.returncode, res.stderr) == (
            1,
            f"rc: cannot write to {shut}: Permission denied\n".encode(),
        ), res
        os.rmdir(shut)
    after = fleet.ctl.client().get("/v1/jobs", params={"limit": 1000})["jobs"]
    assert len(after) == before, "no copy job was started"
