"""The pid-file lock (rc.proto.pidlock) that keeps one worker per host and one
controller per data dir: exclusive, and its file removed on a clean release
without ever letting two holders in."""

from __future__ import annotations

import fcntl
import os

import pytest

from rc.proto import pidlock


def test_release_with_remove_deletes_the_file_and_the_lock_can_be_taken_again(tmp_path):
    path = str(tmp_path / "h.lock")
    fd = pidlock.take(path)
    with pytest.raises(pidlock.LockBusy) as e:
        pidlock.take(path)
    assert e.value.pid == os.getpid()
    pidlock.release(fd, path, remove=True)
    assert not os.path.exists(path)
    fd = pidlock.take(path)
    pidlock.release(fd, path)  # without remove the file stays
    assert os.path.exists(path)


def test_a_taker_that_locked_a_removed_file_sees_it_is_not_the_lock(tmp_path):
    """The race removal opens: a taker opened the file, its holder removed it
    and let go, the taker's flock then succeeds on an orphan. take() sees the
    orphan for what it is (and starts over); so does release(), which never
    removes a file it did not lock."""
    path = str(tmp_path / "h.lock")
    fd = pidlock.take(path)
    early = os.open(path, os.O_RDWR)
    pidlock.release(fd, path, remove=True)
    fcntl.flock(early, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not pidlock._is_at(early, path)
    fresh = pidlock.take(path)  # the file anew, locked by its rightful holder
    assert pidlock._is_at(fresh, path)
    pidlock.release(early, path, remove=True)
    assert os.path.exists(path), "an orphan's release must not remove the live lock file"
    with pytest.raises(pidlock.LockBusy):
        pidlock.take(path)
    pidlock.release(fresh, path, remove=True)
