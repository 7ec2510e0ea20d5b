"""Wait for a condition, never for a time: `wait_for(lambda: ..., message="...")`.

A test that sleeps a fixed time and then asserts fails on a busy machine (CI: two cores, one
taken by another job), where everything is slower. These helpers poll what the test needs
instead, with a deadline far beyond any machine's slowness, so only a real failure reaches it.
`until` is the same for code on an event loop, which must keep running while it waits.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_S = 60.0
POLL_S = 0.01

Message = str | Callable[[], str]


def _failed(message: Message, timeout: float) -> AssertionError:
    text = message() if callable(message) else message
    return AssertionError(f"{text} (waited {timeout:g} s)")


def wait_for(
    condition: Callable[[], T], timeout: float = DEADLINE_S, message: Message = "condition"
) -> T:
    """Poll `condition` until it returns something true, and return that; fail after `timeout`.

    `message` (or, called, what it returns: the state seen last) says what never happened.
    """
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise _failed(message, timeout)
        time.sleep(POLL_S)
    return result


async def until(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = DEADLINE_S,
    message: Message = "condition",
) -> T:
    """`wait_for` on an event loop, which runs on between looks; `condition` may be async."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _failed(message, timeout)
        await asyncio.sleep(POLL_S)
