"""Hypothesis on the parsers that read outside input: TTY input frames, tar
members in `rc cp`, the worker's TOML config. (Selectors:
tests/unit/test_selector.py; durations and wire records: tests/unit/test_proto.py;
/proc and probe output: tests/worker/test_worker_procfs.py and
tests/worker/test_worker_probes.py.) Each either parses or raises its own error
type, and nothing lands outside a destination."""

from __future__ import annotations

import errno
import io
import os
import tarfile
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rc.cli.archive import ArchiveError, receive
from rc.proto.relay import MAX_FRAME_LINE, FrameDecoder, FrameError, data_frame, resize_frame
from rc.worker import config as worker_config

# -- TTY input frames ---------------------------------------------------------------


def _feed_in_chunks(data: bytes, cuts: list[int]) -> list[tuple]:
    dec = FrameDecoder()
    events, start = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts) + [len(data)]:
        events += dec.feed(data[start:cut])
        start = cut
    return events


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(0, 600), max_size=6))
def test_any_bytes_give_events_or_a_frame_error(data, cuts):
    try:
        for ev in _feed_in_chunks(data, cuts):
            assert ev[0] in ("d", "r")
    except FrameError:
        pass


frames = st.one_of(
    st.binary(max_size=200).map(lambda b: (("d", b), data_frame(b))),
    st.tuples(st.integers(0, 65535), st.integers(0, 65535)).map(
        lambda rc: (("r", rc[0], rc[1]), resize_frame(*rc))
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(frames, max_size=10), st.lists(st.integers(0, 5000), max_size=8))
def test_frames_round_trip_whatever_the_chunking(items, cuts):
    stream = b"".join(raw for _, raw in items)
    assert _feed_in_chunks(stream, cuts) == [ev for ev, _ in items]


def test_an_endless_line_is_refused():
    with pytest.raises(FrameError, match="longer than"):
        FrameDecoder().feed(b"x" * (MAX_FRAME_LINE + 1))


# -- tar members in rc cp ------------------------------------------------------------

names = st.lists(
    st.sampled_from(["a", "b", ".", "..", "/", " ", "\n", "\\", "é", "\x00"]), max_size=12
).map("".join)
member = st.tuples(st.sampled_from(["file", "dir", "symlink", "hardlink"]), names, names)


def _tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for kind, name, link in members:
            ti = tarfile.TarInfo(name.replace("\x00", "") or "x")
            if kind == "file":
                ti.size = 3
                tar.addfile(ti, io.BytesIO(b"abc"))
                continue
            ti.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
            }[kind]
            ti.linkname = link.replace("\x00", "")
            tar.addfile(ti)
    return buf.getvalue()


def _everything_under(root: str) -> set[str]:
    out = set()
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(member, min_size=1, max_size=5))
@example([("dir", "a", ""), ("symlink", "a", "a")])  # recursed without end in tarfile
@example([("symlink", "./é/.é//", "")])  # a link to nothing: tarfile recursed through itself
@example([("symlink", "a", "a//")])  # a link to itself
@example([("symlink", "a", "a//a")])  # a link through itself
def test_rc_cp_never_writes_outside_the_destination(members):
    with tempfile.TemporaryDirectory() as base:
        outside = os.path.join(base, "outside")
        dest = os.path.join(base, "dest")
        os.mkdir(outside)
        os.mkdir(dest)
        before = _everything_under(base)
        try:
            receive(io.BytesIO(_tar(members)), dest)
        except (ArchiveError, tarfile.TarError, OSError):
            pass
        after = _everything_under(base)
        new = {p for p in after - before}
        assert all(p == "dest" or p.startswith("dest" + os.sep) for p in new), new
        for p in new:
            full = os.path.join(base, p)
            if os.path.islink(full):
                try:
                    os.stat(full)
                except OSError as e:
                    if e.errno == errno.ELOOP:  # a loop points nowhere (realpath
                        continue  # makes up a path for one: "/a")
                target = os.path.realpath(full)
                assert target == os.path.realpath(dest) or target.startswith(
                    os.path.realpath(dest) + os.sep
                ), (p, target)


# -- the worker's TOML config --------------------------------------------------------

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(
    sorted(
        worker_config._DURATIONS
        | worker_config._STRINGS
        | {"devices", "labels", "hooks", "require_manual_clear", "spool_max_bytes", "bogus"}
    )
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=5))
def test_any_config_values_load_or_name_the_problem(data):
    data = {k: v for k, v in data.items() if v is not None}
    try:
        worker_config._parse("worker.toml", data)
    except worker_config.ConfigError as e:
        assert str(e).startswith("worker.toml: ")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_config_text_loads_or_names_the_problem(text):
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    try:
        worker_config.load(f.name, env={})
    except worker_config.ConfigError as e:
        assert f.name in str(e)
    finally:
        os.unlink(f.name)


def test_a_hard_link_to_a_missing_member_is_refused_not_a_crash(tmp_path):
    """Found by the property above: tarfile raised a bare KeyError."""
    with pytest.raises(ArchiveError, match="not in the archive"):
        receive(io.BytesIO(_tar([("dir", "a", ""), ("hardlink", "a/x", "a/y")])), str(tmp_path))


def test_a_member_given_twice_is_refused_not_a_recursion(tmp_path):
    """Found by the property above: a directory `a`, then a symlink `a` -> `a`,
    made tarfile recurse without end (RecursionError, a traceback)."""
    with pytest.raises(ArchiveError, match="holds it twice"):
        receive(io.BytesIO(_tar([("dir", "a", ""), ("symlink", "a", "a")])), str(tmp_path))
