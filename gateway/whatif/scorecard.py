"""Measure a replay: energy, cost, SLO attainment, latency and where requests went.

Cost charges what routing controls: each pool's energy above idle at its electricity's price
when it was drawn (the conditions' rate: a scenario's tariffs, else the policy's price), and the
slot time its requests held (admission to last token) at its hourly price divided by its slots:
a backend's hourly price buys `slots` slots, as the router's marginal cost assumes. Carbon is
the same energy at the electricity's carbon intensity. The fleet's cost, every device for the whole
window with its idle draw, and its carbon, all its energy at the intensity in force when it was
drawn, are reported beside them; a device released by parking (`mode: release`) draws nothing
and its hours are not paid while it is, but both are while it wakes.

Goodput is the share of requests served within `GOODPUT_TTFT_S` to the first token (queueing
included) and `GOODPUT_TPOT_S` a token after it, whatever their SLO class: the bar DistServe and
Mooncake measure serving by, the same for every policy a replay runs.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter, defaultdict
from collections.abc import Sequence

from gateway.stats import percentile
from gateway.whatif.conditions import STEADY, Conditions, ReplayRates
from gateway.whatif.hardware import Hardware
from gateway.whatif.strategy import Strategy
from gateway.whatif.timeline import START_S, FleetReading, Passage, Replay
from gateway.whatif.trace import TraceRequest

GOODPUT_TTFT_S = 2.0
GOODPUT_TPOT_S = 0.050
# Every replay's fleet is measured over the same window: the trace, then this long to drain.
DRAIN_S = 60.0


def measure(
    strategy: Strategy,
    requests: Sequence[TraceRequest],
    *,
    seed: int = 0,
    conditions: Conditions = STEADY,
    rates: ReplayRates | None = None,
    hardware: Hardware | None = None,
) -> dict[str, object]:
    """Replay the requests through a strategy, over the window every replay of them shares, on
    devices of `hardware` (the simulator's by default); return its figures. `rates` are the
    ones its router reads, if it reads any."""
    return summarize(
        replayed(
            strategy, requests, seed=seed, conditions=conditions, rates=rates, hardware=hardware
        )
    )


def replayed(
    strategy: Strategy,
    requests: Sequence[TraceRequest],
    *,
    seed: int = 0,
    conditions: Conditions = STEADY,
    rates: ReplayRates | None = None,
    hardware: Hardware | None = None,
    marks: Sequence[float] = (),
) -> Replay:
    """Replay the requests through a strategy, over the window every replay of them shares, on
    devices of `hardware` (the simulator's by default); return the finished replay, with the
    fleet's counters read at each of `marks` (trace seconds)."""
    # The seed sets what the live gateway leaves to chance: where the meter's readings fall
    # relative to requests, and the draw per request (a canary's share, exploring).
    run = Replay(
        strategy,
        requests,
        meter_phase_s=random.Random(seed).random(),
        conditions=conditions,
        rates=rates,
        draw=random.Random(seed).random,
        hardware=hardware,
        marks=marks,
    )
    end = max((r.arrival_s for r in requests), default=0.0) + DRAIN_S
    run.run().finish(START_S + max([end, *marks]))
    return run


def latency_percentile(values: list[float], q: float) -> float | None:
    """Return the q-th percentile of latencies in ms, as the result files give it."""
    value = percentile(values, q)
    return None if value is None else round(value, 2)


def good(passage: Passage) -> bool:
    """Say whether a request counts toward goodput: served, its first token and every one after
    it within the bar."""
    ttft, tpot = passage.ttft_s, passage.tpot_s
    return (
        passage.served
        and ttft is not None
        and ttft <= GOODPUT_TTFT_S
        and (tpot is None or tpot <= GOODPUT_TPOT_S)
    )


def latencies(served: Sequence[Passage]) -> dict[str, float | None]:
    """Return the served requests' TTFT and TPOT at p50 and p99, in ms."""
    ttft = [p.ttft_s * 1e3 for p in served if p.ttft_s is not None]
    tpot = [p.tpot_s * 1e3 for p in served if p.tpot_s is not None]
    return {
        "ttft_p50_ms": latency_percentile(ttft, 50),
        "ttft_p99_ms": latency_percentile(ttft, 99),
        "tpot_p50_ms": latency_percentile(tpot, 50),
        "tpot_p99_ms": latency_percentile(tpot, 99),
    }


def live_pools(replay: Replay) -> list[str]:
    """Return the live pools that serve a model the replay's requests ask for."""
    return [
        n
        for n, pool in replay.policy.pools.items()
        if pool.live and set(replay.models) & set(pool.models)
    ]


def summarize(replay: Replay) -> dict[str, object]:
    """Return a replay's figures, as the benchmark writes them for one strategy."""
    policy = replay.policy
    passages = replay.passages
    total = max(len(passages), 1)
    served = [p for p in passages if p.served]
    tokens_k = max(sum(p.request.output_tokens for p in served), 1) / 1000
    duration_s = max((sim.device.time for sim in replay.world.values()), default=0.0)
    above_idle = fleet = fleet_cost = carbon = fleet_carbon = 0.0
    pool_cost: dict[str, float] = dict.fromkeys(replay.fleet.pools, 0.0)
    for sim in replay.world.values():
        pool = policy.pools[sim.state.pool]
        price = pool.price
        above_idle += sim.energy_above_idle_j
        fleet += sim.device.energy_j
        carbon += sim.carbon_g
        fleet_carbon += sim.fleet_carbon_g
        pool_cost[sim.state.pool] += (
            sim.energy_usd + sim.slot_s * price.usd_per_hour / 3600 / pool.slots_per_backend
        )
        fleet_cost += sim.energy_usd + sim.device.idle_energy_j * price.usd_per_kwh / 3.6e6
        # A released device's hours are not paid (its instance given back, its node down).
        paid_s = sim.device.time - replay.released_s(sim.state.name)
        fleet_cost += paid_s * price.usd_per_hour / 3600
    cost = sum(pool_cost.values())
    pools = Counter(p.pool for p in served)
    prompt = sum(p.request.prompt_tokens for p in served)
    cached = sum(p.job.cached_tokens for p in served if p.job is not None)
    live = live_pools(replay)
    tokens: Counter[str] = Counter()
    concurrency: Counter[str] = Counter()
    for p in served:
        assert p.pool is not None
        tokens[p.pool] += p.request.output_tokens
        concurrency[p.pool] += p.concurrent
    summary: dict[str, object] = {
        "requests": len(passages),
        "served": len(served),
        "refused": sum(p.refused is not None for p in passages),
        "energy_j_per_request": round(above_idle / total, 3),
        "energy_above_idle_j": round(above_idle, 1),
        "carbon_g_per_request": round(carbon / total, 5),
        "fleet_energy_j": round(fleet, 1),
        "fleet_energy_j_per_request": round(fleet / total, 3),
        "fleet_carbon_g": round(fleet_carbon, 3),
        "cost_usd_per_1k_tokens": round(cost / tokens_k, 9),
        "fleet_cost_usd_per_1k_tokens": round(fleet_cost / tokens_k, 9),
        "slo_attainment": round(sum(p.meets_slo() for p in passages) / total, 5),
        "goodput": round(sum(good(p) for p in passages) / total, 5),
        **latencies(served),
        "pool_shares": {name: round(pools[name] / total, 4) for name in live},
        # Diagnostics: what each pool's tokens cost, and how busy a request found its backend.
        "cost_usd_per_1k_tokens_by_pool": {
            name: round(pool_cost[name] / tokens[name] * 1000, 9) if tokens[name] else None
            for name in live
        },
        "mean_concurrency": {
            name: round(concurrency[name] / pools[name], 2) if pools[name] else None
            for name in live
        },
        # Of the prompt tokens served, those the backends' prefix caches held.
        "cached_share": round(cached / prompt, 5) if prompt else 0.0,
        "queued_share": round(sum(p.queued_in is not None for p in passages) / total, 5),
        "fallback_share": round(sum(p.fell_back for p in passages) / total, 5),
        "duration_s": round(duration_s, 3),
    }
    if replay.parking is not None:
        summary["parking"] = parking_summary(replay)
    if replay.strategy.learner is not None:
        summary["cost_model"] = replay.strategy.learner.report()
    return summary


def phases(replay: Replay, marks: Sequence[float]) -> list[dict[str, object]]:
    """Return the figures of each stretch of a replay between consecutive `marks` (trace
    seconds, at which it was replayed with the fleet's counters read; the last stretch runs to
    the end of its window): of the requests that arrived in it, their cost per 1,000 generated
    tokens (their slot time, and the energy above idle the fleet drew in the stretch, at its
    rates), that energy per request, their SLO attainment and where they went.

    The routing benchmark cuts a scenario at its events' and tariffs' boundaries, so where a
    router loses can be told apart: before a device slows down, while it is slow, after."""
    policy = replay.policy
    starts = sorted(marks)
    if not starts or starts[0] > 0:
        starts = [0.0, *starts]
    ends = [*starts[1:], math.inf]
    tallies: list[defaultdict[str, float]] = [defaultdict(float) for _ in starts]
    pools: list[Counter[str]] = [Counter() for _ in starts]
    for passage in replay.passages:
        arrived = passage.arrival_s - START_S
        i = max(bisect.bisect_right(starts, arrived) - 1, 0)
        tally = tallies[i]
        tally["requests"] += 1
        tally["slo_met"] += passage.meets_slo()
        job = passage.job
        if passage.served and job is not None and passage.pool is not None:
            assert job.finished_at is not None and job.admitted_at is not None
            pool = policy.pools[passage.pool]
            held_s = job.finished_at - job.admitted_at
            tally["cost_usd"] += held_s * pool.price.usd_per_hour / 3600 / pool.slots_per_backend
            tally["tokens"] += passage.request.output_tokens
            pools[i][passage.pool] += 1
    # The readings come in the marks' order (by index: START_S + t - START_S need not be t).
    read = dict(zip(sorted(marks), replay.readings, strict=False))
    ended = FleetReading(
        math.inf,
        {name: sim.energy_above_idle_j for name, sim in replay.world.items()},
        {name: sim.energy_usd for name, sim in replay.world.items()},
        {name: sim.carbon_g for name, sim in replay.world.items()},
    )
    live = live_pools(replay)
    found: list[dict[str, object]] = []
    for start, end, tally, served in zip(starts, ends, tallies, pools, strict=True):
        before, after = read.get(start), read.get(end, ended)
        energy = usd = 0.0
        for name in replay.world:
            energy += after.energy_above_idle_j[name] - (
                before.energy_above_idle_j[name] if before else 0.0
            )
            usd += after.energy_usd[name] - (before.energy_usd[name] if before else 0.0)
        requests, tokens_k = int(tally["requests"]), tally["tokens"] / 1000
        # A stretch no request arrived in measures nothing: None, not 0.
        found.append(
            {
                "start_s": start,
                "end_s": None if end == math.inf else end,
                "requests": requests,
                "cost_usd_per_1k_tokens": (
                    round((tally["cost_usd"] + usd) / tokens_k, 9) if tokens_k else None
                ),
                "energy_j_per_request": round(energy / requests, 3) if requests else None,
                "slo_attainment": round(tally["slo_met"] / requests, 5) if requests else None,
                "pool_shares": {
                    name: round(served[name] / requests, 4) if requests else None for name in live
                },
            }
        )
    return found


def parking_summary(replay: Replay) -> dict[str, object]:
    """Return what parking did: backends on over time, its moves, and wake-ups that came late."""
    moves = replay.moves
    duration = max((sim.device.time for sim in replay.world.values()), default=0.0)
    backends = len(replay.world)
    return {
        "parks": sum(m[2] == "park" for m in moves),
        "wake_ups": sum(m[2] == "wake" for m in moves),
        "late_wake_ups": replay.late_wake_ups,
        "mean_backends_on": (
            round(backends - replay.parked_s / duration, 3) if duration else backends
        ),
        "backends": backends,
        # What the parked devices still drew: the fleet's energy less this is what parking
        # would leave if a parked device drew nothing (powered off, released).
        "parked_energy_j": round(replay.parked_energy_j, 1),
        # Backend-seconds released (drawing nothing, not paid); 0 where parking sleeps.
        "released_s": round(sum(replay.released_s(name) for name in replay.world), 1),
    }
