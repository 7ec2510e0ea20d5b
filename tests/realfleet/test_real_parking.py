"""Parking on the real fleet: the command hook stops a llama.cpp engine and starts it again.

Two f16 engines form the GPU pool; the gateway parks one when traffic stops (its process
stopped: nothing listens on its port), and starts it again when traffic returns, sending it
requests only once its /health answers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from realworld import require_engine
from switching import HOOK, switched, up
from waiting import wait_for

from gateway.policy.definition import Policy
from harness.gateways import GatewayServer, run_gateway
from policies import pool
from realfleet import engine
from realfleet.corpus import MODEL
from realfleet.fleet import BACKENDS, models, spec


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """Two f16 engines started through the hook, and stopped through it after the test."""
    require_engine()
    files = models(engine.cache_dir())
    gpu = next(b for b in BACKENDS if b.part == "f16")
    state = tmp_path / "engines"
    commands = [spec(gpu, files, seed=seed).args for seed in (1, 2)]
    with switched(commands, state, timeout_s=120) as urls:
        yield urls, state


def chat(server: GatewayServer, tokens: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}]}
    return httpx.post(
        server.url + "/v1/chat/completions", json=body | {"max_tokens": tokens}, timeout=120
    )


def test_the_command_hook_stops_an_idle_engine_and_starts_it_for_returning_traffic(
    engines: tuple[list[str], Path], tmp_path: Path
) -> None:
    urls, state = engines
    gpu = pool("gpu", urls, [MODEL], max_context=2048, slots_per_backend=2, engine="llamacpp")
    gpu["power_metrics"] = None
    gpu["parking"] = {
        "hook": "command",
        "wake_s": 0.2,
        "park_command": [*HOOK, "park", "{url}", str(state)],
        "wake_command": [*HOOK, "wake", "{url}", str(state)],
    }
    policy = Policy.model_validate(
        {
            "default_slo_class": "interactive",
            "slo_classes": {"interactive": {"ttft_ms": 5000, "max_queue_ms": 30000}},
            "pools": {"gpu": gpu},
            "routes": [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}],
        }
    )
    with run_gateway(policy, tmp_path, parking_commands=[sys.executable]) as server:
        parker = server.gateway.parker
        parker.planner.window_s, parker.planner.short_s, parker.planner.hold_s = 3.0, 1.0, 1.0
        parker.drain_grace_s, parker.periodic.interval_s = 0.3, 0.2
        backends = server.gateway.fleet.pools["gpu"].backends

        def parked() -> str | None:
            return next((b.url for b in backends if b.parking == "parked"), None)

        stopped = wait_for(parked, timeout=60, message="no engine was parked")
        assert not up(stopped)  # its process is gone
        # Traffic returns: the engine is started again and serves, and no request failed.
        with ThreadPoolExecutor(4) as senders:
            answers = list(senders.map(lambda _: chat(server, 48), range(16)))
        assert [a.status_code for a in answers] == [200] * 16
        wait_for(
            lambda: all(b.parking == "" for b in backends) and up(stopped),
            timeout=60,
            message=lambda: f"not woken: {[(b.name, b.parking) for b in backends]}",
        )
        assert server.gateway.metrics.registry.get_sample_value(
            "gateway_backend_wakeups_total", {"pool": "gpu"}
        )
