"""Power, energy and load, exposed with the DCGM exporter's names."""

import asyncio
import time
from dataclasses import dataclass

import httpx
import pytest

from harness.metrics import metric_value, parse_metrics
from harness.simulators import SimulatorProcess, start_simulator

CHAT = "llama-3.1-8b-instruct"


def _long_request(client: httpx.AsyncClient, tokens: int, tag: str):
    return client.post(
        "/v1/chat/completions",
        json={
            "model": CHAT,
            "messages": [{"role": "user", "content": tag}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0,
        },
    )


@dataclass
class Scrape:
    """A simulator's metrics, and the wall-clock moments the request went and came back."""

    text: str
    sent: float
    received: float


def _scrape(sim: SimulatorProcess) -> Scrape:
    sent = time.monotonic()
    text = sim.metrics()
    return Scrape(text, sent, time.monotonic())


def _average_power(before: Scrape, after: Scrape) -> tuple[float, float]:
    """Return the least and the most watts the energy used between two scrapes can average.

    Each scrape brings the energy up to some instant within its round trip, on the monotonic
    clock the simulator runs `speed` times faster: the time between is known within the two
    round trips, however long a busy machine makes them.
    """
    joules = (
        metric_value(after.text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        - metric_value(before.text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    ) / 1000.0
    speed = metric_value(after.text, "sim_clock_speed")
    longest = (after.received - before.sent) * speed
    shortest = (after.sent - before.received) * speed
    return joules / longest, joules / shortest


@pytest.fixture(scope="module")
def fleet():
    with start_simulator("gpu", speed=100, extra_args=["--devices", "3"]) as sim:
        yield sim


def test_power_and_energy_use_dcgm_names_with_one_series_per_device(fleet):
    samples = parse_metrics(fleet.metrics())
    for name in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        series = [labels for sample, labels, _ in samples if sample == name]
        assert [labels["gpu"] for labels in series] == ["0", "1", "2"]
        assert {labels["device"] for labels in series} == {"nvidia0", "nvidia1", "nvidia2"}
        assert len({labels["UUID"] for labels in series}) == 3
        assert all(labels["modelName"] and labels["Hostname"] for labels in series)
    text = fleet.metrics()
    assert "# TYPE DCGM_FI_DEV_POWER_USAGE gauge" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text


def test_an_idle_device_draws_its_idle_power(fleet):
    assert metric_value(fleet.metrics(), "DCGM_FI_DEV_POWER_USAGE", gpu="1") == pytest.approx(120)
    before = _scrape(fleet)
    time.sleep(0.2)  # what is measured: any time does, a longer one against the round trips
    least, most = _average_power(before, _scrape(fleet))
    assert least <= 3 * 120 * 1.01 and most >= 3 * 120 * 0.99


def test_energy_counter_grows_faster_under_load():
    # A slower clock than the module's, so 5,000 tokens take seconds: none of the 24 ends before
    # all are running, however slowly a busy machine sends them (and answers that long are
    # cheap to compose).
    with start_simulator("gpu", speed=5, extra_args=["--devices", "3"]) as fleet:
        idle, loaded = asyncio.run(_idle_and_loaded_power(fleet))
    # 3 x 120 W idle against 3 x P(8) ~ 3 x 390 W; ask for 2x of the most idle could be.
    assert loaded > 2 * idle


async def _idle_and_loaded_power(fleet: SimulatorProcess) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as client:
        idle_start = _scrape(fleet)
        await asyncio.sleep(0.1)  # what is measured: any time does
        idle_end = _scrape(fleet)
        requests = [
            asyncio.create_task(_long_request(client, 5_000, f"load {i}")) for i in range(24)
        ]
        await _until(fleet, "sim_active_requests", 24, requests=requests)
        load_start = _scrape(fleet)
        await asyncio.sleep(0.1)
        load_end = _scrape(fleet)
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
    return _average_power(idle_start, idle_end)[1], _average_power(load_start, load_end)[0]


def test_power_per_device_rises_with_its_active_requests(fleet):
    async def scenario() -> str:
        async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as client:
            requests = [
                asyncio.create_task(_long_request(client, 30_000, f"one {i}")) for i in range(4)
            ]
            await _until(fleet, "sim_active_requests", 4)
            text = fleet.metrics()
            for request in requests:
                request.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
        return text

    text = asyncio.run(scenario())
    active = {
        labels["gpu"]: value
        for name, labels, value in parse_metrics(text)
        if name == "sim_active_requests"
    }
    power = {
        labels["gpu"]: value
        for name, labels, value in parse_metrics(text)
        if name == "DCGM_FI_DEV_POWER_USAGE"
    }
    busiest = max(active, key=active.get)
    quietest = min(active, key=active.get)
    assert active[busiest] > active[quietest]
    assert power[busiest] > power[quietest]


def test_peak_inflight_counts_requests_received_and_not_yet_answered():
    with start_simulator("gpu", speed=100, extra_args=["--slots", "2"]) as sim:

        async def scenario() -> float:
            async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
                requests = [
                    asyncio.create_task(_long_request(client, 30_000, f"peak {i}"))
                    for i in range(10)
                ]
                # Received (inflight) comes before enqueued on the device: wait for the queue.
                await _until(sim, "sim_queued_requests", 8)
                queued = metric_value(sim.metrics(), "sim_queued_requests")
                for request in requests:
                    request.cancel()
                await asyncio.gather(*requests, return_exceptions=True)
            return queued

        assert asyncio.run(scenario()) == 8  # 10 in flight, 2 slots
        sim.wait_for_metric("sim_requests_total", 10, status="none")  # all abandoned
        assert metric_value(sim.metrics(), "sim_peak_inflight_requests") == 10
        assert metric_value(sim.metrics(), "sim_inflight_requests") == 0
        assert metric_value(sim.metrics(), "sim_active_requests") == 0


async def _until(
    sim: SimulatorProcess,
    name: str,
    at_least: float,
    timeout: float = 60.0,
    requests: list[asyncio.Task] | None = None,
) -> None:
    """Wait for the metric to reach `at_least`; a request that ended first says why it did."""
    deadline = time.monotonic() + timeout
    while (value := metric_value(sim.metrics(), name)) < at_least:
        for ended in [r for r in requests or [] if r.done()]:
            raise AssertionError(f"a request ended before {name} reached {at_least}: "
                                 f"{ended.exception() or ended.result()}")  # fmt: skip
        assert time.monotonic() < deadline, f"{name} stayed at {value}, below {at_least}"
        await asyncio.sleep(0.005)
