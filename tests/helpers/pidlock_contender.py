"""A process that takes and releases rc.proto.pidlock's lock ROUNDS times,
checking that nobody else is inside meanwhile: `python -c CONTENDER PATH
INSIDE ROUNDS` prints how many rounds it held the lock (tests/unit and
tests/e2e test_pidlock)."""

from __future__ import annotations

import textwrap

CONTENDER = textwrap.dedent("""
    import os, sys, time
    from rc.proto import pidlock
    path, inside, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    held = 0
    deadline = time.monotonic() + 60
    while held < rounds and time.monotonic() < deadline:
        try:
            fd = pidlock.take(path)
        except pidlock.LockBusy:
            continue
        # nobody else may be inside: the marker must not exist yet
        marker = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(marker)
        os.unlink(inside)
        pidlock.release(fd, path, remove=True)
        held += 1
    print(held)
""")
