"""Strict JSON codec for the frozen dataclasses of rc.proto.

`encode(obj)` turns a record into JSON primitives (dicts, lists, str, int,
float, bool, None); `decode(cls, data)` builds a record from them and refuses
anything that does not fit: unknown fields, missing required fields, wrong
types. Every refusal is a `WireError` naming the field path, so the controller
can answer 400 with a message that says what was wrong.

Supported annotations: str, int, float, bool, None unions (`X | None`),
StrEnum/IntEnum subclasses, `tuple[X, ...]`, `dict[str, X]`, and nested
dataclasses. `bool` is never accepted where an int is expected, and an int is
accepted where a float is. Integers must fit in 64 bits (the database's
INTEGER): a larger one is refused naming the field, never a crash later.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

from rc.proto.errors import WireError

__all__ = ["WireError", "decode", "encode"]

T = TypeVar("T")

_MISSING = dataclasses.MISSING
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Every integer on the wire fits SQLite's INTEGER (and every peer's int64)."""


def encode(obj: Any) -> Any:
    """Return the JSON-primitive form of a record, enum, tuple, list or dict."""
    if obj is None or isinstance(obj, (str, bool, int, float)):
        if isinstance(obj, enum.Enum):
            return obj.value
        return obj
    if dataclasses.is_dataclass(obj):
        return {f.name: encode(getattr(obj, f.name)) for f in _fields(type(obj))}
    if isinstance(obj, (tuple, list)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, enum.Enum):
        return obj.value
    raise TypeError(f"cannot encode {type(obj).__name__}")


def decode(cls: type[T], data: Any, path: str = "") -> T:
    """Build a `cls` record from JSON primitives.

    Raises WireError(path, problem) for unknown or missing fields and wrong
    types; `path` prefixes nested field names (e.g. "devices[2].name").
    """
    return _decode(cls, data, path or cls.__name__)


def _fields(cls: type) -> tuple[dataclasses.Field, ...]:
    cached = _FIELDS.get(cls)
    if cached is None:
        cached = _FIELDS[cls] = dataclasses.fields(cls)
    return cached


def _hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is None:
        cached = _HINTS[cls] = typing.get_type_hints(cls)
    return cached


_FIELDS: dict[type, tuple[dataclasses.Field, ...]] = {}
_HINTS: dict[type, dict[str, Any]] = {}

_TYPE_WORDS = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
}


def _decode(tp: Any, data: Any, path: str) -> Any:
    if tp is Any:
        return data
    if dataclasses.is_dataclass(tp):
        return _decode_record(tp, data, path)
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _decode(rest[0], data, path)
        raise TypeError(f"unsupported union {tp}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise WireError(path, "must be a list")
        return tuple(_decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(data))
    if origin is dict:
        _, vt = typing.get_args(tp)
        if not isinstance(data, dict):
            raise WireError(path, "must be an object")
        return {k: _decode(vt, v, f"{path}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise WireError(path, f"must be one of {allowed}") from None
    if tp is float:
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise WireError(path, "must be a number")
    if tp is int:
        if isinstance(data, float) and data.is_integer():
            data = int(data)
        if isinstance(data, int) and not isinstance(data, bool):
            if not INT_MIN <= data <= INT_MAX:
                raise WireError(path, "is out of range (a 64-bit integer)")
            return data
        raise WireError(path, "must be an integer")
    if tp in (str, bool):
        if type(data) is tp:
            return data
        raise WireError(path, f"must be {_TYPE_WORDS[tp]}")
    raise TypeError(f"unsupported annotation {tp!r} at {path}")


def _decode_record(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise WireError(path, "must be an object")
    hints = _hints(cls)
    fields = _fields(cls)
    names = {f.name for f in fields}
    for key in data:
        if key not in names:
            raise WireError(f"{path}.{key}", "is not a known field")
    kwargs = {}
    for f in fields:
        if f.name in data:
            kwargs[f.name] = _decode(hints[f.name], data[f.name], f"{path}.{f.name}")
        elif f.default is _MISSING and f.default_factory is _MISSING:
            raise WireError(f"{path}.{f.name}", "is required")
    return cls(**kwargs)
