"""A job's environment, as admission builds it.

What the job asked for with `-e` (SubmitRequest.env) goes on top of what its
export takes of the submitting shell's environment (SubmitRequest.caller_env,
rc.proto.exports): the request's `export`, else the controller's default
(rc serve --export-default, ALL unless told), else NONE for a job an admin
submits `--as` someone (an admin's shell is not theirs to see). The worker
then lays rc's own variables and the device variables over it all
(rc.worker.launch.job_env), so nothing here can override them. The result
is stored as the job's env: visible to its owner and admins only, as `-e`
values have always been. README "Your environment in a job".
"""

from __future__ import annotations

from rc.controller.config import Limits
from rc.controller.errors import Refused
from rc.proto import exports
from rc.proto.errors import ErrorCode
from rc.proto.model import valid_env_name
from rc.proto.wire import SubmitRequest

__all__ = ["EXPORT_DEFAULT", "check_env", "job_environment"]

EXPORT_DEFAULT = "ALL"
"""What a job takes of its submitter's shell unless told (sbatch's default)."""


def job_environment(req: SubmitRequest, lim: Limits, default: str = EXPORT_DEFAULT) -> dict:
    """The environment a job is stored with: the export's share of
    req.caller_env, its NAME=V values, then req.env, within the env limits
    (check_env). Raises Refused 400 naming a bad export or entry, or
    limit_exceeded with the hint to send less."""
    text = req.export or ("NONE" if req.as_user else default)
    try:
        export = exports.parse_export(text)
    except ValueError as e:
        raise Refused(ErrorCode.BAD_REQUEST, f"export {e}") from None
    env = {**exports.taken(export, req.caller_env), **export.values, **req.env}
    check_env(env, lim, exported=not export.none and bool(req.caller_env))
    return env


def check_env(env: dict[str, str], lim: Limits, exported: bool = False) -> None:
    """A job's environment: at most `lim.env_items` entries and
    `lim.env_bytes` bytes (names and values, UTF-8; 400 limit_exceeded,
    saying how to send less when the shell's environment was `exported`),
    valid names and no NUL in a value (400 bad_request, naming the variable)."""
    hint = (
        " (most of it is the submitting shell's: --export NONE, or --export NAME,... "
        "with the names the job needs, sends less)"
        if exported
        else ""
    )
    if len(env) > lim.env_items:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED,
            f"{len(env)} environment entries; the limit is {lim.env_items}{hint}",
        )
    if sum(len(k.encode()) + len(v.encode()) for k, v in env.items()) > lim.env_bytes:
        raise Refused(
            ErrorCode.LIMIT_EXCEEDED, f"the environment is over {lim.env_bytes} bytes{hint}"
        )
    for k, v in env.items():
        if not valid_env_name(k):
            raise Refused(
                ErrorCode.BAD_REQUEST,
                f"environment variable name {k[:40]!r} is not valid "
                "(letters, digits and '_', not starting with a digit)",
            )
        if "\0" in v:
            raise Refused(
                ErrorCode.BAD_REQUEST, f"environment variable {k!r} contains a NUL character"
            )
