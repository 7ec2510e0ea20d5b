from __future__ import annotations

import random

import pytest

from gateway.promotion.judge import (
    FAIL,
    HOLD,
    PASS,
    PROMOTE,
    REJECT,
    Criteria,
    Evidence,
    Histogram,
    bernoulli_interval,
    judge,
)

WEEK = 7 * 86400.0


def evidence(
    n: int = 100_000,
    agreement: float = 0.97,
    floor: float = 0.97,
    slowdown: float = 1.0,
    cheaper: float = 0.9,
    error_rate: float = 0.001,
    seed: int = 1,
) -> Evidence:
    """Shadow evidence drawn from known truths."""
    rng = random.Random(seed)
    e = Evidence("chat", "cim", first_ts=0.0)
    # Counts at exactly their rates, so each test's truth is also its estimate.
    e.sent = n
    e.errors = round(n * error_rate)
    e.compared = n - e.errors
    e.agree = round(e.compared * agreement)
    e.noise_compared = n // 4
    e.noise_agree = round(e.noise_compared * floor)
    e.priced = e.compared
    e.cheaper = round(e.priced * cheaper)
    for _ in range(n):
        e.primary_ttft_ms.add(rng.lognormvariate(4.4, 0.5))
        e.candidate_ttft_ms.add(slowdown * rng.lognormvariate(4.4, 0.5))
        e.primary_e2e_ms.add(rng.lognormvariate(7.8, 0.6))
        e.candidate_e2e_ms.add(slowdown * rng.lognormvariate(7.8, 0.6))
    return e


def results(verdict) -> dict[str, str]:
    return {c.name: c.result for c in verdict.checks}


def test_a_candidate_as_good_and_cheaper_is_promoted_after_the_window() -> None:
    verdict = judge(evidence(), Criteria(), now=WEEK + 1)
    assert verdict.outcome == PROMOTE, verdict.reason
    assert set(results(verdict).values()) == {PASS}


def test_the_same_evidence_is_held_until_the_minimum_window_passes() -> None:
    verdict = judge(evidence(), Criteria(), now=3 * 86400)
    assert verdict.outcome == HOLD
    assert "3.0 days of evidence, 7.0 required" in verdict.reason


@pytest.mark.parametrize(
    ("truth", "failed"),
    [
        ({"agreement": 0.94}, "quality"),
        ({"slowdown": 1.4}, "ttft_p95"),
        ({"error_rate": 0.05}, "errors"),
        ({"cheaper": 0.2}, "benefit"),
    ],
)
def test_a_candidate_failing_one_criterion_is_rejected_naming_it(truth: dict, failed: str) -> None:
    verdict = judge(evidence(**truth), Criteria(), now=WEEK + 1)
    assert verdict.outcome == REJECT
    assert results(verdict)[failed] == FAIL
    assert failed in verdict.reason


def test_little_evidence_holds_with_an_estimate_of_samples_needed() -> None:
    verdict = judge(evidence(n=2000), Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD
    assert verdict.reason.startswith("not enough evidence yet")
    assert verdict.samples_needed is not None and verdict.samples_needed > 2000


def test_a_candidate_no_cheaper_than_the_primary_is_never_promoted() -> None:
    verdict = judge(evidence(cheaper=0.5), Criteria(), now=WEEK + 1)
    assert verdict.outcome != PROMOTE
    assert results(verdict)["benefit"] != PASS


def test_no_noise_floor_means_no_quality_verdict() -> None:
    e = evidence(n=5000)
    e.noise_compared = e.noise_agree = 0
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD and results(verdict)["quality"] == "undecided"


def test_bernoulli_sequence_covers_the_truth_at_every_look() -> None:
    # Time-uniform: over many looks of one stream the interval misses the truth rarely.
    rng = random.Random(7)
    misses = 0
    for _ in range(100):
        successes = 0
        for n in range(1, 2001):
            successes += rng.random() < 0.9
            if n % 100 == 0:
                low, high = bernoulli_interval(successes, n, 0.05)
                if not low <= 0.9 <= high:
                    misses += 1
                    break
    assert misses <= 10  # at most alpha of the streams ever miss, with room for chance


def test_histogram_quantiles_are_within_two_percent() -> None:
    values = [float(v) for v in range(1, 10_001)]
    hist = Histogram(values)
    assert hist.quantile(0.95) == pytest.approx(9500, rel=0.02)
    assert hist.n == 10_000
