"""Scenarios: events the router must measure, tariffs it knows, on the replay's virtual clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.definition import Policy
from gateway.policy.tariffs import Rate
from gateway.whatif.trace import TraceRequest
from lab.bench import benchmark
from lab.scenario import Scenario, ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_scenario_loads_and_names_only_pools_of_the_default_policy(
    policy: Policy,
) -> None:
    shipped = sorted((ROOT / "bench" / "scenarios").glob("*.yaml"))
    assert len(shipped) >= 4
    for path in shipped:
        scenario = load_scenario(path)
        scenario.check(policy)
        assert scenario.events or scenario.tariffs, path.name


def test_a_scenario_off_the_format_is_refused_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("events:\n  - {pool: asic, start_s: 10, end_s: 5, slow_factor: 2}\n")
    with pytest.raises(ScenarioError, match=r"events\.0: .*end_s \(5\) must be after start_s"):
        load_scenario(bad)
    bad.write_text("events:\n  - {pool: asic, start_s: 0, end_s: 5, slow: 2}\n")
    with pytest.raises(ScenarioError, match=r"events\.0\.slow: Extra inputs"):
        load_scenario(bad)


def test_a_scenario_naming_a_pool_or_backend_the_policy_lacks_is_refused(policy: Policy) -> None:
    with pytest.raises(ScenarioError, match="pool 'tpu'"):
        Scenario.model_validate({"events": [{"pool": "tpu", "start_s": 0, "end_s": 1}]}).check(
            policy
        )
    with pytest.raises(ScenarioError, match="backend 'gpu-9'"):
        Scenario.model_validate(
            {"events": [{"pool": "gpu", "backend": "gpu-9", "start_s": 0, "end_s": 1}]}
        ).check(policy)


def test_events_in_force_multiply_and_a_pools_own_tariff_wins(policy: Policy) -> None:
    scenario = Scenario.model_validate(
        {
            "events": [
                {"pool": "asic", "start_s": 0, "end_s": 10, "slow_factor": 2},
                {"pool": "asic", "backend": "asic-0", "start_s": 5, "end_s": 20, "slow_factor": 3},
            ],
            "tariffs": [
                {"start_s": 0, "end_s": 100, "usd_per_kwh": 0.3, "g_co2_per_kwh": 300},
                {
                    "pool": "gpu",
                    "start_s": 50,
                    "end_s": 100,
                    "usd_per_kwh": 0.9,
                    "g_co2_per_kwh": 9,
                },
            ],
        }
    )
    assert [scenario.factors("asic", "asic-0", t)[0] for t in (1, 7, 15, 25)] == [2, 6, 3, 1]
    assert scenario.rate(policy, "gpu", 10) == Rate(0.3, 300)
    assert scenario.rate(policy, "gpu", 60) == Rate(0.9, 9)
    assert scenario.rate(policy, "asic", 60) == Rate(0.3, 300)
    own = policy.pools["asic"].price
    assert scenario.rate(policy, "asic", 150) == Rate(own.usd_per_kwh, own.g_co2_per_kwh)


def unexplored(policy: Policy) -> Policy:
    """Return the policy with no route exploring: every request where its ranking puts it."""
    routes = [r.model_copy(update={"explore": 0.0}) for r in policy.routes]
    return policy.model_copy(update={"routes": routes})


def steady(n: int, every_s: float = 0.5) -> list[TraceRequest]:
    return [TraceRequest(i * every_s, 800, 100) for i in range(n)]


def test_a_throttled_pool_serves_slower_and_draws_more_where_the_event_holds(
    policy: Policy,
) -> None:
    policy = unexplored(policy)
    plain = benchmark(policy, steady(80), strategies=("static",))["static"]
    throttled = Scenario.model_validate(
        {"events": [{"pool": "asic", "start_s": 0, "end_s": 3600, "slow_factor": 3}]}
    )
    slow = benchmark(policy, steady(80), strategies=("static",), scenario=throttled)["static"]
    assert slow["tpot_p50_ms"] > 2.5 * plain["tpot_p50_ms"]
    hot = Scenario.model_validate(
        {"events": [{"pool": "asic", "start_s": 0, "end_s": 3600, "power_factor": 2}]}
    )
    hungry = benchmark(policy, steady(80), strategies=("static",), scenario=hot)["static"]
    assert hungry["energy_j_per_request"] == pytest.approx(
        2 * plain["energy_j_per_request"], rel=0.01
    )
    assert hungry["tpot_p50_ms"] == plain["tpot_p50_ms"]


def test_tariffs_price_the_energy_drawn_while_they_hold_and_move_routers_that_read_them(
    policy: Policy,
) -> None:
    """From 20 s the ASIC's electricity costs 2,000 times as much: the cost of the energy it
    draws after that changes, and a router pricing energy at the rate in force (learned, the
    oracle) moves to the GPU at the boundary, where a fixed order cannot."""
    policy = unexplored(policy)
    peak = Scenario.model_validate(
        {
            "tariffs": [
                {"pool": "asic", "start_s": 20, "end_s": 3600, "usd_per_kwh": 240.0,
                 "g_co2_per_kwh": 500.0},
            ]
        }
    )  # fmt: skip
    results = benchmark(
        policy, steady(80), strategies=("static", "learned", "oracle"), scenario=peak
    )
    plain = benchmark(policy, steady(80), strategies=("static",))["static"]
    static, oracle = results["static"], results["oracle"]
    assert static["pool_shares"] == plain["pool_shares"]  # a fixed order does not see it
    assert static["cost_usd_per_1k_tokens"] > 10 * plain["cost_usd_per_1k_tokens"]
    assert static["carbon_g_per_request"] > plain["carbon_g_per_request"]
    # Before 20 s the ASIC is cheapest; from then on, the GPU: the 40 requests before stay.
    for moved in (results["learned"], oracle):
        assert moved["pool_shares"]["asic"] == pytest.approx(0.5)
        assert moved["cost_usd_per_1k_tokens"] < static["cost_usd_per_1k_tokens"] / 5


def test_each_phase_of_a_scenario_is_measured_on_the_requests_that_arrived_in_it(
    policy: Policy,
) -> None:
    """Cut at the tariff's start, the fixed order's stretch before it costs what the plain
    trace's first half does, the one after it far more; the oracle moves to the GPU there."""
    policy = unexplored(policy)
    peak = Scenario.model_validate(
        {
            "tariffs": [
                {"pool": "asic", "start_s": 20, "end_s": 3600, "usd_per_kwh": 240.0,
                 "g_co2_per_kwh": 500.0},
            ]
        }
    )  # fmt: skip
    results = benchmark(policy, steady(80), strategies=("static", "oracle"), scenario=peak)
    static, oracle = results["static"]["phases"], results["oracle"]["phases"]
    assert [(p["start_s"], p["end_s"], p["requests"]) for p in static] == [
        (0.0, 20, 40),
        (20, None, 40),
    ]
    before, after = static
    assert after["cost_usd_per_1k_tokens"] > 10 * before["cost_usd_per_1k_tokens"]
    assert before["pool_shares"] == after["pool_shares"]
    assert oracle[1]["pool_shares"]["gpu"] == 1.0
    assert oracle[1]["cost_usd_per_1k_tokens"] < after["cost_usd_per_1k_tokens"] / 5
    # The stretches add up to the whole: their energy, weighed by their requests.
    whole = results["static"]["energy_j_per_request"] * 80
    assert sum(p["energy_j_per_request"] * p["requests"] for p in static) == pytest.approx(
        whole, rel=1e-3
    )
    assert "phases" not in benchmark(policy, steady(10), strategies=("static",))["static"]


def test_every_strategy_draws_over_the_same_window_when_the_scenario_outlasts_the_trace(
    policy: Policy,
) -> None:
    """A scenario whose last boundary lies past the trace's end and drain (the shipped ones run
    to 4,000 s) must not stretch the window of a strategy that reads no meter: its fleet would
    be charged idle time the learned router's is not."""
    outlasting = Scenario.model_validate(
        {"events": [{"pool": "asic", "start_s": 0, "end_s": 3600, "power_factor": 1.0}]}
    )
    results = benchmark(
        policy, steady(40), strategies=("learned", "static", "oracle"), scenario=outlasting
    )
    plain = benchmark(policy, steady(40), strategies=("static",))["static"]
    windows = {name: result["duration_s"] for name, result in results.items()}
    assert set(windows.values()) == {plain["duration_s"]}, windows
    assert results["static"]["fleet_energy_j"] == pytest.approx(plain["fleet_energy_j"])


def test_the_fleets_carbon_is_all_its_energy_at_the_intensity_in_force(policy: Policy) -> None:
    """Idle draw included: at one intensity everywhere it is the fleet's energy times it; a
    dirtier grid for the second half of the window raises it by that half's idle draw at least."""
    grams_per_kwh = 500.0
    flat = Scenario.model_validate(
        {
            "tariffs": [
                {"start_s": 0, "end_s": 3600, "usd_per_kwh": 0.1, "g_co2_per_kwh": grams_per_kwh}
            ]
        }
    )
    result = benchmark(policy, steady(40), strategies=("static",), scenario=flat)["static"]
    assert result["fleet_carbon_g"] == pytest.approx(
        result["fleet_energy_j"] * grams_per_kwh / 3.6e6, rel=1e-3
    )
    assert result["fleet_carbon_g"] > result["carbon_g_per_request"] * 40
    half = result["duration_s"] / 2
    dirtier = Scenario.model_validate(
        {
            "tariffs": [
                {"start_s": 0, "end_s": half, "usd_per_kwh": 0.1, "g_co2_per_kwh": grams_per_kwh},
                {"start_s": half, "end_s": 3600, "usd_per_kwh": 0.1, "g_co2_per_kwh": 2000},
            ]
        }
    )
    later = benchmark(policy, steady(40), strategies=("static",), scenario=dirtier)["static"]
    assert later["fleet_energy_j"] == pytest.approx(result["fleet_energy_j"])
    assert later["fleet_carbon_g"] > 1.5 * result["fleet_carbon_g"]
