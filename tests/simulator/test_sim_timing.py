"""Timing follows the profile's physics, observed from the client on the wall clock.

Only ratios and orderings are asserted, with margins wide enough for a loaded 2-core
machine: each effect is made several times larger than the delivery jitter.
"""

import asyncio
import statistics
import time
from dataclasses import dataclass

import httpx
import orjson
import pytest
from waiting import until

from harness.simulators import start_simulator

CHAT = "llama-3.1-8b-instruct"


@dataclass
class Trace:
    """What a client saw of one streamed answer, in wall-clock seconds from sending it."""

    first_token: float
    last_token: float
    tokens: int
    device: str

    @property
    def per_token(self) -> float:
        return (self.last_token - self.first_token) / max(1, self.tokens - 1)


def _body(prompt: str, tokens: int, model: str = CHAT) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


async def _stream(client: httpx.AsyncClient, body: dict) -> Trace:
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter() - start
                first = first or last
                tokens += 1
    return Trace(first, last, tokens, response.headers["x-sim-device"])


async def _streams(url: str, bodies: list[dict]) -> list[Trace]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await asyncio.gather(*(_stream(client, body) for body in bodies))


def _run(url: str, bodies: list[dict]) -> list[Trace]:
    return asyncio.run(_streams(url, bodies))


@pytest.fixture(scope="module")
def gpu_slow():
    # Slow enough that simulated durations dwarf HTTP overhead; a large per-sequence decode
    # cost makes the effect of concurrency several times the jitter. Without the prefix cache,
    # as these tests measure a prompt's whole prefill: repeated, the long prompt would be cached.
    flags = ["--decode-per-seq-ms", "1.0", "--no-prefix-cache"]
    with start_simulator("gpu", speed=20, extra_args=flags) as sim:
        yield sim


def test_time_to_first_token_grows_with_prompt_length(gpu_slow):
    short = [_run(gpu_slow.url, [_body("word " * 20, 2)])[0].first_token for _ in range(3)]
    long = [_run(gpu_slow.url, [_body("word " * 120_000, 2)])[0].first_token for _ in range(3)]
    # Prefill of 120k tokens is ~300x that of 20 tokens (~200 ms of wall time); ask for 3x.
    assert statistics.median(long) > 3 * statistics.median(short)


def test_decode_slows_as_more_sequences_decode_together(gpu_slow):
    alone = [_run(gpu_slow.url, [_body(f"alone {i}", 120)])[0] for i in range(3)]
    together = _run(gpu_slow.url, [_body(f"crowd {i}", 120) for i in range(16)])
    # One step: 6.7 ms alone, 6.7 + 15 x 1.0 ms with 16 decoding; ask for 1.8x. Medians: one
    # pause of a busy machine's in a run alone does not decide.
    alone_per_token = statistics.median(t.per_token for t in alone)
    assert statistics.median(t.per_token for t in together) > 1.8 * alone_per_token
    assert all(t.tokens == 120 for t in [*alone, *together])


def test_a_bigger_model_decodes_slower(gpu_slow):
    small = [_run(gpu_slow.url, [_body(f"size {i}", 60)])[0].per_token for i in range(3)]
    big = _run(gpu_slow.url, [_body("size", 60, model="llama-3.1-70b-instruct")])[0]
    # 8.75x the cost; ask for 4x of the median, which one pause of a busy machine's cannot move.
    assert big.per_token > 4 * statistics.median(small)


def test_requests_beyond_slots_wait_for_a_free_slot():
    with start_simulator("gpu", speed=10, extra_args=["--slots", "2"]) as sim:

        async def scenario() -> tuple[float, float, list[bool], list[Trace]]:
            async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
                # Two long answers hold both slots until they are cancelled.
                blockers = [
                    asyncio.create_task(_stream(client, _body(f"blocker {i}", 100_000)))
                    for i in range(2)
                ]
                await _until_received(client, 2)
                waiting = [
                    asyncio.create_task(_stream(client, _body(f"queue {i}", 20))) for i in range(2)
                ]
                await _until_received(client, 4)
                running = await _metric(client, "sim_active_requests")
                queued = await _metric(client, "sim_queued_requests")
                # Neither has been given a first token while both slots are held.
                started = [task.done() for task in waiting]
                for blocker in blockers:
                    blocker.cancel()
                await asyncio.gather(*blockers, return_exceptions=True)
                served = await asyncio.gather(*waiting)
            return running, queued, started, served

        running, queued, started, served = asyncio.run(scenario())
    assert (running, queued, started) == (2, 2, [False, False])
    assert [trace.tokens for trace in served] == [20, 20]


def test_queued_requests_are_served_in_arrival_order():
    with start_simulator("gpu", speed=10, extra_args=["--slots", "1"]) as sim:

        async def scenario() -> tuple[float, list[int]]:
            finished: list[int] = []
            async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:

                async def one(index: int) -> None:
                    await _stream(client, _body(f"order {index}", 80))
                    finished.append(index)

                # A long request holds the only slot until it is cancelled.
                blocker = asyncio.create_task(_stream(client, _body("blocker", 100_000)))
                await _until_received(client, 1)
                tasks = []
                for index in range(3):
                    tasks.append(asyncio.create_task(one(index)))
                    # Send the next one only once this one has reached the device.
                    await _until_received(client, index + 2)
                queued = await _metric(client, "sim_queued_requests")
                blocker.cancel()
                await asyncio.gather(blocker, return_exceptions=True)
                await asyncio.gather(*tasks)
            return queued, finished

        queued, finished = asyncio.run(scenario())
    assert queued == 3
    assert finished == [0, 1, 2]


def test_speed_divides_every_simulated_duration():
    # A 4 s prefill and 20 steps of 200 ms, simulated: 0.8 and 0.2 s of wall time in 20 events,
    # so the CPU a busy machine makes slow (a thousand events of a long answer) stays ms of it.
    flags = ["--prefill-fixed-ms", "4000", "--decode-fixed-ms", "200"]
    traces = {}
    for speed in (10, 40):
        with start_simulator("cim", speed=speed, extra_args=flags) as sim:
            traces[speed] = _run(sim.url, [_body("word " * 20, 20)])[0]
    slow, fast = traces[10], traces[40]
    assert slow.first_token > 2 * fast.first_token
    assert slow.last_token - slow.first_token > 2 * (fast.last_token - fast.first_token)


def test_requests_go_to_the_device_with_the_fewest_in_flight():
    with start_simulator("cim", speed=1, extra_args=["--devices", "3"]) as sim:

        async def scenario() -> tuple[list[str], str]:
            async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
                done = asyncio.Event()
                devices: list[str] = []

                async def held(body: dict) -> None:
                    """Send a request and keep it in flight (~10 s of answer) until `done`."""
                    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                        reply.raise_for_status()
                        devices.append(reply.headers["x-sim-device"])
                        await done.wait()

                six = [asyncio.create_task(held(_body(f"spread {i}", 3000))) for i in range(6)]
                await until(lambda: len(devices) == 6, message=lambda: f"placed: {devices}")
                # All six were in flight together, each placed as it arrived.
                assert await _metric(client, "sim_active_requests") == 6
                done.set()  # their clients go, and the devices drop them
                await asyncio.gather(*six)

                async def idle() -> bool:
                    return not await _metric(client, "sim_active_requests")

                await until(idle, message="the devices kept the abandoned requests")
                alone = await _stream(client, _body("alone", 5))
            return devices, alone.device

        devices, alone = asyncio.run(scenario())
    assert sorted(devices) == ["0", "0", "1", "1", "2", "2"]
    assert alone == "0"


async def _metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def _until_received(client: httpx.AsyncClient, count: int, timeout: float = 60.0) -> None:
    """Wait until the devices have received `count` requests (served, running or queued)."""
    deadline = time.monotonic() + timeout
    while True:
        received = 0.0
        for name in ("sim_device_requests_total", "sim_active_requests", "sim_queued_requests"):
            received += await _metric(client, name)
        if received >= count:
            return
        assert time.monotonic() < deadline, f"only {received} of {count} requests arrived"
        await asyncio.sleep(0.002)
