"""The route table (rc.controller.api.routes) is the app and its document
(docs that cannot rot): the app serves exactly its routes, /openapi.json
describes exactly them, and what each entry declares holds together."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from openapi_spec_validator import validate

from rc.controller import openapi
from rc.controller.api.endpoint import USER, Endpoint
from rc.controller.api.routes import ROUTES
from rc.controller.app import build_app
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller
from rc.proto.errors import ErrorCode


def _app_routes() -> set[tuple[str, str]]:
    app = build_app(Controller(ControllerConfig(data_dir="/nonexistent")))
    return {(m, r.path) for r in app.app.routes for m in (r.methods or ()) if m != "HEAD"}


TABLE = [(e.method, e.path) for e in ROUTES]


def test_each_route_is_declared_once():
    assert len(TABLE) == len(set(TABLE))


def test_the_app_serves_exactly_the_route_table():
    assert _app_routes() == set(TABLE)


def test_the_document_describes_exactly_the_route_table():
    doc = openapi.document(ROUTES)
    described = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert described == set(TABLE)


def test_the_document_is_valid_openapi():
    validate(openapi.document(ROUTES))


def test_every_operation_documents_its_answers():
    doc = openapi.document(ROUTES)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert any(c.startswith("2") for c in codes), (method, path)
            if op["security"]:
                assert {"401", "403"} <= codes, (method, path)
            for code, resp in op["responses"].items():
                if code >= "400":
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/Error"


def test_the_session_route_documents_both_statuses_of_limit_exceeded():
    op = openapi.document(ROUTES)["paths"]["/v1/jobs/{job_id}/sessions"]["post"]
    assert "limit_exceeded" in op["responses"]["400"]["description"]
    assert "limit_exceeded" in op["responses"]["429"]["description"]


@pytest.mark.parametrize("e", ROUTES, ids=[f"{m} {p}" for m, p in TABLE])
def test_a_handler_decodes_a_json_body_exactly_when_the_table_declares_a_record(e):
    """json_body decodes into the table's `request`: a handler that calls it
    needs a record there, and a declared record needs a handler that reads it."""
    handler = e.handler if inspect.isfunction(e.handler) else type(e.handler)
    reads_json = "json_body(" in inspect.getsource(handler)
    assert reads_json == dataclasses.is_dataclass(e.request), e.request


def test_an_inconsistent_declaration_is_refused_at_import():
    async def handler(request):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(ValueError, match="never answered with 429"):
        Endpoint("GET", "/x", handler, USER, "x", errors=((429, ErrorCode.BAD_REQUEST),))
    with pytest.raises(ValueError, match="method"):
        Endpoint("PUT", "/x", handler, USER, "x")
    with pytest.raises(ValueError, match="public route"):
        Endpoint("GET", "/x", handler, None, "x", query_token=True)
