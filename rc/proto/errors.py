"""Errors shared by every part of rc, and the error codes of the wire.

Every HTTP error body is `{"error": <ErrorCode>, "message": <text>}`
(docs/design.md#the-wire). The codes are listed once here so that the controller raising
them and the CLI and worker reading them can never disagree.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "SECOND_STATUS",
    "STATUS",
    "ApiError",
    "ErrorCode",
    "RcError",
    "TransportError",
    "WireError",
    "statuses",
]


class RcError(Exception):
    """Base class of every error rc raises on purpose."""


class WireError(RcError, ValueError):
    """A JSON value does not fit the record it should decode into.

    `field` is the path of the offending value ("SubmitRequest.priority"),
    `problem` says what is wrong with it ("must be an integer").
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem


class ErrorCode(enum.StrEnum):
    """Every error code the controller answers with; STATUS maps each to its HTTP status."""

    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BAD_REQUEST = "bad_request"
    BAD_JSON = "bad_json"
    BODY_TOO_LARGE = "body_too_large"
    CHUNK_TOO_LARGE = "chunk_too_large"
    SHEET_TOO_LARGE = "sheet_too_large"
    LIMIT_EXCEEDED = "limit_exceeded"
    QUEUE_FULL = "queue_full"
    QUEUED_SPEC_BYTES = "queued_spec_bytes"
    PRIORITY_OUT_OF_RANGE = "priority_out_of_range"
    PRIORITY_NOT_ALLOWED = "priority_not_allowed"
    BAD_SELECTOR = "bad_selector"
    RUNTIME_ABOVE_CEILING = "runtime_above_ceiling"
    UNKNOWN_DEVICE = "unknown_device"
    NO_MATCHING_DEVICE = "no_matching_device"
    NO_DEVICE_AVAILABLE = "no_device_available"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    NOT_CANCELLABLE = "not_cancellable"
    NOT_JOB_OWNER = "not_job_owner"
    WRONG_HOST = "wrong_host"
    NOT_WORKER_JOB = "not_worker_job"
    DEVICE_NOT_FOUND = "device_not_found"
    DEVICE_NOT_CLEARED = "device_not_cleared"
    SURVIVORS_FOUND = "survivors_found"
    SCAN_UNAVAILABLE = "scan_unavailable"
    DEVICE_BUSY = "device_busy"
    LOGS_NOT_STORED = "logs_not_stored"
    OFFSET_GAP = "offset_gap"
    CONFLICT = "conflict"
    TOKEN_EXISTS = "token_exists"
    LAST_ADMIN_TOKEN = "last_admin_token"
    STORE_ERROR = "store_error"
    UNAVAILABLE = "unavailable"
    STANDBY = "standby"
    INTERNAL = "internal"
    # the relay and sessions inside holds (rc shell, rc exec, rc cp --hold)
    NOT_ATTACHED = "not_attached"
    SESSION_ENDED = "session_ended"
    NOT_A_HOLD = "not_a_hold"


STATUS: Mapping[ErrorCode, int] = MappingProxyType(
    {
        ErrorCode.UNAUTHORIZED: 401,
        ErrorCode.FORBIDDEN: 403,
        ErrorCode.NOT_FOUND: 404,
        ErrorCode.METHOD_NOT_ALLOWED: 405,
        ErrorCode.BAD_REQUEST: 400,
        ErrorCode.BAD_JSON: 400,
        ErrorCode.BODY_TOO_LARGE: 413,
        ErrorCode.CHUNK_TOO_LARGE: 413,
        ErrorCode.SHEET_TOO_LARGE: 413,
        ErrorCode.LIMIT_EXCEEDED: 400,
        ErrorCode.QUEUE_FULL: 429,
        ErrorCode.QUEUED_SPEC_BYTES: 429,
        ErrorCode.PRIORITY_OUT_OF_RANGE: 400,
        ErrorCode.PRIORITY_NOT_ALLOWED: 400,
        ErrorCode.BAD_SELECTOR: 400,
        ErrorCode.RUNTIME_ABOVE_CEILING: 400,
        ErrorCode.UNKNOWN_DEVICE: 400,
        ErrorCode.NO_MATCHING_DEVICE: 400,
        ErrorCode.NO_DEVICE_AVAILABLE: 409,
        ErrorCode.IDEMPOTENCY_CONFLICT: 409,
        ErrorCode.NOT_CANCELLABLE: 409,
        ErrorCode.NOT_JOB_OWNER: 403,
        ErrorCode.WRONG_HOST: 403,
        ErrorCode.NOT_WORKER_JOB: 403,
        ErrorCode.DEVICE_NOT_FOUND: 404,
        ErrorCode.DEVICE_NOT_CLEARED: 409,
        ErrorCode.SURVIVORS_FOUND: 409,
        ErrorCode.SCAN_UNAVAILABLE: 503,
        ErrorCode.DEVICE_BUSY: 409,
        ErrorCode.LOGS_NOT_STORED: 409,
        ErrorCode.OFFSET_GAP: 409,
        ErrorCode.CONFLICT: 409,
        ErrorCode.TOKEN_EXISTS: 409,
        ErrorCode.LAST_ADMIN_TOKEN: 409,
        ErrorCode.STORE_ERROR: 500,
        ErrorCode.UNAVAILABLE: 503,
        ErrorCode.STANDBY: 503,
        ErrorCode.INTERNAL: 500,
        ErrorCode.NOT_ATTACHED: 409,
        ErrorCode.SESSION_ENDED: 409,
        ErrorCode.NOT_A_HOLD: 409,
    }
)
"""The HTTP status of each error code: the one table the controller answers
from (rc.controller.errors.Refused) and the OpenAPI document is written from."""

SECOND_STATUS: Mapping[ErrorCode, int] = MappingProxyType({ErrorCode.LIMIT_EXCEEDED: 429})
"""Codes that have a second status, each for a stated reason.

limit_exceeded is 400 when a request is over a size limit (a command, an
environment, a text, labels, devices per worker: the same request is refused
again) and 429 when the caller is at a count of things open at once (terminal
and pipe sessions per user: the same request succeeds once one has ended).
README.md, "Limits", says which limit answers which."""


def statuses(code: ErrorCode) -> tuple[int, ...]:
    """The statuses `code` may be answered with: its own, then its second one."""
    second = SECOND_STATUS.get(code)
    return (STATUS[code],) if second is None else (STATUS[code], second)


class ApiError(RcError):
    """The controller answered with an error envelope.

    `status` is the HTTP status, `code` the ErrorCode value (a plain string, so
    a code this client does not know yet still arrives), `message` the text.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class TransportError(RcError):
    """The controller could not be reached, or the connection broke mid-request."""
