"""Which filesystem a path lives on, from /proc/self/mounts (standard
library; `rc serve` and `rc doctor` use it to say that a state directory on
tmpfs loses every job at reboot)."""

from __future__ import annotations

import os

__all__ = ["VOLATILE", "filesystem_of", "volatile_warning"]

MOUNTS = "/proc/self/mounts"
VOLATILE = frozenset({"tmpfs", "ramfs", "devtmpfs"})
"""Filesystems whose contents a reboot (or an unmount) discards."""


def _unescape(field: str) -> str:
    """/proc/self/mounts writes a space as \\040, a tab \\011, a backslash \\134."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_of(path: str, mounts: str = MOUNTS) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding `path` (where it
    would be made, if it does not exist yet), e.g. ("/", "ext4"); ("", "")
    when `mounts` cannot be read."""
    p = os.path.realpath(path)  # a path not made yet is under the mount it would be made on
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "", ""
    best = ("", "")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = p == point or p.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):  # the last of equal points is the top one
            best = (point, parts[2])
    return best


def volatile_warning(path: str, what: str, mounts: str = MOUNTS) -> str:
    """A warning naming `path` (`what`: "the state directory") when it is on
    a filesystem a reboot empties, else ""."""
    point, fstype = filesystem_of(path, mounts)
    if fstype not in VOLATILE:
        return ""
    return (
        f"{what} {path} is on {fstype} ({point}): a reboot empties it and every job, "
        "log and token in it is gone; put it on a disk"
    )
