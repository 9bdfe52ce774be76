"""The tar streams of `rc cp` and the remote commands at their other end.

Sending (`scan`, then `send`): one top-level entry, the source's own name; a
symlink given as the source is followed, every symlink inside the tree is
stored as a link and never followed, and a link inside the tree that points
outside it (absolute, or `..` past the top) is refused before anything is
sent. Owners are zeroed; permission bits are kept (setuid, setgid and sticky
bits are dropped); fifos, sockets and devices are skipped with a warning.
GNU format, so any file name (spaces, newlines, non-UTF-8 bytes) travels
byte for byte.

Receiving (`receive`): extraction into an empty directory, refusing
(ArchiveError) absolute names, `..` components, more than one top-level
entry, a name given twice, links (symbolic or hard) that point outside that
entry or to nothing, and special files; tarfile's `data` filter then runs as
well, with permission bits kept as sent.

The remote side is GNU tar inside `sh` (UPLOAD_SCRIPT, DOWNLOAD_SCRIPT, from
rc.proto.copyjob, where the controller recognises them too): it
refuses `..` members and never writes outside its target by itself. Both
ends extract into a temporary directory next to the destination and rename
into place at the end, so a partial copy never carries the final name. The
directory the copy lands in must exist on either end (as with scp).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from rc.proto.copyjob import DOWNLOAD_SCRIPT, NO_PARENT, UPLOAD_SCRIPT
from rc.proto.errors import RcError

__all__ = [
    "BROKEN_BLOCK",
    "BUFFER_BYTES",
    "DOWNLOAD_SCRIPT",
    "NO_PARENT",
    "UPLOAD_SCRIPT",
    "ArchiveError",
    "EmptyArchive",
    "Source",
    "receive",
    "scan",
    "send",
]

BUFFER_BYTES = 1 << 20
"""Chunk size of the tar stream in both directions."""
MODE_BITS = 0o777
"""Permission bits kept on both ends (no setuid, setgid, sticky)."""


class ArchiveError(RcError):
    """A source cannot be sent, or a received archive would write outside
    its destination; the message names the entry."""


class EmptyArchive(ArchiveError):
    """A received archive held nothing: the sender failed before its first
    entry (the far side's tar could not read it, say), so what to show is
    the sender's own error."""


BROKEN_BLOCK = b"rc cp: the sender failed here\n".ljust(512, b"\n")
"""What `send` writes after a source it could not read to the end: a block
no tar takes for a header, so the far side's tar fails (and its script
leaves nothing) instead of taking the entries before it for a whole copy.
An archive cut between entries is one GNU tar accepts, silently."""


@dataclass(slots=True)
class Source:
    """What `send` will send: `root` (the path read, the source's target if
    the source is a symlink), `name` (the top-level entry's name), the bytes
    and files in it, and the special files it skips."""

    root: str
    name: str
    total_bytes: int = 0
    files: int = 0
    skipped: list[str] = field(default_factory=list)


def _inside(top: str, member_dir: str, target: str) -> bool:
    """Whether link `target`, found in directory `member_dir` (both relative
    to the archive root), stays inside entry `top`."""
    if posixpath.isabs(target):
        return False
    resolved = posixpath.normpath(posixpath.join(member_dir, target))
    return resolved == top or resolved.startswith(top + "/")


def _resolved(name: str, target: str) -> str:
    """Where a symlink `name` (relative to the archive root) to `target` points, normalised."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(name), target))


def scan(src: str) -> Source:
    """Check a local source before anything is sent. Raises ArchiveError for
    a missing source or a symlink inside it that leads out of it."""
    try:
        st = os.stat(src)  # follows a symlink given as the source
    except OSError as e:
        raise ArchiveError(f"{src}: {e.strerror}") from None
    root = os.path.realpath(src) if os.path.islink(src) else src
    name = os.path.basename(os.path.normpath(src))
    if name in ("", ".", "..", "/"):
        name = os.path.basename(os.path.realpath(src))
    if not name:
        raise ArchiveError(f"{src}: cannot copy the root directory")
    out = Source(root, name)
    if stat.S_ISREG(st.st_mode):
        _readable(root)
        out.total_bytes, out.files = st.st_size, 1
        return out
    if not stat.S_ISDIR(st.st_mode):
        raise ArchiveError(f"{src}: rc cp copies files, directories and symlinks")
    for d, dirs, files in os.walk(root, onerror=_walk_error):
        rel_dir = posixpath.join(name, os.path.relpath(d, root).replace(os.sep, "/"))
        rel_dir = posixpath.normpath(rel_dir)
        for entry in sorted(dirs + files):
            path = os.path.join(d, entry)
            try:
                lst = os.lstat(path)
            except OSError as e:  # a directory we may list but not enter
                raise ArchiveError(f"cannot read {path}: {e.strerror}; nothing was sent") from None
            rel = posixpath.join(rel_dir, entry)
            if stat.S_ISLNK(lst.st_mode):
                target = os.readlink(path)
                if not _inside(name, rel_dir, target):
                    raise ArchiveError(
                        f"{rel!r} is a symlink to {target!r}, outside what is copied; rc cp "
                        "never follows links out of the tree (copy the target itself, or "
                        "remove the link)"
                    )
            elif stat.S_ISREG(lst.st_mode):
                _readable(path)
                out.total_bytes += lst.st_size
                out.files += 1
            elif not stat.S_ISDIR(lst.st_mode):
                out.skipped.append(rel)
    return out


def _walk_error(e: OSError) -> None:
    raise ArchiveError(f"cannot read {e.filename}: {e.strerror}; nothing was sent")


def _readable(path: str) -> None:
    """Raise ArchiveError naming `path` unless this process may open it for
    reading (opened and closed: the kernel's answer, ACLs included)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC))
    except OSError as e:
        raise ArchiveError(f"cannot read {path}: {e.strerror}; nothing was sent") from None


def _clean(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if not (ti.isreg() or ti.isdir() or ti.issym() or ti.islnk()):
        return None
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mode &= MODE_BITS
    return ti


def send(src: Source, out: BinaryIO) -> None:
    """Write `src` as a tar stream to `out` (anything with write()). When
    reading the source fails on the way (a file that changed since `scan`),
    the stream ends with BROKEN_BLOCK, so no tar takes it for a whole copy,
    and the OSError is raised."""
    try:
        with tarfile.open(
            fileobj=out,
            mode="w|",
            format=tarfile.GNU_FORMAT,
            bufsize=BUFFER_BYTES,
            copybufsize=BUFFER_BYTES,
        ) as tar:
            tar.add(src.root, arcname=src.name, recursive=True, filter=_clean)
    except OSError:
        # tarfile flushed what it had: whole entries, which GNU tar accepts
        # as a complete archive once the input ends
        with contextlib.suppress(Exception):
            out.write(BROKEN_BLOCK)
        raise


def _checker(state: dict) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
    def check(m: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
        name = m.name
        if name.startswith("/") or posixpath.isabs(name):
            raise ArchiveError(f"refusing {name!r}: an absolute path in the archive")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise ArchiveError(f"refusing {name!r}: it would land outside the destination")
        top = state.setdefault("top", parts[0])
        if parts[0] != top:
            raise ArchiveError(
                f"refusing {name!r}: the archive has more than one top-level "
                f"entry ({top!r} came first)"
            )
        clean_name = "/".join(parts)
        seen = state.setdefault("seen", set())
        if clean_name in seen:
            # a second member of one name would replace the first: tarfile
            # then resolves a symlink through itself (`a/` then `a` -> `a`
            # recursed without end); neither end ever sends one
            raise ArchiveError(f"refusing {name!r}: the archive holds it twice")
        seen.add(clean_name)
        if m.issym() and not m.linkname:
            # no system makes a link to nothing; tarfile, failing to, looked
            # for the link's target among the members and found the link itself
            raise ArchiveError(f"refusing {name!r}: a symlink to nothing")
        to = _resolved(clean_name, m.linkname) if m.issym() else ""
        if to == clean_name or to.startswith(clean_name + "/"):
            # a link to itself or through itself (`a` -> `a//`, `a` -> `a/b`)
            # is a loop that points nowhere
            raise ArchiveError(f"refusing {name!r}: a symlink to itself")
        if m.issym() and not _inside(top, posixpath.dirname(clean_name), m.linkname):
            raise ArchiveError(
                f"refusing {name!r}: a symlink to {m.linkname!r}, outside what is copied"
            )
        if m.islnk() and not _inside(top, "", m.linkname):
            raise ArchiveError(
                f"refusing {name!r}: a hard link to {m.linkname!r}, outside what is copied"
            )
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise ArchiveError(f"refusing {name!r}: a device, fifo or other special file")
        if not HAS_FILTERS:  # before 3.11.4: the checks above, then the same fields
            m.uid, m.gid, m.uname, m.gname = os.geteuid(), os.getegid(), "", ""
            if m.isreg() or m.isdir():
                m.mode &= MODE_BITS
            return m
        safe = tarfile.data_filter(m, dest)
        if m.isreg() or m.isdir():
            safe = safe.replace(mode=m.mode & MODE_BITS, deep=False)
        return safe

    return check


HAS_FILTERS = hasattr(tarfile, "data_filter")
"""Whether tarfile has extraction filters (Python 3.11.4 and later; Debian
12's python3 is 3.11.2): without them receive() applies its own checks
member by member."""


def _extract_each(tar: tarfile.TarFile, dest: str, check) -> None:
    """extractall(filter=check) for a Python without filters: each member
    checked then extracted in stream order, directories' modes set last
    (deepest first) so a read-only directory still takes its contents."""
    dirs = []
    for m in tar:
        safe = check(m, dest)
        tar.extract(safe, dest, set_attrs=not safe.isdir())
        if safe.isdir():
            dirs.append(safe)
    for d in sorted(dirs, key=lambda d: d.name, reverse=True):
        os.chmod(os.path.join(dest, d.name), d.mode)


def receive(stream: BinaryIO, dest: str) -> str:
    """Extract a tar stream (anything with read()) into the empty directory
    `dest`; returns its top-level entry's name. Raises ArchiveError for an
    entry that is refused and for an archive with nothing in it, and
    tarfile.TarError for a damaged one."""
    state: dict = {}
    with tarfile.open(
        fileobj=stream, mode="r|", bufsize=BUFFER_BYTES, copybufsize=BUFFER_BYTES
    ) as tar:
        try:
            if HAS_FILTERS:
                tar.extractall(dest, filter=_checker(state))
            else:
                _extract_each(tar, dest, _checker(state))
        except KeyError as e:  # tarfile: a link to a member the stream never held
            raise ArchiveError(
                f"refusing a link whose target is not in the archive ({e.args[0]})"
            ) from None
    if "top" not in state:
        raise EmptyArchive("the archive is empty")
    return state["top"]
