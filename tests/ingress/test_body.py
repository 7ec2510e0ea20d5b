"""Request bodies: cut when they stop arriving, whoever else cancels a read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.errors import RequestTimeout
from gateway.ingress.body import BodyDeadlines


def _reading_forever() -> tuple[
    dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], asyncio.Event
]:
    """A body that never arrives, and an event set once its read has begun."""
    scope: dict[str, Any] = {"headers": [(b"content-length", b"10")]}
    reading = asyncio.Event()

    async def receive() -> dict[str, Any]:
        reading.set()
        await asyncio.Event().wait()
        raise AssertionError("never set")

    return scope, receive, reading


def test_a_body_that_stops_arriving_is_cut_after_its_timeout_and_a_prompt_one_is_not() -> None:
    async def scenario() -> float:
        deadlines = BodyDeadlines()
        scope, stalled, _ = _reading_forever()

        async def prompt() -> dict[str, Any]:
            return {"type": "http.request", "body": b"0123456789", "more_body": False}

        started = time.monotonic()
        late = asyncio.create_task(deadlines.read(scope, stalled, 100, 0.2))
        assert await deadlines.read(scope, prompt, 100, 0.2) == b"0123456789"
        with pytest.raises(RequestTimeout, match=r"did not arrive within 0\.2 s"):
            async with asyncio.timeout(60):  # a read never cut fails here, not the CI job
                await late
        return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.2


def test_a_body_read_cancelled_from_elsewhere_stays_cancelled() -> None:
    async def scenario() -> None:
        deadlines = BodyDeadlines()
        scope, stalled, reading = _reading_forever()
        # A deadline no busy machine reaches first: only the cancel below ends the read.
        read = asyncio.create_task(deadlines.read(scope, stalled, 100, 60))
        await reading.wait()
        read.cancel()  # the server shutting down, not the deadline
        with pytest.raises(asyncio.CancelledError):
            await read

    asyncio.run(scenario())
