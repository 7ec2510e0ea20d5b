"""The routing benchmark replays a trace through the real router on a virtual clock."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy.load import parse_policy
from gateway.replay.bench import run_live_comparison
from gateway.replay.strategies import STRATEGIES
from gateway.replay.trace import TraceRequest
from harness.gateways import run_gateway
from harness.simulators import start_simulator

ROOT = Path(__file__).resolve().parents[2]


def test_every_strategy_serves_the_whole_slice(
    results: dict[str, dict[str, Any]], requests: list[TraceRequest]
) -> None:
    assert set(results) == set(STRATEGIES)
    for name, result in results.items():
        assert result["requests"] == len(requests), name
        assert result["served"] == len(requests), name
        assert sum(result["pool_shares"].values()) == pytest.approx(1.0, abs=1e-3), name
        assert 0.0 <= result["slo_attainment"] <= 1.0


def test_fleet_energy_covers_the_energy_above_idle(
    results: dict[str, dict[str, Any]], requests: list[TraceRequest]
) -> None:
    for name, result in results.items():
        assert result["fleet_energy_j"] >= result["energy_above_idle_j"] > 0, name
        assert result["energy_j_per_request"] * len(requests) == pytest.approx(
            result["energy_above_idle_j"], rel=1e-3
        )


def test_gpu_only_puts_every_request_on_the_gpu(results: dict[str, dict[str, Any]]) -> None:
    assert results["gpu-only"]["pool_shares"]["gpu"] == 1.0


def test_routing_to_the_asic_saves_energy_over_gpu_only(
    results: dict[str, dict[str, Any]],
) -> None:
    gpu_only = results["gpu-only"]["energy_j_per_request"]
    assert results["static"]["energy_j_per_request"] < gpu_only
    assert results["learned"]["energy_j_per_request"] < gpu_only


def test_live_mode_sends_the_slice_through_a_running_gateway_as_the_replay_predicts(
    tmp_path: Path, trace: Path
) -> None:
    speed = 10.0
    with contextlib.ExitStack() as stack:
        sims = {
            "gpu": [
                stack.enter_context(start_simulator("gpu", speed=speed, seed=s)) for s in (1, 2)
            ],
            "asic": [stack.enter_context(start_simulator("asic", speed=speed, seed=3))],
        }
        doc = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
        for name, pool in doc["pools"].items():
            urls = [s.url for s in sims.get(name, [])] or ["http://127.0.0.1:9"]
            pool["backends"] = [{"url": url} for url in urls]
        for route in doc["routes"]:
            route.pop("shadow", None)
            route.pop("noise_floor", None)
        policy_path = tmp_path / "policy.yaml"
        policy_path.write_text(yaml.safe_dump(doc))
        out = tmp_path / "live.json"
        # Seeded, the live gateway explores the same share of the 60 requests every run (the
        # replay's draws are seeded too), so only timing sets the two apart.
        policy = parse_policy(policy_path.read_text())
        with run_gateway(policy, tmp_path, routing_seed=1) as gw:
            document = run_live_comparison(
                gw.url, trace, out, policy_path, speed=speed, limit=60, seed=1
            )
    assert json.loads(out.read_text())["live"] == document["live"]
    assert document["live"]["served"] == 60
    for pool, shares in document["comparison"]["pool_shares"].items():
        assert shares["live"] == pytest.approx(shares["virtual"], abs=0.1), pool
