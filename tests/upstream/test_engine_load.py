"""Backends shared with other clients: the gateway reads their engines' load and keeps to it.

Each simulator runs as a serving engine (`--engine`) that other clients also use
(`--external-load`); the gateway learns that load only from the engine's series on its
metering scrape. Streams are held open until the test has seen where everything stands.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
from llamacpp import captured, llama_policy, llama_server
from waiting import wait_for

from gateway.fleet.engine_blocks import BLOCK_TOKENS
from gateway.fleet.state import prefix_capacity
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, to_yaml
from harness.gateways import GatewayServer, run_gateway
from harness.metrics import metric_value
from harness.simulators import start_simulator
from policies import MODEL, pool

SCRAPE_S = 0.05


def shared_policy(urls: list[str], engine: str | None, slots: int = 4) -> Policy:
    doc = {
        "default_slo_class": "interactive",
        "slo_classes": {
            # Waiting in the gateway's queue is what these tests watch: a budget (the least of
            # max_queue_ms and the TTFT target) no busy machine outlasts.
            "interactive": {"ttft_ms": 60000, "max_queue_ms": 60000, "timeout_s": 60},
        },
        "pools": {"gpu": pool("gpu", urls, [MODEL], slots_per_backend=slots, engine=engine)},
        "routes": [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}],
    }
    return parse_policy(to_yaml(doc), "shared.yaml")


@contextlib.contextmanager
def held_streams(gw: GatewayServer, n: int) -> Iterator[None]:
    """Open n long streams at once; each reads its first chunk, then waits for the block's end."""
    client = gw.client(timeout=120)
    release = threading.Event()

    def one() -> bool:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=20000,
            extra_body={"ignore_eos": True},
            stream=True,
        )
        with stream:
            next(iter(stream))
            release.wait(120)
        return True

    with ThreadPoolExecutor(n) as threads:
        held = [threads.submit(one) for _ in range(n)]
        yield
        release.set()
        assert all(f.result() for f in held)


def waiting_in_gateway(gw: GatewayServer) -> int:
    return len(gw.gateway.fleet.pools["gpu"].waiters)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "triton"])
def test_a_shared_backend_is_never_sent_more_than_its_slots(engine: str, tmp_path: Path) -> None:
    flags = ["--engine", engine, "--slots", "4", "--external-load", "3"]
    with start_simulator("gpu", speed=1, extra_args=flags) as sim:
        policy = shared_policy([sim.url], engine)
        gateway = run_gateway(policy, tmp_path, power_scrape_interval_s=SCRAPE_S)
        with gateway as gw, held_streams(gw, 3):
            # One stream takes the slot the other clients left; two wait in the gateway.
            wait_for(
                lambda: waiting_in_gateway(gw) == 2 and sim.metric("sim_inflight_requests") == 4,
                message=lambda: (
                    f"{waiting_in_gateway(gw)} waiting, "
                    f"{sim.metric('sim_inflight_requests')} on the backend"
                ),
            )
            assert gw.gateway.fleet.pools["gpu"].backends[0].external == 3
        assert sim.metric("sim_peak_inflight_requests") == 4


def test_without_the_engines_figures_the_same_load_overfills_the_backend(tmp_path: Path) -> None:
    """The control: a pool naming no engine sees only its own requests."""
    flags = ["--engine", "vllm", "--slots", "4", "--external-load", "3"]
    with start_simulator("gpu", speed=1, extra_args=flags) as sim:
        with run_gateway(shared_policy([sim.url], None), tmp_path) as gw, held_streams(gw, 3):
            wait_for(
                lambda: sim.metric("sim_inflight_requests") == 6,
                message=lambda: f"{sim.metric('sim_inflight_requests')} on the backend",
            )
        assert sim.metric("sim_peak_inflight_requests") == 6


def backend_of(gw: GatewayServer) -> str:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return raw.headers["x-gateway-backend"]


def gauge(gw: GatewayServer, name: str, backend: str) -> float:
    return metric_value(gw.http().get("/metrics").text, name, backend=backend)


def test_a_backend_whose_kv_cache_is_full_is_routed_around_until_it_has_room(
    tmp_path: Path,
) -> None:
    full = ["--engine", "vllm", "--kv-cache-tokens", "10000", "--external-load", "1"]
    full += ["--external-prompt-tokens", "9800"]
    with (
        start_simulator("gpu", extra_args=full) as crowded,
        start_simulator("gpu", extra_args=["--engine", "vllm"]) as roomy,
    ):
        policy = shared_policy([crowded.url, roomy.url], "vllm", slots=32)
        settings = {"power_scrape_interval_s": SCRAPE_S, "admin_token": "admin"}
        with run_gateway(policy, tmp_path, **settings) as gw:
            # By the gateway's own count both backends are empty, and the crowded one comes
            # first: only its engine's figures keep requests off it.
            assert gauge(gw, "gateway_backend_engine_full", "gpu-0") == 1
            assert {backend_of(gw) for _ in range(6)} == {"gpu-1"}
            explained = gw.http().post(
                "/admin/explain",
                json={"body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}},
                headers={"authorization": "Bearer admin"},
            )
            httpx.post(f"{crowded.url}/admin/external-load", json={"requests": 0})
            wait_for(
                lambda: (
                    gauge(gw, "gateway_backend_engine_full", "gpu-0") == 0
                    and gauge(gw, "gateway_backend_external_requests", "gpu-0") == 0
                ),
                message="gpu-0 never had room",
            )
            assert backend_of(gw) == "gpu-0"
    crowded_pool = explained.json()["pools"]["gpu"]["backends"]
    assert crowded_pool[0]["engine_full"] == "its engine's KV cache is 100% full"
    assert crowded_pool[0]["external"] == 1


def test_an_engine_that_reports_nothing_leaves_the_gateways_own_bookkeeping(
    tmp_path: Path,
) -> None:
    with (
        start_simulator("gpu", extra_args=["--slots", "4"]) as sim,  # no engine series
        run_gateway(shared_policy([sim.url], "sglang"), tmp_path) as gw,
    ):
        assert backend_of(gw) == "gpu-0"
        backend = gw.gateway.fleet.pools["gpu"].backends[0]
        assert (backend.external, backend.engine_full, backend.free_slots) == (0, "", 4)


def test_a_llamacpp_engine_that_defers_is_sent_nothing_and_its_cache_and_speed_are_shown(
    tmp_path: Path,
) -> None:
    admin = {"authorization": "Bearer admin"}
    ask = {"body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}}
    settings = {"power_scrape_interval_s": SCRAPE_S, "admin_token": "admin"}
    # llama-server with its three slots busy and a fourth request deferred, as it said it.
    with (
        llama_server(metrics="metrics-busy.txt") as server,
        run_gateway(llama_policy(server.url), tmp_path, **settings) as gw,
    ):
        backend = gw.gateway.fleet.pools["llama"].backends[0]
        wait_for(lambda: backend.engine_full != "", message="llama-0 never read as full")
        busy = (
            gw.http().post("/admin/explain", json=ask, headers=admin).json(),
            gw.http().get("/admin/fleet", headers=admin).json(),
            gw.http().get("/metrics").text,
        )
        server.metrics = captured("metrics-after.txt").decode()
        wait_for(
            lambda: (
                gauge(gw, "gateway_backend_engine_full", "llama-0") == 0
                and gauge(gw, "gateway_backend_external_requests", "llama-0") == 0
            ),
            message="llama-0 never had room",
        )
        assert backend_of(gw) == "llama-0"
        after = gw.http().get("/metrics").text
        # A window in which no request finished has no speed: the last one measured holds.
        server.metrics = server.metrics.replace(
            "predicted_tokens_seconds 252.496", "predicted_tokens_seconds 0"
        ).replace("prompt_tokens_total 106", "prompt_tokens_total 0")
        wait_for(
            lambda: gauge(gw, "gateway_backend_engine_prompt_cached_ratio", "llama-0") == 1,
            message="llama-0's idle window was never read",
        )
        held = gauge(gw, "gateway_backend_engine_generation_tokens_per_second", "llama-0")
    explained, fleet, text = busy
    (shown,) = explained["pools"]["llama"]["backends"]
    (listed,) = fleet[0]["backends"]
    for figures in (shown, listed):
        assert figures["engine_full"] == "its engine has 1 request waiting"
        assert figures["external"] == 4  # none of them the gateway's
        assert figures["engine_cached_share"] == pytest.approx(93 / (99 + 93))
        assert figures["engine_tokens_per_s"] == pytest.approx(689.951)
    assert gauge_in(text, "gateway_backend_engine_full") == 1
    assert gauge_in(text, "gateway_backend_engine_prompt_cached_ratio") == pytest.approx(93 / 192)
    assert gauge_in(text, "gateway_backend_engine_generation_tokens_per_second") == 689.951
    assert gauge_in(after, "gateway_backend_external_requests") == 0
    assert gauge_in(after, "gateway_backend_engine_prompt_cached_ratio") == pytest.approx(310 / 416)
    assert gauge_in(after, "gateway_backend_engine_generation_tokens_per_second") == 252.496
    assert held == 252.496


def gauge_in(text: str, name: str) -> float:
    return metric_value(text, name, pool="llama", backend="llama-0")


def test_a_vllm_backend_reports_its_prefix_caches_share_of_prompt_tokens(tmp_path: Path) -> None:
    system = "You answer questions about the routing gateway's fleet, briefly and exactly. " * 30
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Slots?"}]
    with start_simulator("gpu", extra_args=["--engine", "vllm"]) as sim:
        policy = shared_policy([sim.url], "vllm")
        with run_gateway(policy, tmp_path, power_scrape_interval_s=SCRAPE_S) as gw:
            client = gw.client()
            answers = [
                client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
                for _ in range(2)
            ]
            cached = answers[1].usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
            prompt = answers[0].usage.prompt_tokens  # type: ignore[union-attr]
            # The engine looked up both prompts and found the second's cached part.
            share = cached / (2 * prompt)
            wait_for(
                lambda: (
                    gauge(gw, "gateway_backend_engine_prompt_cached_ratio", "gpu-0")
                    == pytest.approx(share)
                ),
                message=lambda: str(gw.gateway.fleet.pools["gpu"].backends[0]),
            )
    assert cached > prompt / 2


def test_a_llamacpp_backend_is_expected_to_keep_no_more_than_its_slots_say(
    tmp_path: Path,
) -> None:
    settings = {"power_scrape_interval_s": SCRAPE_S}
    with (
        llama_server() as server,
        run_gateway(llama_policy(server.url), tmp_path, **settings) as gw,
    ):
        prefixes, policy = gw.gateway.fleet.prefixes, gw.gateway.policy
        declared = prefix_capacity(policy, policy.pools["llama"], BLOCK_TOKENS)
        # Its slots keep 34 prompt tokens (slots.json): not one whole block of 64.
        wait_for(lambda: prefixes.capacity("llama-0") == 0, message="the slots never bounded it")
        assert declared > 1000
        # Four slots holding 2,000 tokens each: 125 blocks.
        server.slots = orjson.dumps([{"id": i, "n_prompt_tokens": 2000} for i in range(4)]).decode()
        wait_for(lambda: prefixes.capacity("llama-0") == 125, message="never read again")
        server.slots = "<html>no slots here</html>"  # a build without the endpoint says nothing
        wait_for(lambda: prefixes.capacity("llama-0") == declared, message="never unbounded")
