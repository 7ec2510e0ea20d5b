"""Serving engines' load series and other clients' load, as a real process publishes them.

Each engine's series are read back with the gateway's own reader, so the names, labels and
meanings the simulator publishes are the ones the gateway understands.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import httpx
import pytest
from waiting import wait_for

from gateway.upstream.engines import EngineLoad, read_engine
from harness.simulators import start_simulator

CHAT = "llama-3.1-8b-instruct"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "triton"])
def test_each_engine_reports_other_clients_requests_running_and_waiting(engine: str) -> None:
    flags = ["--engine", engine, "--slots", "4", "--kv-cache-tokens", "10000"]
    flags += ["--external-load", "3", "--external-prompt-tokens", "900"]
    flags += ["--external-output-tokens", "100"]
    with start_simulator("gpu", extra_args=flags) as sim:
        kv = None if engine == "tgi" else pytest.approx(0.3)
        assert read_engine(sim.metrics(), engine) == EngineLoad(3, 0, kv)
        assert sim.metric("sim_inflight_requests") == 3
        httpx.post(f"{sim.url}/admin/external-load", json={"requests": 6}).raise_for_status()
        kv = None if engine == "tgi" else pytest.approx(0.4)
        assert read_engine(sim.metrics(), engine) == EngineLoad(4, 2, kv)
        assert sim.metric("sim_peak_inflight_requests") == 6


def test_without_an_engine_no_engine_series_are_published() -> None:
    with start_simulator("gpu", extra_args=["--external-load", "2"]) as sim:
        text = sim.metrics()
        assert all(read_engine(text, engine) is None for engine in ("vllm", "sglang", "tgi"))
        assert sim.metric("sim_external_requests") == 2


def test_other_clients_requests_hold_back_the_requests_that_come_after_them() -> None:
    flags = ["--slots", "2", "--external-load", "2", "--engine", "vllm"]
    with start_simulator("gpu", extra_args=flags) as sim:
        body = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with httpx.Client(base_url=sim.url, timeout=60) as client, ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.post, "/v1/chat/completions", json=body)
            wait_for(
                lambda: read_engine(sim.metrics(), "vllm") == EngineLoad(2, 1, ANY),
                message="the request never queued behind the other clients' two",
            )
            assert not answer.done()
            client.post("/admin/external-load", json={"requests": 1}).raise_for_status()
            assert answer.result().status_code == 200
        assert sim.metric("sim_peak_inflight_requests") == 3


def test_a_bad_external_load_is_refused_naming_the_field() -> None:
    with start_simulator("gpu") as sim:
        answer = httpx.post(f"{sim.url}/admin/external-load", json={"requests": -1})
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == "requests"
        assert httpx.get(f"{sim.url}/admin/external-load").json()["requests"] == 0
