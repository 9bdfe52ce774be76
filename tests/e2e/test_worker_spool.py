"""Logs across a controller outage: the controller is killed
while a job writes, the job keeps running and writing into the worker's disk
spool, the controller restarts on the same data dir and port, and the log is
complete and in order; when the spool fills, the loss is a marker in the log.
The spool itself, and the log sink's timers (batching, spilling a blocked
write) on a fake clock, without processes."""

from __future__ import annotations

import re

from tests.helpers.spool import (
    SPOOL_BYTES,
    expected,
    outage,
    site,  # noqa: F401 (fixtures)
)


def test_the_spool_carries_a_log_across_a_controller_outage(site, tmp_path):
    total = 3 << 20  # more than the worker keeps in memory, less than the spool
    assert outage(site, tmp_path, total) == expected(total)
    assert "waits in the disk spool" in site.box.log()
    assert list((site.root / "spool").iterdir()) == []  # nothing left behind


def test_a_full_spool_loses_output_and_says_how_much(site, tmp_path):
    total = 12 << 20
    want = expected(total)
    got = outage(site, tmp_path, total)
    m = re.search(
        rb"\n\[rc: (\d+) bytes of output lost here: the controller was unreachable "
        rb"and the worker's log spool was full\]\n",
        got,
    )
    assert m, got[-300:]
    kept = got[: m.start()]
    assert want.startswith(kept)  # in order, nothing invented
    assert len(kept) > SPOOL_BYTES - (64 << 10)  # the spool was used to the full
    assert len(kept) + int(m.group(1)) == len(want)  # every byte is accounted for
    assert got[m.end() :] == b""


# -- the log sink's timers, on a fake clock ----------------------------------------------
