"""Waiting for a condition with a deadline (never a bare sleep): `wait_until`
polls from plain code, `until` from a coroutine on the running event loop."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.02,
) -> Any:
    """Poll `predicate` until it returns something truthy; return that value.

    Raises AssertionError naming `what` after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - report the last one if we time out
            last_error = e
        if time.monotonic() > deadline:
            extra = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}")
        time.sleep(interval)


async def until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.005,
) -> Any:
    """Await until `predicate()` is truthy; return that value. `predicate` is a
    plain callable or one returning an awaitable (then its result counts);
    between tries the loop runs other tasks for `interval` seconds.

    Raises AssertionError naming `what` after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
