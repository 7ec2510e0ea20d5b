"""Periodic work: a background task that runs one round every interval until stopped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

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

    async def _round(self) -> None:
        try:
            await self._work()
        except Exception:
            log.exception("%s: a round failed; the next one runs as usual", self.name)
