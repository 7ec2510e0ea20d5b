"""What-if: replay the requests a period recorded through a proposed policy, before applying it.

The period's served requests, as they were recorded (arrival, model, SLO class, tenant,
endpoint, streaming, prompt and completion tokens), are replayed on a virtual clock through the
real router and a learning cost model, once under the active policy and once under the proposed
one, and the two are compared: energy, cost, SLO attainment and pool shares. The replay's
devices follow the simulator's physics for each pool's kind (its hardware model,
gateway/whatif/hardware.py), so on a real fleet read the differences between the policies, not
the absolute figures.

A period's requests are many; the CLI and the admin API replay a sample of its time windows
(gateway/whatif/windows.py), each whole and at the period's full load after a warm-up, the same
windows under both policies, and state the sample's size, the period's and, for every figure
that is a ratio over requests, the period's estimate with its 95 % interval from the spread
between windows (gateway/whatif/estimate.py).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import request_records
from gateway.policy.definition import Policy
from gateway.whatif.conditions import ReplayRates
from gateway.whatif.estimate import Cluster, ratio_estimate
from gateway.whatif.scorecard import good, latencies, live_pools, replayed, summarize
from gateway.whatif.strategy import learned
from gateway.whatif.timeline import FleetReading, Passage, Replay
from gateway.whatif.trace import TraceRequest
from gateway.whatif.windows import PER_STRATUM, WindowSample, trace_request

COMPARED = ("energy_j_per_request", "cost_usd_per_1k_tokens", "slo_attainment", "ttft_p99_ms")
# The ratios estimated with an interval: numerator and denominator per window, the digits kept,
# and the bounds of a share.
SHARE = (0.0, 1.0)
POSITIVE = (0.0, math.inf)
ESTIMATED: dict[str, tuple[str, str, int, tuple[float, float]]] = {
    "slo_attainment": ("slo_met", "requests", 5, SHARE),
    "goodput": ("good", "requests", 5, SHARE),
    "energy_j_per_request": ("energy_j", "requests", 3, POSITIVE),
    "carbon_g_per_request": ("carbon_g", "requests", 5, POSITIVE),
    "cost_usd_per_1k_tokens": ("cost_usd", "tokens_k", 9, POSITIVE),
}


def recorded_requests(
    db: sa.Engine, since: float, *, limit: int | None = None
) -> list[TraceRequest]:
    """Return the period's successful requests as a replayable trace, oldest first: each with
    its model, SLO class, tenant, endpoint and streaming as recorded."""
    r = request_records.c
    query = (
        sa.select(
            r.ts,
            r.prompt_tokens,
            r.completion_tokens,
            r.model,
            r.slo_class,
            r.tenant,
            r.endpoint,
            r.stream,
        )
        .where(
            r.ts >= since,
            r.status == 200,
            r.prompt_tokens.is_not(None),
            r.completion_tokens.is_not(None),
        )
        .order_by(r.ts)
    )
    if limit is not None:
        query = query.limit(limit)
    with db.connect() as conn:
        rows = conn.execute(query).all()
    if not rows:
        return []
    first = rows[0].ts
    return [trace_request(row, first) for row in rows]


def replay(policy: Policy, requests: list[TraceRequest]) -> tuple[dict[str, Any], list[Passage]]:
    """Return the figures of the requests replayed through the learned router under a policy,
    and each request's passage."""
    rates = ReplayRates(policy)
    run = replayed(learned(policy, rates=rates), requests, rates=rates)
    return summarize(run), run.passages


def window_totals(run: Replay, sample: WindowSample, marks: list[float]) -> list[dict[str, float]]:
    """Return each sampled window's totals in a replay of the sample: its requests (those that
    arrived in it), their SLO met, goodput, served tokens and slot cost, and what the fleet drew
    above idle between the window's marks, in joules, dollars and carbon."""
    policy = run.policy
    totals: list[dict[str, float]] = [defaultdict(float) for _ in sample.windows]
    for passage, window in zip(run.passages, sample.window_of, strict=True):
        if window is None:
            continue  # warm-up: replayed for the state it leaves, not measured
        tally = totals[window]
        tally["requests"] += 1
        tally["slo_met"] += passage.meets_slo()
        tally["good"] += good(passage)
        job = passage.job
        if passage.served and job is not None and passage.pool is not None:
            assert job.finished_at is not None and job.admitted_at is not None
            pool = policy.pools[passage.pool]
            held_s = job.finished_at - job.admitted_at
            tally["cost_usd"] += held_s * pool.price.usd_per_hour / 3600 / pool.slots_per_backend
            tally["tokens_k"] += passage.request.output_tokens / 1000
            tally[f"served:{passage.pool}"] += 1
    at = {mark: reading for mark, reading in zip(marks, run.readings, strict=True)}
    # The period replayed entire: its energy is all its requests drew, to the last one's end.
    ended = FleetReading(
        math.inf,
        {name: sim.energy_above_idle_j for name, sim in run.world.items()},
        {name: sim.energy_usd for name, sim in run.world.items()},
        {name: sim.carbon_g for name, sim in run.world.items()},
    )
    for drawn, tally in zip(sample.windows, totals, strict=True):
        start, end = _marks(sample, drawn.start, drawn.end)
        before, after = at[start], ended if sample.whole else at[end]
        for name in run.world:
            tally["energy_j"] += after.energy_above_idle_j[name] - before.energy_above_idle_j[name]
            tally["cost_usd"] += after.energy_usd[name] - before.energy_usd[name]
            tally["carbon_g"] += after.carbon_g[name] - before.carbon_g[name]
    return totals


def _marks(sample: WindowSample, start: float, end: float) -> tuple[float, float]:
    """Return a window's marks in trace seconds: where its energy starts and ends counting."""
    return max(start - sample.first, 0.0), end - sample.first


def window_figures(run: Replay, sample: WindowSample, marks: list[float]) -> dict[str, Any]:
    """Return the period's figures estimated from a replay of its sampled windows: each ratio
    over requests with its 95 % interval, the latencies and shares of the windows' requests."""
    totals = window_totals(run, sample, marks)
    measured = [p for p, w in zip(run.passages, sample.window_of, strict=True) if w is not None]
    served = [p for p in measured if p.served]
    figures: dict[str, Any] = {"requests": len(measured), "served": len(served)}
    figures["refused"] = sum(p.refused is not None for p in measured)
    intervals: dict[str, dict[str, float]] = {}
    for name, (y, x, digits, bounds) in ESTIMATED.items():
        clusters = [
            Cluster(w.stratum, tally[y], tally[x])
            for w, tally in zip(sample.windows, totals, strict=True)
        ]
        estimate = ratio_estimate(clusters, sample.cells, bounds=bounds)
        figures[name] = None if estimate is None else round(estimate.estimate, digits)
        if estimate is not None:
            intervals[name] = estimate.rounded(digits)
    figures.update(latencies(served))
    shares: dict[str, float] = {}
    for pool in live_pools(run):
        clusters = [
            Cluster(w.stratum, tally[f"served:{pool}"], tally["requests"])
            for w, tally in zip(sample.windows, totals, strict=True)
        ]
        share = ratio_estimate(clusters, sample.cells)
        shares[pool] = 0.0 if share is None else round(share.estimate, 4)
    figures["pool_shares"] = shares
    total = max(len(measured), 1)
    figures["queued_share"] = round(sum(p.queued_in is not None for p in measured) / total, 5)
    figures["fallback_share"] = round(sum(p.fell_back for p in measured) / total, 5)
    figures["intervals"] = intervals
    if run.strategy.learner is not None:
        figures["cost_model"] = run.strategy.learner.report()
    return figures


def replay_sample(policy: Policy, sample: WindowSample) -> dict[str, Any]:
    """Replay a sample's windows and warm-ups through the learned router under a policy;
    return the period's figures estimated from its windows."""
    marks = sorted({m for w in sample.windows for m in _marks(sample, w.start, w.end)})
    rates = ReplayRates(policy)
    run = replayed(learned(policy, rates=rates), sample.requests, rates=rates, marks=marks)
    return window_figures(run, sample, marks)


def simulate_sample(
    active: Policy, proposed: Policy, sample: WindowSample, *, processes: int = 1
) -> dict[str, Any]:
    """Replay a sample under both policies, in `processes` processes (one per policy at most);
    return the comparison of the period's estimated figures, each ratio's interval, and the
    sample's and the period's size."""
    named = (("active", active), ("proposed", proposed))
    if processes > 1:
        # The two replays share nothing: on two cores, each in a process of its own.
        with ProcessPoolExecutor(max_workers=min(processes, len(named))) as pool:
            futures = {name: pool.submit(replay_sample, policy, sample) for name, policy in named}
            runs = {name: future.result() for name, future in futures.items()}
    else:
        runs = {name: replay_sample(policy, sample) for name, policy in named}
    result = _change(runs, len(sample.requests))
    strata = len(sample.cells)
    result["sample"] = {
        "requests": len(sample.requests),
        "measured_requests": sample.measured_requests,
        "period_requests": sample.period_requests,
        "whole": sample.whole,
        "windows": len(sample.windows),
        "strata": strata,
        "window_s": sample.window_s,
        "warm_up_s": sample.warm_up_s,
        "seed": sample.seed,
        "design": "the period replayed entire"
        if sample.whole
        else f"{len(sample.windows)} windows of {sample.window_s:.0f} s, {PER_STRATUM} drawn at"
        f" random in each of {strata} strata of equal length, each replayed whole at the"
        f" period's load after {sample.warm_up_s:.0f} s of warm-up",
        "interval": "none: nothing sampled"
        if sample.whole
        else "95 % t interval from the spread between windows within strata (stratified"
        " cluster sample, ratio estimator, finite-population corrected); latencies and pool"
        " shares without one",
    }
    return result


def simulate(active: Policy, proposed: Policy, requests: list[TraceRequest]) -> dict[str, Any]:
    """Replay the requests under both policies; return each one's figures and the change."""
    return _compare(active, proposed, requests)[0]


def _compare(
    active: Policy, proposed: Policy, requests: list[TraceRequest]
) -> tuple[dict[str, Any], dict[str, list[Passage]]]:
    runs: dict[str, Any] = {}
    passages: dict[str, list[Passage]] = {}
    for name, policy in (("active", active), ("proposed", proposed)):
        runs[name], passages[name] = replay(policy, requests)
    return _change(runs, len(requests)), passages


def _change(runs: dict[str, Any], requests: int) -> dict[str, Any]:
    """Return both runs' figures and the change from the active policy's to the proposed's."""
    change: dict[str, Any] = {}
    for key in COMPARED:
        before, after = runs["active"].get(key), runs["proposed"].get(key)
        if isinstance(before, int | float) and isinstance(after, int | float):
            change[key] = {
                "active": before,
                "proposed": after,
                "ratio": None if before == 0 else round(after / before, 4),
            }
    change["pool_shares"] = {
        "active": runs["active"]["pool_shares"],
        "proposed": runs["proposed"]["pool_shares"],
    }
    return {"requests": requests, "change": change, "runs": runs, "computed": time.time()}
