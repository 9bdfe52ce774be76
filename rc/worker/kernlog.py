"""The kernel log's NVIDIA Xid events (README "GPU health").

Each health pass reads the Xid events the kernel logged since the last one:
from `/dev/kmsg` when it can be read (the worker key `kernel_log` names the
file), else from `dmesg`. The first read is the baseline: shown, never acted
on. The parser is a pure function over the text the kernel prints
(`parse_kernel_log`); `KernelLog` keeps the position between reads.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
from dataclasses import dataclass

from rc.worker import reaper

__all__ = [
    "KERNEL_LOG_CAP",
    "KernelLog",
    "XidEvent",
    "normal_pci",
    "parse_kernel_log",
]

log = logging.getLogger("rc.worker.health")

READ_BYTES = 16384
"""One read of the kernel log (a kmsg record is at most about 8 KiB)."""
KERNEL_LOG_CAP = 4 << 20
"""After the first read (the baseline, read whole), at most this many bytes
of the kernel log are read per pass; the rest waits for the next one."""
DMESG_TIMEOUT_S = 5.0


def normal_pci(bus_id: str) -> str:
    """A PCI address as "dddd:bb:dd" in lower case, from nvidia-smi's
    "00000000:3B:00.0" or the kernel's "0000:3b:00"; "" when it is neither."""
    m = re.fullmatch(
        r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", bus_id.strip()
    )
    if m is None:
        return ""
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One NVRM Xid line of the kernel log: `key` orders events (the kmsg
    sequence number, or dmesg's timestamp), `at` is seconds since boot,
    `pci` the GPU's address (normal_pci), `xid` the number, `text` the line."""

    key: float
    at: float
    pci: str
    xid: int
    text: str


_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")
_KMSG = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")
_DMESG = re.compile(r"(?:<\d+>)?\[\s*(\d+\.\d+)\]\s?(.*)")


def parse_kernel_log(text: str) -> list[XidEvent]:
    """The Xid events of kernel log text: /dev/kmsg records
    ("PRI,SEQ,USEC,FLAGS;MESSAGE", continuation lines ignored) or dmesg
    lines ("[  SECONDS] MESSAGE"). Other lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _KMSG.match(line)
        if m is not None:
            key, at, msg = float(m.group(2)), int(m.group(3)) / 1e6, m.group(4)
        else:
            d = _DMESG.match(line)
            if d is None:
                continue
            key = at = float(d.group(1))
            msg = d.group(2)
        x = _XID_LINE.search(msg)
        if x is None:
            continue
        out.append(XidEvent(key, at, normal_pci(x.group(1)), int(x.group(2)), msg.strip()))
    return out


class KernelLog:
    """Reads new Xid events from `path` (a kmsg-style device or file), else
    from `dmesg`. The first read is the baseline: its events are kept in
    `baseline` and not returned. `readable` is False while neither works."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.last: float | None = None
        self.baseline: list[XidEvent] = []
        self.readable = True
        self._warned = False
        self._fd: int | None = None
        self._partial = b""

    def _read_path(self) -> str:
        """What was logged since the last read: the file stays open, and a
        kmsg reader (or a file's offset) moves on from where it stopped, so
        nothing is read twice and a read of KERNEL_LOG_CAP bytes leaves the
        rest for the next one."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        chunks: list[bytes] = [self._partial]
        size = 0
        cap = KERNEL_LOG_CAP if self.last is not None else float("inf")  # the baseline: all
        while size < cap:
            try:
                b = os.read(self._fd, READ_BYTES)  # one kmsg record per read; a file in chunks
            except BlockingIOError:
                break  # kmsg: nothing more now
            except OSError as e:
                if e.errno == errno.EPIPE:  # kmsg: records overwritten under us
                    continue
                os.close(self._fd)
                self._fd = None
                raise
            if not b:
                break
            chunks.append(b)
            size += len(b)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1  # a file's line cut by the cap: the rest comes next time
        self._partial = data[end:]
        return data[:end].decode("utf-8", "replace")

    def _read_dmesg(self) -> str:
        with reaper.spawning():
            proc = subprocess.Popen(
                ["dmesg"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            reaper.track(proc.pid)
        try:
            try:
                out, _ = proc.communicate(timeout=DMESG_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise OSError("dmesg did not answer") from None
        finally:
            reaper.untrack(proc.pid)
        if proc.returncode != 0:
            raise OSError(f"dmesg exited {proc.returncode}")
        return out[-KERNEL_LOG_CAP:].decode("utf-8", "replace")

    def read(self) -> list[XidEvent]:
        """The Xid events logged since the last read ([] on the first)."""
        try:
            text = self._read_path()
        except OSError as e:
            try:
                text = self._read_dmesg()
            except OSError as e2:
                if not self._warned:
                    log.warning(
                        "cannot read Xid events: %s: %s; dmesg: %s",
                        self.path,
                        e.strerror or e,
                        e2,
                    )
                    self._warned = True
                self.readable = False
                return []
        self.readable = True
        events = parse_kernel_log(text)
        if self.last is None:
            self.baseline = events[-32:]
            self.last = max((e.key for e in events), default=-1.0)
            return []
        new = [e for e in events if e.key > self.last]
        if new:
            self.last = max(e.key for e in new)
        return new
