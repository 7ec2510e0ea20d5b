"""vLLM's sleep mode on the simulator: /sleep parks the devices, /wake_up wakes them."""

from collections.abc import Iterator

import httpx
import pytest

from harness.simulators import SimulatorProcess, start_simulator

CHAT = {"model": "llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def gpu() -> Iterator[SimulatorProcess]:
    # A quiet device of its own, at real speed: its 0.4 s wake-up is the profile's.
    with start_simulator("gpu") as sim:
        yield sim


def test_a_sleeping_engine_draws_its_parked_power_and_refuses_until_woken(gpu) -> None:
    with httpx.Client(base_url=gpu.url, timeout=30) as client:
        assert client.get("/is_sleeping").json() == {"is_sleeping": False}
        assert client.post("/sleep", params={"level": 1}).status_code == 200
        assert client.get("/is_sleeping").json() == {"is_sleeping": True}
        assert gpu.metric("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(70.0)
        refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "sleeping"
        assert client.get("/health").status_code == 200  # the server is up, as vLLM's is

        assert client.post("/wake_up").status_code == 200  # answers once it serves
        assert client.get("/is_sleeping").json() == {"is_sleeping": False}
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert gpu.metric("DCGM_FI_DEV_POWER_USAGE") > 70.0
