"""Errors of the controller.

`Refused` is the one way a request is turned down: it carries the HTTP status,
the ErrorCode and a message naming the problem, and the app renders it as the
single error shape `{"error": code, "message": text}` (DESIGN.md §5).
Transaction functions raise it too; their savepoint is rolled back.
"""

from __future__ import annotations

from rc.proto.errors import ErrorCode, RcError

__all__ = ["ControllerError", "GuardFailed", "Refused", "StartupError", "StoreError"]


class ControllerError(RcError):
    """Base class of the controller's own errors."""


class StoreError(ControllerError):
    """The database cannot be opened, is not ours, or a commit failed."""


class GuardFailed(StoreError):
    """A guarded write (`Tx.change`) changed no row, or more than one: the
    row it is guarded by (a job still queued, a device still ready, a lease
    still live...) was not as the transaction function had just read it.

    A bug in a transaction function, never the caller's mistake: the
    function's savepoint is rolled back (nothing it wrote stays) and a
    request answers 500 internal. The message names the query.
    """


class StartupError(ControllerError):
    """`rc serve` cannot start (address in use, data dir not writable...)."""


class Refused(ControllerError):
    """A request is refused with `status`, `code` and a message naming the problem."""

    def __init__(self, status: int, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = str(code)
        self.message = message

    @classmethod
    def bad(cls, code: ErrorCode | str, message: str) -> Refused:
        """400."""
        return cls(400, code, message)

    @classmethod
    def not_found(cls, message: str, code: ErrorCode | str = ErrorCode.NOT_FOUND) -> Refused:
        """404."""
        return cls(404, code, message)

    @classmethod
    def conflict(cls, code: ErrorCode | str, message: str) -> Refused:
        """409."""
        return cls(409, code, message)

    @classmethod
    def forbidden(cls, message: str, code: ErrorCode | str = ErrorCode.FORBIDDEN) -> Refused:
        """403."""
        return cls(403, code, message)
