"""Parking in the replay: backends the forecast does not need are drained, switched off and
woken again, and no request runs on a backend while it is off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gateway.policy.load import parse_policy, to_yaml
from gateway.policy.model import Policy
from gateway.replay.bench import benchmark, parking_targets
from gateway.replay.strategies import strategy_for
from gateway.replay.timeline import Replay
from gateway.replay.trace import read_trace


def off_spans(replay: Replay) -> dict[str, list[tuple[float, float]]]:
    """Return, per backend, when it was switched off: from its "off" to the next wake-up."""
    spans: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for at, backend, what, _ in replay.moves:
        if what == "off":
            since[backend] = at
        elif what == "wake" and backend in since:
            spans.setdefault(backend, []).append((since.pop(backend), at))
    for backend, at in since.items():
        spans.setdefault(backend, []).append((at, float("inf")))
    return spans


def test_a_quiet_fleet_parks_a_gpu_saves_energy_and_runs_nothing_on_it_while_off(
    policy: Policy, trace: Path
) -> None:
    requests = read_trace(trace, limit=1500)
    replay = Replay(strategy_for("learned-parked", policy), requests).run()
    spans = off_spans(replay)
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
