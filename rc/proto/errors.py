"""Errors shared by every part of rc, and the error codes of the wire.

Every HTTP error body is `{"error": <ErrorCode>, "message": <text>}`
(DESIGN.md §5). The codes are listed once here so that the controller raising
them and the CLI and worker reading them can never disagree.
"""

from __future__ import annotations

import enum

__all__ = ["ApiError", "ErrorCode", "RcError", "TransportError", "WireError"]


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
    """Every error code the controller answers with (inventory §3)."""

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
    PRIORITY_OUT_OF_RANGE = "priority_out_of_range"
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
    DEVICE_BUSY = "device_busy"
    LOGS_NOT_STORED = "logs_not_stored"
    OFFSET_GAP = "offset_gap"
    CONFLICT = "conflict"
    TOKEN_EXISTS = "token_exists"
    LAST_ADMIN_TOKEN = "last_admin_token"
    STORE_ERROR = "store_error"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    # the relay and sessions inside holds (issue 6)
    NOT_ATTACHED = "not_attached"
    SESSION_ENDED = "session_ended"
    NOT_A_HOLD = "not_a_hold"


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
