"""rc.api without a controller: answers of a newer controller decode (unknown
fields dropped at every depth), bad arguments are refused before sending."""

from __future__ import annotations

import pytest

import rc.api
from rc.proto import wire
from rc.proto.codec import encode
from rc.proto.errors import WireError
from rc.proto.model import Job, JobKind, JobState


def _view() -> dict:
    job = Job(id=7, kind=JobKind.JOB, state=JobState.RUNNING, submitter="alice")
    return encode(wire.JobView(job=job, queue_position=0, detail=wire.JobDetail(log_bytes=3)))


def test_a_newer_controllers_fields_are_dropped_at_every_depth():
    data = _view()
    data["new_top"] = 1
    data["job"]["gpu_memory_bytes"] = 123
    data["detail"]["something_new"] = {"x": 1}
    view = rc.api._record(wire.JobView, data)
    assert view.job.id == 7 and view.detail.log_bytes == 3


def test_a_wrong_type_is_still_refused():
    data = _view()
    data["job"]["id"] = "seven"
    with pytest.raises(WireError, match="Job.*id"):
        rc.api._record(wire.JobView, data)


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"selector": " "}, "non-blank"),
        ({"count": 0}, "count"),
        ({"device": ["b:c", "b:d"], "count": 3}, "count 3"),
        ({"env": {"A": 1}}, "string"),
    ],
)
def test_bad_submit_arguments_are_refused_before_sending(kw, why):
    conn = rc.api.Connection(client=None)  # nothing is sent: a refusal comes first
    with pytest.raises(rc.api.BadArgument, match=why):
        conn.submit(["true"], **kw)
