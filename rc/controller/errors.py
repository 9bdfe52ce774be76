"""Errors of the controller.

`Refused` is the one way a request is turned down: it carries the ErrorCode,
its HTTP status (from the one table, rc.proto.errors.STATUS) and a message
naming the problem, and the app renders it as the
single error shape `{"error": code, "message": text}` (docs/design.md#the-wire).
Transaction functions raise it too; their savepoint is rolled back.
"""

from __future__ import annotations

from rc.proto.errors import ErrorCode, RcError, statuses

__all__ = [
    "ControllerError",
    "GuardFailed",
    "NotLeader",
    "Refused",
    "StartupError",
    "StoreError",
]


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


class NotLeader(StoreError):
    """A write batch was fenced: this controller's leadership lease has passed
    to another controller, or expired (rc.controller.store.leader). Nothing of
    the batch committed; a request answers 503 standby and the controller
    steps down."""


class StartupError(ControllerError):
    """`rc serve` cannot start (address in use, data dir not writable...)."""


class Refused(ControllerError):
    """A request is refused with `code` and a message naming the problem.

    The HTTP status is the code's own in rc.proto.errors.STATUS. `status`
    chooses the code's second status where that table gives one
    (SECOND_STATUS: 429 limit_exceeded for a count of open sessions); any
    other status raises ValueError, as does a code that is not an ErrorCode.
    """

    def __init__(self, code: ErrorCode | str, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        try:
            known = ErrorCode(code)
        except ValueError:
            raise ValueError(f"Refused needs an ErrorCode, not {code!r}") from None
        allowed = statuses(known)
        if status is not None and status not in allowed:
            raise ValueError(f"{known} is answered with {allowed}, never {status}")
        self.status = allowed[0] if status is None else status
        self.code = str(known)
        self.message = message
