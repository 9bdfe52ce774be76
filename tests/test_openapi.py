"""The OpenAPI document describes the app exactly (docs that cannot rot)."""

from __future__ import annotations

from openapi_spec_validator import validate

from rc.controller import openapi
from rc.controller.app import build_app
from rc.controller.config import ControllerConfig
from rc.controller.core import Controller


def _app_routes() -> set[tuple[str, str]]:
    app = build_app(Controller(ControllerConfig(data_dir="/nonexistent")))
    return {(m, r.path) for r in app.app.routes for m in (r.methods or ()) if m != "HEAD"}


def test_every_route_is_documented_and_every_entry_is_a_route():
    assert _app_routes() - set(openapi.ROUTES) == set()
    assert set(openapi.ROUTES) - _app_routes() == set()


def test_the_document_is_valid_openapi():
    validate(openapi.document())


def test_every_operation_documents_its_answers():
    doc = openapi.document()
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
