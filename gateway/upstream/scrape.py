"""The metrics scrape: read the backends' Prometheus endpoints once a round, for their readers.

Two readers take what backends publish: the energy meter (DCGM's counters,
gateway/energy/meter.py) and serving engines' load (gateway/upstream/engines.py). Each says
which endpoints it wants; a round fetches each endpoint once, all at once, and hands every reader
the texts it asked for, each stamped with when it was read (the middle of its round trip). A
reader's `read` runs on the event loop between two requests: it does O(backends) work, and
leaves anything longer to a task of its own that yields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 1.0
BASELINE_S = 0.1

# When a text was read (on the scrape's clock), and the text, or None if it could not be.
Reading = tuple[float, str | None]


class Reader(Protocol):
    """What a round of the scrape serves: the endpoints it wants, and what to do with them."""

    def wanted(self) -> Mapping[str, Mapping[str, str]]:
        """Return the endpoints to read this round, each with the headers to read it with."""
        ...

    def read(self, readings: Mapping[str, Reading]) -> None:
        """Take this round's readings of the endpoints `wanted` returned."""
        ...


class Scrape:
    """Read every endpoint the readers want, every `interval_s`, once each."""

    def __init__(
        self,
        upstream: Upstream,
        readers: Sequence[Reader],
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self._upstream = upstream
        self._readers = readers
        self._interval_s = interval_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def round(self) -> None:
        """Read every endpoint wanted now and hand the readings to their readers."""
        wanted = [reader.wanted() for reader in self._readers]
        endpoints: dict[str, Mapping[str, str]] = {}
        for urls in wanted:
            endpoints |= urls
        fetched = await asyncio.gather(*(self._fetch(u, h) for u, h in endpoints.items()))
        readings = dict(zip(endpoints, fetched, strict=True))
        for reader, urls in zip(self._readers, wanted, strict=True):
            try:
                reader.read({url: readings[url] for url in urls})
            except Exception:
                log.exception("reading the metrics of %s failed", type(reader).__name__)

    async def _fetch(self, url: str, headers: Mapping[str, str]) -> Reading:
        sent = self._clock()
        answer = await self._upstream.get(url, headers, SCRAPE_TIMEOUT_S)
        if answer is None:
            return sent, None
        status, body = answer
        text = body.decode("utf-8", errors="replace") if status == 200 else None
        # The exporter read its counter somewhere in the round trip: take the middle.
        return (sent + self._clock()) / 2, text

    async def start(self) -> None:
        """Read twice (the idle fleet's draw, a baseline for the first interval), then run."""
        await self.round()
        await asyncio.sleep(min(self._interval_s, BASELINE_S))
        await self.round()
        self._task = asyncio.create_task(self._run(), name="metrics-scrape")

    async def stop(self) -> None:
        """Stop, after a last round: what ran until now is measured."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            await self.round()
        except Exception:
            log.exception("the last metrics scrape failed")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.round()
            except Exception:
                log.exception("metrics scrape round failed")
