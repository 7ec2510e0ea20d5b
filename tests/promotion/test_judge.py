from __future__ import annotations

import random

import numpy as np
import pytest

from gateway.policy.definition import Promotion
from gateway.promotion.judge import (
    DEPARTURE_MARGIN,
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
    Failures,
    Histogram,
    bernoulli_interval,
    judge,
    poisson_interval,
)
from gateway.promotion.precision.rates import rate_interval

WEEK = 7 * 86400.0


def evidence(
    n: int = 100_000,
    departing: float = 0.0,
    floor: float = 0.0,
    words: int = 12,
    sampled_share: float = 0.0,
    sampled_departing: float = 0.0004,
    sampled_floor: float = 0.0004,
    slowdown: float = 1.0,
    slo_loss: float = 0.0,
    cheaper: float = 0.9,
    error_rate: float = 0.001,
    seed: int = 1,
) -> Evidence:
    """Shadow evidence drawn from known truths: departures per word at risk, over pairs that
    each put `words` at risk (the real fleet's answers put 12)."""
    rng = random.Random(seed)
    e = Evidence("chat", "cim", first_ts=0.0)
    # Counts at exactly their rates, so each test's truth is also its estimate.
    e.sent = n
    e.errors = round(n * error_rate)
    e.failures = Failures(n, e.errors, 0, e.errors, 0)
    compared = n - e.errors
    sampled = round(compared * sampled_share)
    e.greedy = _agreement(compared - sampled, departing, floor, words)
    e.sampled = _agreement(sampled, sampled_departing, sampled_floor, words)
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


def _agreement(compared: int, departing: float, floor: float, words: int) -> Agreement:
    noise = compared // 4
    return Agreement(
        compared=compared,
        departed=round(compared * words * departing),
        words=compared * words,
        exact=round(compared * 0.4),
        noise_compared=noise,
        noise_departed=round(noise * words * floor),
        noise_words=noise * words,
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
        ({"departing": 0.003}, "quality"),
        ({"sampled_share": 0.5, "sampled_departing": 0.004}, "quality_sampled"),
        ({"slo_loss": 0.03}, "slo"),
        ({"error_rate": 0.05}, "failures"),
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
    verdict = judge(evidence(n=2400, departing=0.0004), Criteria(), now=WEEK + 1)
    assert verdict.outcome == HOLD
    assert verdict.reason.startswith("not enough evidence yet on quality at temperature 0")
    assert verdict.samples_needed is not None and verdict.samples_needed > 0
    # At the same rates, that many more noise-floor pairs (a quarter of the copies) decide it.
    pairs = 2400 // 4 + verdict.samples_needed
    enough = evidence(n=4 * pairs, departing=0.0004)
    assert results(judge(enough, Criteria(), now=WEEK + 1))["quality"] != UNDECIDED


def test_a_candidate_no_cheaper_than_the_primary_is_never_promoted() -> None:
    verdict = judge(evidence(cheaper=0.5), Criteria(), now=WEEK + 1)
    assert verdict.outcome != PROMOTE
    assert results(verdict)["benefit"] != PASS


def test_no_noise_floor_means_no_quality_verdict() -> None:
    e = evidence(n=5000)
    e.greedy.noise_compared = e.greedy.noise_departed = e.greedy.noise_words = 0
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
    assert results(judge(evidence(departing=0.0012), Criteria(), now=WEEK + 1))["quality"] == FAIL
    both = evidence(sampled_share=0.7, sampled_departing=0.0012, sampled_floor=0.001)
    verdict = judge(both, Criteria(), now=WEEK + 1)
    assert results(verdict)["quality_sampled"] == PASS
    assert verdict.outcome == PROMOTE, verdict.reason
    only_sampled = evidence(sampled_share=1.0)
    checks = results(judge(only_sampled, Criteria(), now=WEEK + 1))
    assert "quality" not in checks and checks["quality_sampled"] == PASS


def test_harmful_errors_hidden_in_sampled_traffic_are_found() -> None:
    # Harmful answers in the sampled share, none in the temperature-0 share.
    verdict = judge(
        evidence(sampled_share=0.7, sampled_departing=0.0004 + 0.002), Criteria(), now=WEEK + 1
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


def long_answers(departing: float, floor: float, departed_at: int) -> Evidence:
    """A week of copies of 100-word answers (the simulator's natural length): 160,000 pairs
    of the candidate's, 40,000 of the noise floor's, each departing pair diverging at
    word `departed_at`."""
    e = evidence(n=160_000)
    a = e.greedy
    candidate, noise = round(a.compared * departing), round(a.noise_compared * floor)
    a.departed, a.noise_departed = candidate, noise
    a.words = (a.compared - candidate) * 100 + candidate * departed_at
    a.noise_words = (a.noise_compared - noise) * 100 + noise * departed_at
    return e


def test_a_long_answer_benign_candidate_the_share_rule_held_is_promoted() -> None:
    # The int8 ASIC at natural lengths: 2.1% of its answers depart against the GPU's own 1.2%,
    # each a flip somewhere in 100 words that sends the rest elsewhere.
    e = long_answers(departing=0.021, floor=0.012, departed_at=50)
    a = e.greedy
    # Shares, as the judge compared them before: 0.9 points apart, whose interval reaches past
    # the 1-point margin after a week, so it held the part.
    each = Criteria().alpha / 5 / 2
    high = (
        bernoulli_interval(a.departed, a.compared, each)[1]
        - bernoulli_interval(a.noise_departed, a.noise_compared, each)[0]
    )
    assert high > 0.01
    # Per word at risk both rates are small and close: promoted after the week.
    verdict = judge(e, Criteria(), now=WEEK + 1)
    assert verdict.outcome == PROMOTE, verdict.reason
    (quality,) = [c for c in verdict.checks if c.name == "quality"]
    assert quality.interval is not None and quality.interval[1] < DEPARTURE_MARGIN / 2


def test_a_long_answer_harmful_candidate_is_rejected_on_the_first_day() -> None:
    # A wrong fact in a fifth of the answers, around their 30th word.
    e = long_answers(departing=0.2 + 0.012, floor=0.012, departed_at=30)
    verdict = judge(e, Criteria(), now=86400)
    assert verdict.outcome == REJECT
    assert results(verdict)["quality"] == FAIL


def test_a_departure_in_one_short_answer_in_ten_is_rejected() -> None:
    # 12-word answers, one in ten departing: what the former 1-point share margin rejected
    # is rejected per word too (8.3 per 1,000 words against 0.8 allowed).
    verdict = judge(evidence(n=20_000, departing=0.1 / 12), Criteria(), now=WEEK + 1)
    assert verdict.outcome == REJECT and results(verdict)["quality"] == FAIL


def test_the_policys_margins_are_the_judges() -> None:
    # The policy cannot import the judge (it sits below it), so its defaults are held here.
    policy, rules = Promotion(), Criteria()
    assert policy.departure_margin == rules.departure_margin == DEPARTURE_MARGIN
    assert policy.sampled_departure_margin == rules.sampled_departure_margin


def misses(interval, rate: float, looks: int, words_per_look: int, streams: int = 200) -> int:
    """Count the streams of Bernoulli words at `rate` whose interval ever leaves the truth."""
    rng = np.random.default_rng(11)
    missed = 0
    for _ in range(streams):
        counts = np.cumsum(rng.binomial(words_per_look, rate, size=looks))
        for look, count in enumerate(counts, start=1):
            low, high = interval(int(count), look * words_per_look, 0.05)
            if not low <= rate <= high:
                missed += 1
                break
    return missed


@pytest.mark.parametrize("rate", [0.0002, 0.002])
def test_the_rate_sequence_covers_the_truth_at_every_look(rate: float) -> None:
    # 400 looks of one stream of words, as the judge looks every 6 hours for 100 days: the
    # sequence misses the true rate in at most alpha of the streams, with room for chance.
    assert misses(poisson_interval, rate, 400, 5000) <= 15
    # The fixed-sample score interval, looked at as often, misses far more: the test can tell.
    assert misses(rate_interval, rate, 400, 5000) > 30


def test_the_rate_sequence_narrows_as_words_arrive_and_stays_within_a_rate() -> None:
    assert poisson_interval(0, 0, 0.05) == (0.0, 1.0)
    low, high = poisson_interval(0, 100_000, 0.05)
    assert low == 0.0 and 0 < high < 1e-4
    wide, narrow = poisson_interval(20, 10_000, 0.05), poisson_interval(200, 100_000, 0.05)
    assert wide[0] < narrow[0] < 0.002 < narrow[1] < wide[1]
    assert poisson_interval(5, 5, 0.05)[1] == 1.0  # a rate per word is at most 1


def test_histogram_quantiles_are_within_two_percent() -> None:
    values = [float(v) for v in range(1, 10_001)]
    hist = Histogram(values)
    assert hist.quantile(0.95) == pytest.approx(9500, rel=0.02)
    assert hist.n == 10_000
