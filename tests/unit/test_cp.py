"""`rc cp`: byte-exact copies both ways, odd trees, and archives that would
escape their destination refused on both ends."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rc.cli import archive
from tests.helpers.fleet import Fleet, running_fleet
from tests.helpers.harness import REPO, SYSTEM_PY, Cli

ODD_NAMES = ["with space", "ünïcödé", "new\nline", "-dash", "tab\there"]


def make_tree(root: Path) -> Path:
    """A tree with odd names, nested and empty directories, inner symlinks,
    a hard link and an executable."""
    root.mkdir(parents=True)
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    for i, name in enumerate(ODD_NAMES):
        (root / name).write_bytes(os.urandom(1000 + i))
        (root / "sub" / name).write_bytes(name.encode() * 3)
    (root / "sub" / "deeper" / "big").write_bytes(os.urandom(3 << 20))
    tool = root / "run.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o750)
    (root / "sub" / "private").write_text("x")
    (root / "sub" / "private").chmod(0o600)
    os.symlink("sub/deeper/big", root / "link to big")
    os.symlink("../with space", root / "sub" / "up-link")
    os.symlink("deeper", root / "sub" / "dirlink")
    os.link(root / "run.sh", root / "hard")
    return root


def fingerprint(root: Path) -> dict[str, tuple]:
    """Every entry: type, permission bits, link target or sha256."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            rel = str(p.relative_to(root))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = (
                    "file",
                    stat.S_IMODE(st.st_mode),
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                )
    return out


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# -- the archive, without processes -------------------------------------------------------


@pytest.fixture(params=["filters", "no-filters"])
def either_tarfile(request, monkeypatch) -> None:
    """Both ways receive() extracts: with tarfile's extraction filters, and
    member by member as on a Python before 3.11.4 (Debian 12's 3.11.2)."""
    if request.param == "no-filters":
        monkeypatch.setattr(archive, "HAS_FILTERS", False)


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


def _tar(*members: tuple[str, str, bytes | str]) -> io.BytesIO:
    """A tar of (kind, name, data or link target) members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for kind, name, data in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
                continue
            ti.type = {
                "sym": tarfile.SYMTYPE,
                "hard": tarfile.LNKTYPE,
                "dir": tarfile.DIRTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chr": tarfile.CHRTYPE,
            }[kind]
            ti.linkname = data if isinstance(data, str) else ""
            tar.addfile(ti)
    buf.seek(0)
    return buf


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


SEND_UNREADABLE = """
import io, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from rc.cli import archive
top = tempfile.mkdtemp(prefix="rc-test-send-")
tree = os.path.join(top, "tree")
os.mkdir(tree)
for name in ("a", "b"):
    with open(os.path.join(tree, name), "w") as f:
        f.write(name)
source = archive.scan(tree)
os.chmod(os.path.join(tree, "b"), 0)  # unreadable since the scan
out = io.BytesIO()
try:
    archive.send(source, out)
    print("no error", file=sys.stderr)
except PermissionError:
    sys.stdout.buffer.write(out.getvalue())
finally:
    os.chmod(os.path.join(tree, "b"), 0o600)
    for name in ("a", "b"):
        os.unlink(os.path.join(tree, name))
    os.rmdir(tree)
    os.rmdir(top)
"""
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


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("cp"), pyz) as f:
        yield f


def cp(cli: Cli, *args: str, timeout: float = 120):
    return cli.run("cp", *args, timeout=timeout)


def leftovers(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".rc-cp")]
