from __future__ import annotations

import random

import pytest

from gateway.promotion.judge import (
    FAIL,
    FAILED,
    HOLD,
    PASS,
    PROMOTE,
    REJECT,
    UNDECIDED,
    Agreement,
    Attainment,
    Criteria,
    Evidence,
    Histogram,
    bernoulli_interval,
    judge,
)

WEEK = 7 * 86400.0


def evidence(
    n: int = 100_000,
    departing: float = 0.0,
    floor: float = 0.0,
    sampled_share: float = 0.0,
    sampled_departing: float = 0.01,
    sampled_floor: float = 0.01,
    slowdown: float = 1.0,
    slo_loss: float = 0.0,
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
    compared = n - e.errors
    sampled = round(compared * sampled_share)
    e.greedy = _agreement(compared - sampled, departing, floor)
    e.sampled = _agreement(sampled, sampled_departing, sampled_floor)
    e.priced = compared
    # Every answer meets the SLO but for `slo_loss` of the copies, however slow the candidate.
    missed = round(compared * slo_loss)
    e.slo = Attainment(compared, compared, compared - missed, missed, 0)
    e.cheaper = round(e.priced * cheaper)
    for _ in range(n):
        e.primary_ttft_ms.add(rng.lognormvariate(4.4, 0.5))
        e.candidate_ttft_ms.add(slowdown * rng.lognormvariate(4.4, 0.5))
        e.primary_e2e_ms.add(rng.lognormvariate(7.8, 0.6))
        e.candidate_e2e_ms.add(slowdown * rng.lognormvariate(7.8, 0.6))
    return e


def _agreement(compared: int, departing: float, floor: float) -> Agreement:
    noise = compared // 4
    return Agreement(
        compared=compared,
        departed=round(compared * departing),
        exact=round(compared * 0.4),
        noise_compared=noise,
        noise_departed=round(noise * floor),
        noise_exact=round(noise * 0.9),
        tolerance="semantic similarity below 0.980",
    )


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
        ({"departing": 0.03}, "quality"),
        ({"sampled_share": 0.5, "sampled_departing": 0.04}, "quality_sampled"),
        ({"slo_loss": 0.03}, "slo"),
        ({"error_rate": 0.05}, "errors"),
        ({"cheaper": 0.2}, "benefit"),
    ],
)
def test_a_candidate_failing_one_criterion_is_rejected_naming_it(truth: dict, failed: str) -> None:
    verdict = judge(evidence(**truth), Criteria(), now=WEEK + 1)
    assert verdict.outcome == REJECT
    assert results(verdict)[failed] == FAIL
    assert verdict.reason.startswith("rejected: ") and FAILED[failed] in verdict.reason


def test_a_slower_candidate_that_meets_the_slo_is_promoted_with_its_p95s_reported() -> None:
    # A cheaper chip is usually slower: 1.4x the primary's p95 is no reason to reject it while
    # every copy meets its class's targets.
    verdict = judge(evidence(slowdown=1.4), Criteria(), now=WEEK + 1)
    assert verdict.outcome == PROMOTE, verdict.reason
    assert verdict.latency["ttft_p95_ratio"] == pytest.approx(1.4, rel=0.05)
    assert verdict.latency["e2e_p95_ratio"] == pytest.approx(1.4, rel=0.05)
    assert verdict.as_dict()["latency"] == verdict.latency


def test_slo_attainment_is_judged_on_the_pairs_where_the_sides_differ() -> None:
    # Both sides miss 5 % of requests (the same slow prompts): no evidence against the candidate.
    shared = Attainment(pairs=3000, primary_met=2850, candidate_met=2850)
    e = evidence()
    e.slo = shared
    (slo,) = [c for c in judge(e, Criteria(), now=WEEK + 1).checks if c.name == "slo"]
    assert slo.result == PASS and slo.estimate == 0.0
    # The candidate misses 2.5 points more, beyond the 1-point margin: rejected.
    e.slo = Attainment(10_000, 9500, 9250, only_primary=300, only_candidate=50)
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert results(verdict)["slo"] == FAIL
    assert FAILED["slo"] in verdict.reason
    # Where the candidate misses some the primary met and meets as many the primary missed,
    # it is as good.
    e.slo = Attainment(10_000, 9500, 9500, only_primary=40, only_candidate=40)
    assert results(judge(e, Criteria(), now=WEEK + 1))["slo"] != FAIL


def test_no_answered_copies_leave_the_slo_undecided() -> None:
    e = evidence()
    e.slo = Attainment()
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD and results(verdict)["slo"] == UNDECIDED
    assert "SLO attainment" in verdict.reason


def test_little_evidence_holds_with_an_estimate_of_samples_needed() -> None:
    verdict = judge(evidence(n=2400, departing=0.005), Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD
    assert verdict.reason.startswith("not enough evidence yet on quality at temperature 0")
    assert verdict.samples_needed is not None and verdict.samples_needed > 0
    # At the same rates, that many more noise-floor pairs (a quarter of the copies) decide it.
    pairs = 2400 // 4 + verdict.samples_needed
    enough = evidence(n=4 * pairs, departing=0.005)
    assert results(judge(enough, Criteria(), now=WEEK + 1))["quality"] != UNDECIDED


def test_a_candidate_no_cheaper_than_the_primary_is_never_promoted() -> None:
    verdict = judge(evidence(cheaper=0.5), Criteria(), now=WEEK + 1)
    assert verdict.outcome != PROMOTE
    assert results(verdict)["benefit"] != PASS


def test_no_noise_floor_means_no_quality_verdict() -> None:
    e = evidence(n=5000)
    e.greedy.noise_compared = e.greedy.noise_departed = 0
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD and results(verdict)["quality"] == UNDECIDED
    assert "quality at temperature 0" in verdict.reason


def test_many_exact_mismatches_are_no_evidence_against_a_candidate_whose_meaning_holds() -> None:
    # An int8 part: its answers match the primary's exactly far less often than the GPU's own
    # do, yet depart in meaning no more often. Exact match would hold it for ever.
    e = evidence()
    e.greedy.exact = round(e.greedy.compared * 0.35)
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert verdict.outcome == PROMOTE, verdict.reason
    assert "exact match 35.0% against 90.0%" in verdict.checks[0].detail


def test_sampled_traffic_is_judged_against_its_own_noise_floor() -> None:
    # Samples differ from each other far more than greedy answers: the same departure rate
    # that would fail at temperature 0 passes against the sampled floor.
    both = evidence(sampled_share=0.7, sampled_departing=0.012, sampled_floor=0.01)
    verdict = judge(both, Criteria(), now=WEEK + 1)
    assert results(verdict)["quality_sampled"] == PASS
    assert verdict.outcome == PROMOTE, verdict.reason
    only_sampled = evidence(sampled_share=1.0)
    checks = results(judge(only_sampled, Criteria(), now=WEEK + 1))
    assert "quality" not in checks and checks["quality_sampled"] == PASS


def test_harmful_errors_hidden_in_sampled_traffic_are_found() -> None:
    # 0.5% harmful answers in the sampled share, none in the temperature-0 share.
    verdict = judge(
        evidence(sampled_share=0.7, sampled_departing=0.01 + 0.03), Criteria(), now=WEEK + 1
    )
    assert verdict.outcome == REJECT
    assert results(verdict) == {**results(verdict), "quality": PASS, "quality_sampled": FAIL}


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
