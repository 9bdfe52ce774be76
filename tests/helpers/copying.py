"""What tests/e2e/test_cp.py and its fast-lane half
tests/unit/test_cp.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rc.cli import archive
from tests.helpers.fleet import Fleet, running_fleet
from tests.helpers.harness import Cli

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


@pytest.fixture(params=["filters", "no-filters"])
def either_tarfile(request, monkeypatch) -> None:
    """Both ways receive() extracts: with tarfile's extraction filters, and
    member by member as on a Python before 3.11.4 (Debian 12's 3.11.2)."""
    if request.param == "no-filters":
        monkeypatch.setattr(archive, "HAS_FILTERS", False)


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


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, pyz) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("cp"), pyz) as f:
        yield f


def cp(cli: Cli, *args: str, timeout: float = 120):
    return cli.run("cp", *args, timeout=timeout)


def leftovers(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".rc-cp")]
