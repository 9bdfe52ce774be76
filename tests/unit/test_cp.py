"""`rc cp`: byte-exact copies both ways, odd trees, and archives that would
escape their destination refused on both ends."""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from rc.cli import archive
from tests.helpers.copying import (
    SEND_UNREADABLE,
    _tar,
    either_tarfile,  # noqa: F401 (fixtures)
    fingerprint,
    make_tree,
)
from tests.helpers.harness import REPO, SYSTEM_PY

# -- the archive, without processes -------------------------------------------------------


def test_tree_round_trips_through_the_archive(tmp_path, either_tarfile):
    src = make_tree(tmp_path / "tree")
    buf = io.BytesIO()
    archive.send(archive.scan(str(src)), buf)
    buf.seek(0)
    (tmp_path / "out").mkdir()
    assert archive.receive(buf, str(tmp_path / "out")) == "tree"
    assert fingerprint(tmp_path / "out" / "tree") == fingerprint(src)


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside", "../sub/../../x"])
def test_sending_a_tree_with_an_escaping_symlink_is_refused(tmp_path, target):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    os.symlink(target, src / "sub" / "bad")
    with pytest.raises(archive.ArchiveError, match="outside what is copied"):
        archive.scan(str(src))


@pytest.mark.parametrize(
    "members,why",
    [
        ([("file", "../evil", b"x")], "outside the destination"),
        ([("dir", "t", ""), ("file", "t/../../evil", b"x")], "outside the destination"),
        ([("file", "/etc/evil", b"x")], "absolute path"),
        ([("dir", "t", ""), ("sym", "t/l", "/etc")], "outside what is copied"),
        (
            [("dir", "t", ""), ("sym", "t/l", "../.."), ("file", "t/l/evil", b"x")],
            "outside what is copied",
        ),
        ([("dir", "t", ""), ("sym", "t/l", "../t2")], "outside what is copied"),
        ([("dir", "t", ""), ("hard", "t/h", "etc/passwd")], "outside what is copied"),
        ([("dir", "t", ""), ("fifo", "t/f", "")], "special file"),
        ([("dir", "t", ""), ("chr", "t/c", "")], "special file"),
        ([("file", "a", b"1"), ("file", "b", b"2")], "more than one top-level"),
    ],
)
def test_escaping_archives_are_refused(tmp_path, members, why, either_tarfile):
    dest = tmp_path / "dest" / "inner"
    dest.mkdir(parents=True)
    with pytest.raises(archive.ArchiveError, match=why):
        archive.receive(_tar(*members), str(dest))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "dest" / "evil").exists()


def test_a_python_before_extraction_filters_receives_a_tree(tmp_path):
    """The download side on the system's own python3 (3.11.2 on Debian 12,
    which has no tarfile filters): `rc cp` from a device said the archive
    was damaged (extractall() got an unexpected keyword argument 'filter')."""
    system_py = "/usr/bin/python3"
    if not os.path.exists(system_py):
        pytest.skip(f"no {system_py} on this machine")
    src = make_tree(tmp_path / "tree")
    buf = io.BytesIO()
    archive.send(archive.scan(str(src)), buf)
    (tmp_path / "out").mkdir()
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from rc.cli import archive; "
        "print(archive.HAS_FILTERS, archive.receive(sys.stdin.buffer, sys.argv[1]))"
    )
    got = subprocess.run(
        [system_py, "-I", "-c", code, str(tmp_path / "out")],
        input=buf.getvalue(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout.decode().split()[1] == "tree"
    assert fingerprint(tmp_path / "out" / "tree") == fingerprint(src)


"""Run by SYSTEM_PY with the zipapp's path: a tree whose second file turns
unreadable after the scan, sent; the stream it made on stdout."""


def test_a_source_that_fails_midway_leaves_nothing_at_the_far_end(tmp_path, public_pyz):
    """The trial: a file that could not be read stopped tarfile between two
    entries, and GNU tar took the cut stream for a whole archive: the far
    side put the entries before it under the final name. The stream now ends
    with a block no tar takes (archive.BROKEN_BLOCK), so the remote script
    fails and leaves nothing. The sender runs as nobody when the tests run as
    root (root reads every file); a file unreadable from the start is refused
    by the scan itself (tests/e2e/test_identity_e2e.py)."""
    if not os.path.exists(SYSTEM_PY):
        pytest.skip(f"needs {SYSTEM_PY}, an interpreter every user may run")
    who = {"user": "nobody", "group": "nogroup"} if os.geteuid() == 0 else {}
    sent = subprocess.run(
        [SYSTEM_PY, "-I", "-c", SEND_UNREADABLE, str(public_pyz)],
        capture_output=True,
        timeout=60,
        check=False,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"},
        **who,
    )
    assert sent.returncode == 0 and sent.stdout, sent
    assert sent.stdout.endswith(archive.BROKEN_BLOCK)
    dest = tmp_path / "dest"
    dest.mkdir()
    done = subprocess.run(
        ["sh", "-c", archive.UPLOAD_SCRIPT, "sh", f"{dest}/", "tree"],
        input=sent.stdout,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0, done
    assert os.listdir(dest) == [], "nothing under the final name, no temporary"


# -- end to end ----------------------------------------------------------------------------
