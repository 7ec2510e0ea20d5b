"""Parking in the replay: backends the forecast does not need are drained, switched off and
woken again, and no request runs on a backend while it is off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bench.parking_minutes import off_during
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, to_yaml
from gateway.whatif.scorecard import summarize
from gateway.whatif.timeline import Replay
from gateway.whatif.trace import read_trace
from lab.bench import benchmark, parking_targets
from lab.strategies import strategy_for


def test_a_quiet_fleet_parks_a_gpu_saves_energy_and_runs_nothing_on_it_while_off(
    policy: Policy, trace: Path
) -> None:
    requests = read_trace(trace, limit=1500)
    replay = Replay(strategy_for("learned-parked", policy), requests).run()
    spans = off_during(replay)
    assert spans, "the trace's head keeps far less than two GPUs busy"
    for passage in replay.passages:
        if passage.admitted_s is None or passage.backend is None:
            continue
        job = passage.job
        assert job is not None and job.finished_at is not None
        for start, end in spans.get(passage.backend.state.name, []):
            assert job.finished_at <= start or passage.admitted_s >= end
    # Every request's energy was settled and learned from, those of backends parked after it too.
    learner = replay.strategy.learner
    assert learner is not None and sum(learner.seen.values()) == len(requests)
    results = benchmark(policy, requests, strategies=("learned", "learned-parked"))
    on, parked = results["learned"], results["learned-parked"]
    assert parked["fleet_energy_j"] < on["fleet_energy_j"]
    assert parked["served"] == on["served"] == len(requests)
    assert parked["slo_attainment"] >= on["slo_attainment"] - 0.002
    assert parked["parking"]["parks"] >= 1
    assert parked["parking"]["mean_backends_on"] < parked["parking"]["backends"]
    assert "parking" not in on
    assert 0 < parked["parking"]["parked_energy_j"] < parked["fleet_energy_j"]
    checks = parking_targets(results)
    ratio = parked["fleet_energy_j"] / on["fleet_energy_j"]
    assert checks["parked_fleet_energy_vs_always_on"]["value"] == round(ratio, 4)
    assert checks["parked_late_wake_ups"]["met"] == (parked["parking"]["late_wake_ups"] == 0)
    assert parking_targets({"learned": on}) == {}


def test_a_burst_wakes_parked_backends(policy: Policy, trace: Path) -> None:
    # The head at its own rate, then the same requests thirty times as fast.
    quiet = read_trace(trace, limit=1500)
    end = quiet[-1].arrival_s
    burst = [replace(r, arrival_s=end + 1 + r.arrival_s / 30) for r in quiet[:600]]
    replay = Replay(strategy_for("learned-parked", policy), quiet + burst).run()
    offs = [m for m in replay.moves if m[2] == "off"]
    wakes = [m for m in replay.moves if m[2] == "wake"]
    assert offs and wakes
    assert any(at > end for at, *_ in wakes)


def test_pools_serving_none_of_the_traces_models_are_left_alone(
    policy: Policy, trace: Path
) -> None:
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    big = doc["pools"]["gpu-70b"]["backends"]
    big.append({**big[0], "name": "gpu-70b-1", "url": "http://127.0.0.1:9"})
    two = parse_policy(to_yaml(doc), "two-big.yaml")
    replay = Replay(strategy_for("learned-parked", two), read_trace(trace, limit=1500)).run()
    assert replay.moves and all(not b.startswith("gpu-70b") for _, b, *_ in replay.moves)


def parking(policy: Policy, block: dict) -> Policy:
    """Return the policy with the GPU pool parked through `block`."""
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    doc["pools"]["gpu"]["parking"] = block
    return parse_policy(to_yaml(doc), "parked.yaml")


def test_a_released_device_draws_nothing_and_its_hours_are_not_paid(
    policy: Policy, trace: Path
) -> None:
    release = {
        "hook": "command",
        "mode": "release",
        "park_command": ["fleetctl", "release", "{name}"],
        "wake_command": ["fleetctl", "provision", "{name}"],
        "wake_s": 180,
        "hook_timeout_s": 600,
    }
    # At half its rate: at its own, the head's prompts take more than a fifth of one GPU's time
    # at their peak, and the plan keeps both on (gateway/parking/plan.py, PREFILL_SHARE).
    requests = read_trace(trace, limit=1500, rate_scale=0.5)
    replay = Replay(strategy_for("learned-parked", parking(policy, release)), requests).run()
    spans = off_during(replay)
    assert spans, "the trace's head keeps far less than two GPUs busy"
    end = max(sim.device.time for sim in replay.world.values())
    off_s = {name: sum(min(b, end) - a for a, b in s) for name, s in spans.items()}
    assert all(replay.released_s(name) == off_s.get(name, 0.0) for name in replay.world)
    assert replay.parked_energy_j == 0.0  # powered down: not even a sleeping board's draw
    # The fleet's cost pays each device's hours but for those it spent released.
    summary = summarize(replay)
    tokens_k = sum(p.request.output_tokens for p in replay.passages if p.served) / 1000
    hours_usd = 0.0
    for name, sim in replay.world.items():
        price = replay.policy.pools[sim.state.pool].price
        energy_usd = sim.energy_usd + sim.device.idle_energy_j * price.usd_per_kwh / 3.6e6
        hours_usd += (sim.device.time - off_s.get(name, 0.0)) * price.usd_per_hour / 3600
        hours_usd += energy_usd
    assert summary["fleet_cost_usd_per_1k_tokens"] == round(hours_usd / tokens_k, 9)
    parked = summary["parking"]
    assert isinstance(parked, dict) and parked["released_s"] == round(sum(off_s.values()), 1)

    # Put to sleep instead, the same device draws its parked power and its hours are paid.
    sleep = {"hook": "vllm", "wake_s": 0.4}
    asleep = Replay(strategy_for("learned-parked", parking(policy, sleep)), requests).run()
    assert off_during(asleep) and asleep.parked_energy_j > 0
    assert all(asleep.released_s(name) == 0.0 for name in asleep.world)
