"""Background work: a task that runs one round every interval, one-off tasks, the processes
that take work off the serving process (the records writer, the cost model's trainer), and the
probes that time what stalls its event loop (late timers, the collector's pauses)."""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

# Work apart can wait; a request cannot. Above the serving process's 0, the scheduler gives a
# core they share to the event loop first: at nice 10 a helper gets about a tenth of a core a
# saturated loop also wants (weights 110 against 1,024), several times what writing every
# record takes, and all of an idle one.
HELPER_NICE = 10


def helper_process(
    initializer: Callable[..., object] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """Start a process of one worker for work apart from serving.

    Spawned, not forked: the serving process has threads and an event loop running. It runs
    below the serving process, logs as it does, and ignores Ctrl-C and SIGTERM, which reach the
    whole process group: the serving process ends it after its last use (a flush at shutdown).
    """
    root = logging.getLogger()
    # The handler `gateway` sets up (logging.basicConfig), not a test runner's capture.
    formatter = next(
        (h.formatter for h in root.handlers if type(h.formatter) is logging.Formatter), None
    )
    executor = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_started_apart,
        initargs=(initializer, initargs, root.level, formatter),
    )
    # Started now and lowered from here, before its interpreter imports anything: a spawned
    # process's imports are a second of CPU, at the serving process's priority if it lowered
    # itself only once they were done.
    executor.submit(int)
    lowered = min(os.getpriority(os.PRIO_PROCESS, 0) + HELPER_NICE, 19)
    for pid in executor._processes:  # the worker, started by the submit
        os.setpriority(os.PRIO_PROCESS, pid, lowered)
    return executor


def _started_apart(
    initializer: Callable[..., object] | None,
    initargs: tuple[Any, ...],
    level: int,
    formatter: logging.Formatter | None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A spawned process starts with logging unset (unless importing the main module set it):
    # what it logs would be lost.
    root = logging.getLogger()
    if formatter is not None and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    if initializer is not None:
        initializer(*initargs)


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


class LoopLag:
    """Measure how late the event loop runs a timer: the stall every request arriving waits behind.

    A round that runs long (a collection, a burst of work) shows as lag; `observe` is given each
    one in seconds: how much later than its interval after the last one a round ran.
    """

    def __init__(self, observe: Callable[[float], object], interval_s: float = 0.01):
        self._observe = observe
        self._last = 0.0
        self._periodic = Periodic("loop-lag", interval_s, self._round)

    def start(self) -> None:
        self._last = asyncio.get_running_loop().time()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _round(self) -> None:
        now = asyncio.get_running_loop().time()
        self._observe(max(0.0, now - self._last - self._periodic.interval_s))
        self._last = now


def time_collections(observe: Callable[[int, float], object]) -> Callable[[], None]:
    """Give `observe` the generation and pause, in seconds, of every collection past the
    youngest (those are frequent and short); return what stops it."""
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 0:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            observe(info["generation"], time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    return lambda: gc.callbacks.remove(timed)


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
