"""Background work: a task that runs one round every interval, and one-off tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Periodic:
    """Run `work` every `interval_s` seconds in the background.

    A round that raises is logged and the next one runs as usual, so one bad round (a database
    blip, a half-saved file) never stops the work for good.
    """

    def __init__(
        self,
        name: str,
        interval_s: float,
        work: Callable[[], Awaitable[object]],
        *,
        first_at_start: bool = False,
    ):
        self.name = name
        self.interval_s = interval_s
        self._work = work
        self._first_at_start = first_at_start
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        if self._first_at_start:
            await self._round()
        while True:
            await asyncio.sleep(self.interval_s)
            await self._round()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Stopped mid-round, and the round's library (a timeout around a network call)
                # turned the cancellation into an error of its own: stop all the same.
                raise asyncio.CancelledError

    async def _round(self) -> None:
        try:
            await self._work()
        except Exception:
            log.exception("%s: a round failed; the next one runs as usual", self.name)


class Tasks:
    """One-off background tasks, kept referenced until they end (asyncio holds only weak ones)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, timeout_s: float) -> None:
        """Let the tasks running now end, for up to timeout_s; cancel what is left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        await self.cancel()

    async def cancel(self) -> None:
        """Cancel every task and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
