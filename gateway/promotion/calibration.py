"""Calibrate the judge: simulated shadow streams with known truths, judged after every batch.

Scenarios (per route and candidate, at the conversation trace's shadow rates: 19,366 requests an
hour, 20% copied to the candidate, a quarter of those also to the noise floor):

- `aa`: the candidate is the primary's equal in everything, cost included: never promote it;
- `worse_quality`: agreement 2 points below the noise floor (cheaper, as a risky part would be);
- `worse_latency`: p95 10% slower than the primary's (cheaper too);
- `good`: as good as the primary and cheaper on 90% of requests: promote it within the window.

The judge looks every `look_hours`; a run counts as promoted if it said promote at any look.
Counts come from binomial and multinomial draws (latency histograms over the judge's own bins),
so each look costs the same whatever the traffic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gateway.promotion.judge import PROMOTE, Criteria, Evidence, Histogram, judge

REQUESTS_PER_HOUR = 19_366
SHADOW_RATE = 0.2
NOISE_SHARE = 0.25
NOISE_FLOOR = 0.97
ERROR_RATE = 0.002
TTFT_MS = (math.log(80.0), 0.5)  # lognormal: median 80 ms
E2E_MS = (math.log(2500.0), 0.6)

SCENARIOS: dict[str, dict[str, float]] = {
    "aa": {"agreement": NOISE_FLOOR, "slowdown": 1.0, "cheaper": 0.5},
    "worse_quality": {"agreement": NOISE_FLOOR - 0.02, "slowdown": 1.0, "cheaper": 0.9},
    "worse_latency": {"agreement": NOISE_FLOOR, "slowdown": 1.10, "cheaper": 0.9},
    "good": {"agreement": NOISE_FLOOR, "slowdown": 1.0, "cheaper": 0.9},
}


def _bin_probabilities(mu: float, sigma: float) -> np.ndarray:
    """Return the chance of a lognormal latency falling in each of the judge's histogram bins."""
    edges = np.asarray(Histogram.EDGES)
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2))
    cdf = 0.5 * (1 + np.vectorize(math.erf)(z))
    probabilities = np.diff(np.concatenate(([0.0], cdf, [1.0])))
    return np.clip(probabilities, 0, None) / probabilities.clip(0).sum()


def _add(hist: Histogram, counts: np.ndarray) -> None:
    for i in np.flatnonzero(counts):
        hist.counts[i] += int(counts[i])
    hist.n += int(counts.sum())


def run(
    scenario: dict[str, float],
    criteria: Criteria,
    rng: np.random.Generator,
    *,
    days: float,
    look_hours: float,
    bins: dict[str, np.ndarray],
) -> tuple[str, float | None]:
    """Simulate one candidate's shadow stream; return the final outcome and when it promoted."""
    e = Evidence("chat", "candidate", first_ts=0.0)
    per_look = REQUESTS_PER_HOUR * SHADOW_RATE * look_hours
    outcome = "hold"
    for look in range(1, int(days * 24 / look_hours) + 1):
        n = int(rng.poisson(per_look))
        m = int(rng.binomial(n, NOISE_SHARE))
        errors = int(rng.binomial(n, ERROR_RATE))
        ok = n - errors
        e.sent += n
        e.errors += errors
        e.compared += ok
        e.agree += int(rng.binomial(ok, scenario["agreement"]))
        e.noise_compared += m
        e.noise_agree += int(rng.binomial(m, NOISE_FLOOR))
        e.priced += ok
        e.cheaper += int(rng.binomial(ok, scenario["cheaper"]))
        slow = "slow_" if scenario["slowdown"] != 1.0 else ""
        _add(e.primary_ttft_ms, rng.multinomial(ok, bins["ttft"]))
        _add(e.primary_e2e_ms, rng.multinomial(ok, bins["e2e"]))
        _add(e.candidate_ttft_ms, rng.multinomial(ok, bins[slow + "ttft"]))
        _add(e.candidate_e2e_ms, rng.multinomial(ok, bins[slow + "e2e"]))
        now = look * look_hours * 3600
        verdict = judge(e, criteria, now)
        outcome = verdict.outcome
        if outcome == PROMOTE:
            return outcome, now / 86400
    return outcome, None


def calibrate(
    runs: int = 200, seed: int = 0, *, days: float = 7.0, look_hours: float = 6.0
) -> dict[str, Any]:
    """Run every scenario `runs` times; return the rates the judge is held to."""
    criteria = Criteria()
    rng = np.random.default_rng(seed)
    slowdown = SCENARIOS["worse_latency"]["slowdown"]
    bins = {
        "ttft": _bin_probabilities(*TTFT_MS),
        "e2e": _bin_probabilities(*E2E_MS),
        "slow_ttft": _bin_probabilities(TTFT_MS[0] + math.log(slowdown), TTFT_MS[1]),
        "slow_e2e": _bin_probabilities(E2E_MS[0] + math.log(slowdown), E2E_MS[1]),
    }
    scenarios: dict[str, Any] = {}
    for name, scenario in SCENARIOS.items():
        outcomes: dict[str, int] = {}
        promoted_days = []
        for _ in range(runs):
            outcome, day = run(scenario, criteria, rng, days=days, look_hours=look_hours, bins=bins)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if day is not None:
                promoted_days.append(day)
        scenarios[name] = {
            "outcomes": outcomes,
            "promoted": len(promoted_days) / runs,
            "median_days_to_promote": float(np.median(promoted_days)) if promoted_days else None,
        }
    bad = ("aa", "worse_quality", "worse_latency")
    return {
        "runs_per_scenario": runs,
        "window_days": days,
        "look_every_hours": look_hours,
        "false_promotion_rate": max(scenarios[s]["promoted"] for s in bad),
        "power_reject_worse": min(
            1 - scenarios[s]["promoted"] for s in ("worse_quality", "worse_latency")
        ),
        "power_promote_good": scenarios["good"]["promoted"],
        "targets": {
            "false_promotion_rate": "<= 0.05",
            "power_reject_worse": ">= 0.95",
            "power_promote_good": ">= 0.90",
        },
        "scenarios": scenarios,
    }
