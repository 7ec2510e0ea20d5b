"""The routing benchmark: replay one trace through every strategy and collect their figures."""

from __future__ import annotations

import asyncio
import datetime
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.policy.load import load_policy
from gateway.policy.model import Policy
from gateway.replay.engine import START_S, Replay
from gateway.replay.learner import WARM_OBSERVATIONS
from gateway.replay.oracle import oracle
from gateway.replay.strategies import ROUTED, STRATEGIES, strategy_for
from gateway.replay.summary import summarize
from gateway.replay.trace import TraceRequest, read_trace

# Every replay's fleet is measured over the same window: the trace, then this long to drain.
DRAIN_S = 60.0


def benchmark(
    policy: Policy,
    requests: Sequence[TraceRequest],
    *,
    strategies: Sequence[str] = STRATEGIES,
    seed: int = 0,
    retrain_every: int = 200,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, dict[str, Any]]:
    """Return each strategy's figures on the trace, keyed by strategy name."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown} (strategies: {', '.join(STRATEGIES)})")
    # The seed sets what the live gateway leaves to chance: where the meter's readings fall
    # relative to requests, and which pool round-robin starts with.
    phase = random.Random(seed).random()
    window_s = START_S + max((r.arrival_s for r in requests), default=0.0) + DRAIN_S
    results: dict[str, dict[str, Any]] = {}
    for name in strategies:
        started = clock()
        if name in ROUTED:
            strategy = strategy_for(name, policy, seed=seed, retrain_every=retrain_every)
            replay = Replay(strategy, requests, meter_phase_s=phase).run()
            replay.finish(window_s)
            result = summarize(replay)
        else:
            result = oracle(policy, requests, duration_s=window_s)
        result["wall_s"] = round(clock() - started, 2)
        results[name] = result
    return results


# The targets on the conversation trace (docs/routing.md).
SLO_TARGET = 0.995
ENERGY_SHARE_OF_GPU_ONLY = 0.5
COST_OVER_ORACLE = 1.10
MAPE_TARGET = 0.10


def targets(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Check the learned router's figures against the issue's targets, where measurable."""
    learned = results.get("learned")
    if learned is None:
        return {}
    checks: dict[str, dict[str, Any]] = {
        "slo_attainment": {
            "value": learned["slo_attainment"],
            "target": f">= {SLO_TARGET}",
            "met": learned["slo_attainment"] >= SLO_TARGET,
        }
    }
    gpu_only = results.get("gpu-only")
    if gpu_only and gpu_only["energy_j_per_request"] > 0:
        share = learned["energy_j_per_request"] / gpu_only["energy_j_per_request"]
        checks["energy_vs_gpu_only"] = {
            "value": round(share, 4),
            "target": f"<= {ENERGY_SHARE_OF_GPU_ONLY}",
            "met": share <= ENERGY_SHARE_OF_GPU_ONLY,
        }
    oracle_result = results.get("oracle")
    if oracle_result and oracle_result["cost_usd_per_1k_tokens"] > 0:
        ratio = learned["cost_usd_per_1k_tokens"] / oracle_result["cost_usd_per_1k_tokens"]
        checks["cost_vs_oracle"] = {
            "value": round(ratio, 4),
            "target": f"<= {COST_OVER_ORACLE}",
            "met": ratio <= COST_OVER_ORACLE,
        }
    warm = learned["cost_model"][f"mape_after_{WARM_OBSERVATIONS}"]
    for pool in results["learned"]["pool_shares"]:
        errors = warm.get(pool)
        checks[f"mape_{pool}"] = {
            "value": errors or f"fewer than {WARM_OBSERVATIONS} observations",
            "target": f"<= {MAPE_TARGET} per target",
            "met": None if not errors else all(v <= MAPE_TARGET for v in errors.values()),
        }
    return checks


def run_routing_benchmark(
    trace: Path,
    out: Path,
    policy_path: Path,
    *,
    rate_scale: float = 1.0,
    limit: int | None = None,
    seed: int = 0,
    strategies: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Read the trace and policy, run the strategies (all by default), write the result."""
    policy = load_policy(policy_path)
    requests = read_trace(trace, limit=limit, rate_scale=rate_scale)
    results = benchmark(policy, requests, strategies=strategies or STRATEGIES, seed=seed)
    document: dict[str, Any] = {
        "trace": str(trace),
        "policy": str(policy_path),
        "requests": len(requests),
        "rate_scale": rate_scale,
        "seed": seed,
        "date": datetime.date.today().isoformat(),
        "strategies": results,
        "targets": targets(results),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    return document


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """Return the strategies' headline figures as a plain-text table."""
    header = (
        f"{'strategy':<13} {'J/req':>8} {'fleet MJ':>9} {'$/1k tok':>10} {'SLO':>7} "
        f"{'TTFT p50':>9} {'TTFT p99':>9}  pools"
    )
    lines = [header]
    for name, r in results.items():
        shares = ", ".join(f"{p} {s:.1%}" for p, s in r["pool_shares"].items())
        lines.append(
            f"{name:<13} {r['energy_j_per_request']:>8.2f} {r['fleet_energy_j'] / 1e6:>9.3f} "
            f"{r['cost_usd_per_1k_tokens']:>10.3e} {r['slo_attainment']:>7.2%} "
            f"{r['ttft_p50_ms'] or 0:>9.1f} {r['ttft_p99_ms'] or 0:>9.1f}  {shares}"
        )
    return "\n".join(lines)


def run_live_comparison(
    url: str,
    trace: Path,
    out: Path,
    policy_path: Path,
    *,
    speed: float = 1.0,
    rate_scale: float = 1.0,
    limit: int | None = 300,
    seed: int = 0,
) -> dict[str, Any]:
    """Replay a slice through a running gateway and on the virtual clock; write both."""
    from gateway.replay.live import replay_live, summarize_live

    policy = load_policy(policy_path)
    requests = read_trace(trace, limit=limit, rate_scale=rate_scale)
    virtual = benchmark(policy, requests, strategies=("learned",), seed=seed)
    outcomes = asyncio.run(replay_live(url, requests, speed=speed))
    live = summarize_live(policy, requests, outcomes, speed)
    learned = virtual["learned"]
    document: dict[str, Any] = {
        "trace": str(trace),
        "policy": str(policy_path),
        "requests": len(requests),
        "rate_scale": rate_scale,
        "seed": seed,
        "date": datetime.date.today().isoformat(),
        "live_url": url,
        "strategies": virtual,
        "live": live,
        "comparison": {
            "slo_attainment": {
                "virtual": learned["slo_attainment"],
                "live": live["slo_attainment"],
            },
            "pool_shares": {
                pool: {"virtual": share, "live": live["pool_shares"].get(pool)}
                for pool, share in learned["pool_shares"].items()
            },
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    return document
