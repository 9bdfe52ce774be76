"""The remote half of `rc cp`: the commands it runs on the device, and the
label listings show for a copy job instead of them.

UPLOAD_SCRIPT and DOWNLOAD_SCRIPT are GNU tar inside `sh` (rc.cli.archive
makes and reads the tar streams at this end). A copy on a free device runs
as a short pipe job of one of these commands (upload_command,
download_command); the controller recognises them (copy_label) and gives the
job the label "rc cp SRC DST", built from the command's own arguments: a
job's reason is the client's free text, and it is shown beside the command,
never instead of it, so no client can dress a job up as a copy. The label
starts with COPY_LABEL_PREFIX, which only the controller sets (it drops a
client's reason that starts so), and that is what listings go by
(is_copy_label), as a listing's command is cut.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COPY_LABEL_PREFIX",
    "DOWNLOAD_SCRIPT",
    "LABEL_CHARS",
    "NO_PARENT",
    "UPLOAD_SCRIPT",
    "copy_label",
    "download_command",
    "is_copy_label",
    "upload_command",
]

COPY_LABEL_PREFIX = "rc cp"
"""How a copy job's label starts; a plain job's reason never does."""
LABEL_CHARS = 1000
"""Longest label of a copy job (characters; longer ones end in …)."""

NO_PARENT = "rc cp creates no directories, as scp does not; create it first"
"""The advice after a missing destination directory, on both ends (no quote in it)."""

# Remote commands. $1 is the remote path as given (relative: to $HOME). An
# interrupted copy (SIGTERM, SIGHUP) still removes its temporary directory.
UPLOAD_SCRIPT = (
    f"set -e\nNO_PARENT='{NO_PARENT}'\n"
    + r"""trap 'exit 129' HUP; trap 'exit 143' TERM; trap 'exit 130' INT
case $1 in /*) ;; *) cd -- "$HOME" 2>/dev/null || cd / ;; esac
if [ -d "$1" ] || [ "${1%/}" != "$1" ]; then dir=$1; final=$2
else dir=$(dirname -- "$1"); final=$(basename -- "$1"); fi
while [ "${dir%/}" != "$dir" ] && [ "${dir%/}" != "" ]; do dir=${dir%/}; done
if [ ! -d "$dir" ]; then
  case $dir in /*) shown=$dir ;; *) shown=$PWD/$dir ;; esac
  if [ -e "$dir" ]; then echo "rc cp: $shown is not a directory" >&2
  else echo "rc cp: no such directory: $shown ($NO_PARENT)" >&2; fi
  exit 1
fi
tmp=$(mktemp -d "$dir/.rc-cp.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
tar -x -p -B --no-same-owner -b 128 -f - -C "$tmp"
if [ -d "$dir/$final" ] && [ ! -L "$dir/$final" ] && [ -n "$(ls -A -- "$dir/$final")" ]; then
  echo "rc cp: $dir/$final is a directory that is not empty; rc cp never merges" \
       "into one (remove it, or copy to another name)" >&2
  exit 1
fi
mv -T -- "$tmp/$2" "$dir/$final"
"""
)
"""`sh -c UPLOAD_SCRIPT sh DEST NAME`: extract a tar of NAME from stdin and
place it at DEST (into DEST when it is a directory or ends with '/'). The
directory it lands in must exist: like scp, rc cp creates none (a typo in
DEST is an error naming the missing directory, not a new tree)."""

DOWNLOAD_SCRIPT = r"""set -e
case $1 in /*) ;; *) cd -- "$HOME" 2>/dev/null || cd / ;; esac
p=$1
while [ "${p%/}" != "$p" ] && [ "${p%/}" != "" ]; do p=${p%/}; done
if ! [ -e "$p" ] && ! [ -L "$p" ]; then
  a=$p  # missing, or behind a directory this user may not enter?
  while [ "$a" != / ] && [ "$a" != . ]; do a=$(dirname -- "$a"); [ -e "$a" ] && break; done
  if [ -d "$a" ] && ! [ -x "$a" ]; then echo "rc cp: $1: permission denied" >&2; exit 2; fi
  echo "rc cp: $1: no such file or directory" >&2; exit 2
fi
if [ -L "$p" ]; then p=$(readlink -f -- "$p"); fi
if ! [ -r "$p" ] || { [ -d "$p" ] && ! [ -x "$p" ]; }; then
  echo "rc cp: $1: permission denied" >&2; exit 2
fi
cd -- "$(dirname -- "$p")"
exec tar -c -f - --format=gnu -b 128 -- "$(basename -- "$p")"
"""
"""`sh -c DOWNLOAD_SCRIPT sh PATH`: PATH (a symlink given as PATH followed) as
a tar on stdout."""


def upload_command(dest: str, name: str, src: str) -> list[str]:
    """The command of a copy up: extract a tar of `name` into `dest` there
    (UPLOAD_SCRIPT); `src` is the source as the user wrote it, for the label
    only (the script ignores it)."""
    return ["sh", "-c", UPLOAD_SCRIPT, "sh", dest, name, src]


def download_command(path: str, dst: str) -> list[str]:
    """The command of a copy down: `path` there as a tar on stdout
    (DOWNLOAD_SCRIPT); `dst` is the destination as the user wrote it, for
    the label only (the script ignores it)."""
    return ["sh", "-c", DOWNLOAD_SCRIPT, "sh", path, dst]


def copy_label(command: Sequence[str], device: str) -> str:
    """ "rc cp SRC DST" (shell-quoted, the remote side as device:path) when
    `command` is exactly one of rc cp's remote commands on `device`, else "".
    A command of an older client without the label argument is recognised
    too (its local side shown as the copied name, or left out)."""
    argv = list(command)
    if argv[:4] == ["sh", "-c", UPLOAD_SCRIPT, "sh"] and len(argv) in (6, 7):
        dest, name = argv[4], argv[5]
        parts = [argv[6] if len(argv) == 7 else name, f"{device}:{dest}"]
    elif argv[:4] == ["sh", "-c", DOWNLOAD_SCRIPT, "sh"] and len(argv) in (5, 6):
        parts = [f"{device}:{argv[4]}", *argv[5:6]]
    else:
        return ""
    text = shlex.join(["rc", "cp", *parts])
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def is_copy_label(job: Mapping[str, Any]) -> bool:
    """Whether a job record (a Job or a DeviceView, as JSON) carries a copy
    job's label in `reason`: a job (not a hold), a pipe job where the record
    says (a DeviceView does not), whose reason starts with COPY_LABEL_PREFIX
    (only the controller makes one)."""
    if job.get("kind", "job") == "hold" or job.get("stdio", "pipe") != "pipe":
        return False
    return (job.get("reason") or "").startswith(COPY_LABEL_PREFIX + " ")
