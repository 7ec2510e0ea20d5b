"""Background rounds: a failing round does not end the work, and stop() always stops it; the
loop-lag probe sees a stall, and the collector's pauses are timed."""

from __future__ import annotations

import asyncio
import gc
import time

from waiting import until

from gateway.periodic import LoopLag, Periodic, time_collections


def test_a_round_that_fails_is_followed_by_the_next() -> None:
    async def scenario() -> int:
        rounds = 0

        async def work() -> None:
            nonlocal rounds
            rounds += 1
            raise RuntimeError("a database blip")

        periodic = Periodic("flaky", 0.01, work)
        periodic.start()
        while rounds < 3:
            await asyncio.sleep(0.01)
        await periodic.stop()
        return rounds

    assert asyncio.run(scenario()) >= 3


def test_stop_ends_the_work_even_when_a_round_turns_the_cancel_into_an_error() -> None:
    async def scenario() -> bool:
        in_round = asyncio.Event()
        swallow = True

        async def work() -> None:
            # What a client library with its own timeout does: the cancel becomes its error.
            try:
                in_round.set()
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallow:
                    raise TimeoutError("the call was cut") from None
                raise

        periodic = Periodic("network", 0.01, work)
        periodic.start()
        await in_round.wait()
        stopping = asyncio.create_task(periodic.stop())
        done, _ = await asyncio.wait({stopping}, timeout=60)  # a hang, not a speed, is the failure
        swallow = False  # let a work that did not stop end, so the test fails instead of hanging
        return stopping in done

    assert asyncio.run(scenario())


def test_the_loop_lag_probe_sees_how_long_the_event_loop_stalled() -> None:
    lags: list[float] = []

    async def scenario() -> None:
        probe = LoopLag(lags.append, interval_s=0.01)
        probe.start()
        await until(lambda: len(lags) >= 3, message="the probe never ran")
        time.sleep(0.2)  # the stall to be seen: nothing runs on the loop meanwhile
        await until(lambda: any(lag >= 0.15 for lag in lags), message=lambda: f"lags {lags}")
        await probe.stop()

    asyncio.run(scenario())
    # A stall is seen once, as the time it held the loop past the timer's due time.
    assert sum(lag >= 0.15 for lag in lags) == 1


def test_collections_past_the_youngest_are_timed_until_stopped() -> None:
    seen: list[tuple[int, float]] = []
    enabled = gc.isenabled()
    gc.disable()  # only the collections asked for below
    try:
        stop = time_collections(lambda generation, s: seen.append((generation, s)))
        gc.collect(0)
        gc.collect(1)
        gc.collect(2)
        stop()
        gc.collect(2)
    finally:
        if enabled:
            gc.enable()
    assert [generation for generation, _ in seen] == [1, 2]
    assert all(0 <= s < 60 for _, s in seen)
