"""The routing benchmark replays a trace through the real router on a virtual clock."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from gatewayserver import run_gateway
from simproc import start_simulator

from gateway.cli import main
from gateway.policy.load import load_policy, parse_policy
from gateway.policy.model import Policy
from gateway.replay.bench import benchmark, run_live_comparison
from gateway.replay.strategies import ROUTED, STRATEGIES
from gateway.replay.trace import TraceRequest, read_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "azure_llm_2023_conv_head.csv"  # tests/data/README.md
SLICE = 300


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(ROOT / "policies" / "default.yaml")


@pytest.fixture(scope="module")
def requests() -> list[TraceRequest]:
    return read_trace(TRACE, limit=SLICE)


@pytest.fixture(scope="module")
def results(policy: Policy, requests: list[TraceRequest]) -> dict[str, dict[str, Any]]:
    return benchmark(policy, requests, seed=7)


def without_wall_time(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: {k: v for k, v in r.items() if k != "wall_s"} for name, r in results.items()}


def test_every_strategy_serves_the_whole_slice(results: dict[str, dict[str, Any]]) -> None:
    assert set(results) == set(STRATEGIES)
    for name, result in results.items():
        assert result["requests"] == SLICE, name
        assert result["served"] == SLICE, name
        assert sum(result["pool_shares"].values()) == pytest.approx(1.0, abs=1e-3), name
        assert 0.0 <= result["slo_attainment"] <= 1.0


def test_fleet_energy_covers_the_energy_above_idle(results: dict[str, dict[str, Any]]) -> None:
    for name, result in results.items():
        assert result["fleet_energy_j"] >= result["energy_above_idle_j"] > 0, name
        assert result["energy_j_per_request"] * SLICE == pytest.approx(
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


def test_the_oracle_costs_no_more_than_any_routed_strategy(
    results: dict[str, dict[str, Any]],
) -> None:
    bound = results["oracle"]["cost_usd_per_1k_tokens"]
    for name in ROUTED:
        assert bound <= results[name]["cost_usd_per_1k_tokens"], name
        assert results["oracle"]["energy_j_per_request"] <= results[name]["energy_j_per_request"]


def test_the_learned_router_retrains_on_what_it_measured(
    results: dict[str, dict[str, Any]],
) -> None:
    model = results["learned"]["cost_model"]
    assert model["version"] >= 1
    assert sum(model["observations"].values()) == SLICE
    assert model["training_failures"] == 0


def test_a_replay_is_deterministic_for_a_seed(
    policy: Policy, requests: list[TraceRequest], results: dict[str, dict[str, Any]]
) -> None:
    again = benchmark(policy, requests, strategies=("learned", "round-robin"), seed=7)
    first = without_wall_time(results)
    assert without_wall_time(again) == {name: first[name] for name in again}


def test_saturated_pools_queue_then_refuse_and_refusals_miss_the_slo(policy: Policy) -> None:
    burst = read_trace(TRACE, limit=600, rate_scale=30.0)
    result = benchmark(policy, burst, strategies=("static",))["static"]
    assert result["queued_share"] > 0
    assert result["refused"] > 0
    assert result["served"] + result["refused"] == 600
    assert result["slo_attainment"] <= result["served"] / 600 + 1e-5  # rounded to 5 places


def test_rate_scale_compresses_arrivals() -> None:
    normal = read_trace(TRACE, limit=50)
    doubled = read_trace(TRACE, limit=50, rate_scale=2.0)
    assert doubled[-1].arrival_s == pytest.approx(normal[-1].arrival_s / 2)
    assert [r.output_tokens for r in doubled] == [r.output_tokens for r in normal]


def test_bench_routing_command_writes_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "routing.json"
    policy = str(ROOT / "policies" / "default.yaml")
    command = ["bench", "routing", "--trace", str(TRACE), "--out", str(out), "--limit", "120"]
    status = main([*command, "--policy", policy, "--seed", "3"])
    assert status == 0
    document = json.loads(out.read_text())
    assert document["requests"] == 120 and document["seed"] == 3
    assert set(document["strategies"]) == set(STRATEGIES)
    for name, result in document["strategies"].items():
        for key in (
            "energy_j_per_request",
            "fleet_energy_j",
            "cost_usd_per_1k_tokens",
            "slo_attainment",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "pool_shares",
        ):
            assert key in result, (name, key)
    assert "mape_after_500" in document["strategies"]["learned"]["cost_model"]
    assert "slo_attainment" in document["targets"]
    assert "learned" in capsys.readouterr().out


def test_bench_routing_command_names_a_missing_trace(tmp_path: Path) -> None:
    status = main(
        ["bench", "routing", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o")]
    )
    assert status == 2


def test_live_mode_sends_the_slice_through_a_running_gateway_as_the_replay_predicts(
    tmp_path: Path,
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
        with run_gateway(parse_policy(policy_path.read_text()), tmp_path) as gw:
            document = run_live_comparison(
                gw.url, TRACE, out, policy_path, speed=speed, limit=60, seed=1
            )
    assert json.loads(out.read_text())["live"] == document["live"]
    assert document["live"]["served"] == 60
    for pool, shares in document["comparison"]["pool_shares"].items():
        assert shares["live"] == pytest.approx(shares["virtual"], abs=0.1), pool
