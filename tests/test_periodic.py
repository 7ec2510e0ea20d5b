"""Background rounds: a failing round does not end the work, and stop() always stops it."""

from __future__ import annotations

import asyncio

from gateway.periodic import Periodic


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
