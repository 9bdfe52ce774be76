"""The OpenAPI document served at GET /openapi.json.

Written from the route table (rc.controller.api.routes.ROUTES), the same
table the app's routes and role checks are built from: who may call each
route, what it takes and returns (rc.proto.wire records, turned into JSON
Schema here), and the errors it answers with, each with its status from
rc.proto.errors.STATUS. So the document cannot drift from the code;
tests/e2e/test_fuzz_api.py (schemathesis) checks the live controller against it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rc import __version__
from rc.proto import model, wire
from rc.proto.errors import STATUS, ErrorCode

if TYPE_CHECKING:
    from rc.controller.api.endpoint import Endpoint

__all__ = ["document", "schema_for"]


# -- JSON Schema of the wire records ---------------------------------------------


def schema_for(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of an annotation; dataclasses go into `components`."""
    if dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # recursion guard
            hints = typing.get_type_hints(tp)
            props, required = {}, []
            for f in dataclasses.fields(tp):
                props[f.name] = schema_for(hints[f.name], components)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
            body: dict[str, Any] = {
                "type": "object",
                "properties": props,
                "additionalProperties": False,
            }
            if required:
                body["required"] = required
            if tp.__doc__:
                body["description"] = " ".join(tp.__doc__.split())
            components[name] = body
        return {"$ref": f"#/components/schemas/{name}"}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [schema_for(a, components) for a in args if a is not type(None)]
        out = inner[0] if len(inner) == 1 else {"anyOf": inner}
        if type(None) in args:
            return {"anyOf": [out, {"type": "null"}]}
        return out
    if origin is tuple:
        return {"type": "array", "items": schema_for(typing.get_args(tp)[0], components)}
    if origin is dict:
        return {
            "type": "object",
            "additionalProperties": schema_for(typing.get_args(tp)[1], components),
        }
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    return {
        str: {"type": "string"},
        int: {"type": "integer"},
        float: {"type": "number"},
        bool: {"type": "boolean"},
        Any: {},
    }[tp]


_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string", "enum": [c.value for c in ErrorCode]},
        "message": {"type": "string"},
    },
    "required": ["error", "message"],
    "additionalProperties": False,
}


def _content(kind: Any, components: dict[str, Any]) -> dict[str, Any]:
    if kind == "bytes":
        return {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    if kind == "text":
        return {"text/plain": {"schema": {"type": "string"}}}
    if kind == "svg":
        return {"image/svg+xml": {"schema": {"type": "string"}}}
    if kind == "html":
        return {"text/html": {"schema": {"type": "string"}}}
    if kind == "sse":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    if kind == "json":
        return {"application/json": {"schema": {"type": "object"}}}
    return {"application/json": {"schema": schema_for(kind, components)}}


def document(routes: Iterable[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes` (the route table)."""
    components: dict[str, Any] = {"Error": _ERROR}
    for cls in (model.Job, model.Device):
        schema_for(cls, components)
    paths: dict[str, Any] = {}
    for doc in sorted(routes, key=lambda e: (e.method, e.path)):
        method, path = doc.method, doc.path
        op: dict[str, Any] = {"summary": doc.summary, "operationId": _op_id(method, path)}
        if doc.public:
            op["security"] = []
        else:
            op["security"] = [{"bearer": []}]
            roles = ", ".join(r.value for r in doc.roles or ())
            op["description"] = f"Token roles: {roles} (admin always passes)."
        params = [
            {"name": n, "in": "path", "required": True, "schema": {"type": t}}
            for n, t in doc.path_params.items()
        ]
        params += [
            {
                "name": p.name,
                "in": "query",
                "required": p.required,
                "description": p.description,
                "schema": {"type": p.type},
            }
            for p in doc.params
        ]
        if params:
            op["parameters"] = params
        if doc.request is not None:
            op["requestBody"] = {
                "required": doc.request == "bytes",
                "content": _content(doc.request, components),
            }
        responses: dict[str, Any] = {}
        ok: dict[str, Any] = {"description": "success"}
        if doc.response is not None:
            ok["content"] = _content(doc.response, components)
        responses[str(doc.status)] = ok
        if doc.response is wire.Assignments:
            responses["204"] = {"description": "nothing to do before the wait ended"}
        errors = doc.refusals()
        if not doc.public:
            errors += [(STATUS[c], c) for c in (ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN)]
        if doc.path_params:
            errors += [(STATUS[c], c) for c in (ErrorCode.NOT_FOUND, ErrorCode.METHOD_NOT_ALLOWED)]
        for status in sorted({s for s, _ in errors}):
            codes = sorted({str(c) for s, c in errors if s == status})
            responses[str(status)] = {
                "description": "error: " + ", ".join(codes),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        op["responses"] = responses
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rc controller API",
            "version": __version__,
            "description": "rc shares a lab's GPUs. Every error is "
            '{"error": code, "message": text}; every response carries '
            "the Rc-Controller-Instance header.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _op_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.split("/") if w and w != "v1"]
    return method.lower() + "_" + "_".join(words).replace(".", "_")
