"""schemathesis against /openapi.json on a live controller: for every
operation, generated requests never get a 500, and every response matches
the document (status, content type, body schema).

Bounded for CI by RC_FUZZ_EXAMPLES (default 15 per operation). A long run:

    RC_FUZZ_EXAMPLES=2000 pytest tests/e2e/test_fuzz_api.py

Endless streams (the SSE feed and the relay halves) are left out; long-poll
waits are set to 0 and log reads do not follow, so every call returns.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from rc.controller.api.routes import ROUTES
from rc.proto.client import Client
from tests.helpers.harness import Controller, base_env

EXAMPLES = int(os.environ.get("RC_FUZZ_EXAMPLES", "15"))
BUSINESS_RULES = [checks.positive_data_acceptance, checks.negative_data_rejection]
"""A request that fits the schema may still be refused (an unknown device, a
selector matching nothing, a name already taken): those 4xx are the API
working, so only server errors and answers that do not match the document
fail the test."""
STREAMS = ("/v1/events/stream", "/tty/")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    ctl = Controller(tmp_path_factory.mktemp("data") / "d", base_env(home)).start()
    admin = ctl.client()
    token = admin.post("/v1/tokens", {"name": "fuzz-admin", "role": "admin"})["secret"]
    worker = admin.post("/v1/tokens", {"name": "fuzz-worker", "role": "worker"})["secret"]
    Client(ctl.url, worker).post(
        "/v1/workers/register",
        {
            "host": "fz",
            "devices": [{"name": "cpu0"}, {"name": "cpu1"}],
            "labels": {"cpu0": {"kind": "cpu"}, "cpu1": {"kind": "cpu"}},
        },
    )
    yield ctl, token
    admin.close_all()
    ctl.stop()


@pytest.fixture(scope="module")
def api(live):
    ctl, _ = live
    return schemathesis.openapi.from_url(f"{ctl.url}/openapi.json")


OPERATIONS = sorted((e.method, e.path) for e in ROUTES if not any(s in e.path for s in STREAMS))


@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_500_and_every_answer_matches_the_document(api, live, method, path):
    ctl, token = live
    op = api[path][method]

    @given(op.as_strategy())
    @settings(
        max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def check(case):
        names = {p.name for p in op.query}
        if "wait" in names:  # a long poll answers at once
            case.query = {**(case.query or {}), "wait": "0"}
        if path.endswith("/logs") and method == "GET":  # a snapshot, not a follow
            case.query = {**(case.query or {}), "follow": "0"}
        case.call_and_validate(
            base_url=ctl.url,
            headers={"Authorization": f"Bearer {token}"},
            excluded_checks=BUSINESS_RULES,
        )

    check()


def test_the_controller_logged_no_traceback(live):
    ctl, _ = live
    assert "Traceback" not in ctl.log()
