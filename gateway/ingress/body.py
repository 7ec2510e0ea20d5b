"""Request bodies: read within a size limit and a deadline, so no client holds a connection.

A client trickling bytes must not hold a connection and its buffer forever, and a body over the
limit is refused as soon as its declared length (or its bytes so far) passes it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.errors import BodyTooLarge, InvalidRequest, RequestTimeout
from gateway.upstream.asgi import Receive, Scope


class BodyDeadlines:
    """Cut request bodies that do not arrive in time, with one timer for all of them.

    A client trickling bytes must not hold a connection and its buffer forever. Nearly every
    body arrives with its headers, though, and a timer armed and cancelled per request
    (asyncio.timeout) cost several times the read itself. The reads in progress are kept with
    their deadlines instead, and one check every quarter of the timeout (at most every second)
    cuts those past it: a body is cut between timeout_s and 1.25 × timeout_s after it began.
    """

    def __init__(self) -> None:
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._cut: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check: asyncio.TimerHandle | None = None

    async def read(self, scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
        """Read the request body within timeout_s, refusing it once it exceeds limit bytes."""
        task = self._current_task()
        self._reading[task] = time.monotonic() + timeout_s
        if self._check is None:
            self._arm(timeout_s)
        try:
            return await read_body(scope, receive, limit)
        except asyncio.CancelledError:
            if task in self._cut:
                self._cut.discard(task)
                if task.uncancel() == 0:  # cut here, and cancelled by nothing else
                    raise RequestTimeout(
                        f"the request body did not arrive within {timeout_s:g} s"
                    ) from None
            raise
        finally:
            del self._reading[task]

    def _current_task(self) -> asyncio.Task[Any]:
        # Given its loop, current_task skips get_running_loop, which makes a system call.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(self._loop)
            assert task is not None, "the ingress serves requests from tasks"
        return task

    def _arm(self, timeout_s: float) -> None:
        assert self._loop is not None
        self._check = self._loop.call_later(min(timeout_s / 4, 1.0), self._cut_late, timeout_s)

    def _cut_late(self, timeout_s: float) -> None:
        self._check = None
        now = time.monotonic()
        for task, deadline in self._reading.items():
            if deadline <= now and task not in self._cut:
                self._cut.add(task)
                task.cancel()
        if self._reading:
            self._arm(timeout_s)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise InvalidRequest("the Content-Length header is not a number") from None
            if declared > limit:
                raise BodyTooLarge(f"the request body of {declared} bytes exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("the client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body exceeds {limit} bytes")
        if not message.get("more_body", False):
            return b"".join(chunks)
