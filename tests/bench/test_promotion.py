"""The judge's calibration (bench/promotion.py): pairs measured on the simulator's precision model
and on the real fleet, judged on a virtual clock over one or two weeks."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from realworld import require_engine

from bench import pairs
from bench.promotion import (
    CANDIDATE_POOL,
    DEPARTURE_MARGIN,
    ROUTE,
    SCENARIOS,
    Scenario,
    calibrate,
    headline,
    slo_targets,
    traffic,
    weeks,
)
from gateway.promotion.evidence import gather
from gateway.promotion.judge import Evidence, Histogram, bernoulli_interval

RESULTS = Path(__file__).resolve().parents[2] / "docs/results"


@pytest.fixture(scope="module")
def simulated() -> dict:
    # As many pairs as the real fleet's calibration: sampled answers match on 86% of its
    # prompts, so fewer would leave the floor too few differing pairs to measure a tolerance.
    return calibrate("simulated", runs=10, seed=3, pairs_measured=840)


@pytest.mark.parametrize(
    "scenario",
    [
        # answers wrong, failed and late, on both kinds of traffic
        Scenario("cim", "reject", harmful_rate=0.3, sampled_share=0.5, slo_loss=0.03),
        # the floor's own pairs, departing the margin more often per word
        Scenario("gpu", "not promote", excess=DEPARTURE_MARGIN, sampled_share=0.2),
    ],
)
@pytest.mark.parametrize("paraphrase", [None, 0.83])
def test_the_bench_judges_what_gather_reads_of_its_shadow_copies(
    scenario: Scenario, paraphrase: float | None
) -> None:
    """At every look the bench judges the evidence the live gateway's `gather` reads of the
    same shadow records, one record a copy: its weeks are folded as the shadow minutes are, and
    held to the paraphrase figure a route's embedding model declares (the real fleet's) as a
    live route is."""
    measured = {
        (scenario.candidate, is_sampled, harmful): pairs.simulated(
            scenario.candidate,
            pairs.SAMPLED_TEMPERATURE if is_sampled else 0.0,
            60,
            0,
            harmful,
            lengths=pairs.real_lengths(),
        )
        for is_sampled in (False, True)
        for harmful in (0.0, 1.0)
    }
    kinds = {
        is_sampled: traffic(scenario, measured, is_sampled, paraphrase)
        for is_sampled in (False, True)
    }
    records: list[dict[str, Any]] = []
    looks = weeks(scenario, kinds, np.random.default_rng(0), look_hours=1.0, paraphrase=paraphrase)
    for _, (_, copies, evidence) in zip(range(3), looks, strict=False):
        records += [record for record, n in copies for _ in range(n)]
        gathered = gather(records, slo_targets, lambda route: paraphrase)[ROUTE, CANDIDATE_POOL]
        assert _read(evidence) == _read(gathered)
    if paraphrase is not None:  # the tolerance read starts at the declared figure
        assert f"below {paraphrase:.3f}" in gathered.greedy.tolerance
    e = gathered
    # Every path of the fold was taken: failed copies, departures on both kinds of traffic.
    assert e.failures.only_candidate > 0 and e.slo.only_primary > e.failures.only_candidate
    assert e.greedy.departed > e.failures.only_candidate and e.sampled.departed > 0
    assert e.greedy.noise_departed > 0 and 0 < e.cheaper < e.priced


def _read(e: Evidence) -> dict[str, Any]:
    """Return evidence as comparable values: a histogram's counts, a mean to 12 digits."""
    read = {}
    for field in fields(e):
        value = getattr(e, field.name)
        if isinstance(value, Histogram):
            value = value.counts
        elif isinstance(value, float):
            value = round(value, 12)
        read[field.name] = value
    return read


def test_named_scenarios_are_run_alone() -> None:
    result = calibrate("simulated", runs=2, seed=0, pairs_measured=60, only=["aa", "benign"])
    assert set(result["scenarios"]) == set(result["targets_met"]) == {"aa", "benign"}
    with pytest.raises(ValueError, match="no scenario digits on the simulated fleet"):
        calibrate("simulated", runs=2, seed=0, pairs_measured=60, only=["digits"])


def test_every_simulated_scenario_meets_its_target(simulated: dict) -> None:
    assert simulated["targets_met"] == dict.fromkeys(SCENARIOS["simulated"], True)


def test_equal_quality_and_cheaper_is_promoted_and_the_quality_null_is_not(simulated) -> None:
    s = simulated["scenarios"]
    assert s["aa"]["promote_rate"] == 1.0
    # At exactly the margin above the floor, per word at risk: the boundary a judge must not
    # cross.
    null = s["quality_null"]["rates"]["temperature_0"]
    assert null["candidate_per_1000_words"] == pytest.approx(
        null["noise_floor_per_1000_words"] + 1000 * DEPARTURE_MARGIN
    )
    assert s["quality_null"]["promote_rate"] == 0.0


def test_an_int8_part_is_promoted_once_a_week_has_passed(simulated):
    benign = simulated["scenarios"]["benign"]
    rates = benign["rates"]["temperature_0"]
    # Its answers differ where it breaks a near tie the other way, as the real Q8_0's do, and
    # none of them departs: each parts at a tie the two distributions reached alike (a KL up to
    # it within departures.NEAR_TIE_KL), which is no harm (pairs.simulated is seeded: the same
    # pairs every run).
    assert rates["candidate_exact_match"] < 1.0 and rates["candidate"] == 0.0
    assert rates["candidate_per_1000_words"] <= (
        rates["noise_floor_per_1000_words"] + 1000 * DEPARTURE_MARGIN / 2
    )
    assert benign["promote_rate"] == 1.0 and benign["median_days_to_decision"] >= 7.0


def test_on_long_answers_the_int8_part_is_promoted_and_the_cim_part_rejected() -> None:
    """At the simulator's own lengths (a median of 100 tokens) a benign part departs on more
    of its answers, as any part does on longer ones; per word at risk it does not."""
    natural = calibrate("simulated", runs=10, seed=3, pairs_measured=300, natural_lengths=True)
    s = natural["scenarios"]
    assert natural["targets_met"] == dict.fromkeys(SCENARIOS["simulated"], True)
    long_answers = s["benign"]["rates"]["temperature_0"]
    assert long_answers["candidate_words_at_risk_per_pair"] > 50
    assert s["benign"]["promote_rate"] == 1.0 and s["benign"]["median_days_to_decision"] == 7.0
    assert s["harmful"]["promote_rate"] == 0.0 and s["harmful"]["reject_rate"] == 1.0


def test_the_simulated_calibration_agrees_with_the_real_one(simulated: dict) -> None:
    """Each scenario both fleets run departs at temperature 0, on the simulator, within the
    99.9% interval of the real fleet's share (840 pairs, docs/results/promotion-real-seed0.json),
    and is decided alike."""
    real = json.loads((RESULTS / "promotion-real-seed0.json").read_text())["scenarios"]
    for name in ("aa", "benign", "harmful", "sampled"):
        ours, theirs = simulated["scenarios"][name], real[name]
        assert ours["promote_rate"] == theirs["promote_rate"], name
        assert ours["reject_rate"] == theirs["reject_rate"], name
    for name in ("aa", "benign", "sampled"):
        assert _departs_within_the_real_share(simulated, real, name)


def test_the_simulated_cim_part_departs_as_often_as_the_real_analog_part(simulated) -> None:
    real = json.loads((RESULTS / "promotion-real-seed0.json").read_text())["scenarios"]
    assert _departs_within_the_real_share(simulated, real, "harmful")


def _departs_within_the_real_share(simulated: dict, real: dict, name: str) -> bool:
    """Whether the simulated scenario's share of departing temperature-0 pairs lies within the
    99.9% interval of the real fleet's."""
    mine = simulated["scenarios"][name]["rates"]["temperature_0"]
    measured = real[name]["rates"]["temperature_0"]
    departed = round(measured["candidate"] * measured["pairs"])
    low, high = bernoulli_interval(departed, measured["pairs"], 1e-3)
    return bool(low <= mine["candidate"] <= high)


def test_simulated_sampled_pairs_match_and_depart_as_the_real_ones_do(simulated: dict) -> None:
    """At 0.7 the simulated int8 part's sampled pairs, and the floor's, match exactly and depart
    within the 99.9% interval of the real fleet's (840 pairs each), and leave their answers as
    late: a sampled pair puts at risk the share of a temperature-0 pair's words a real one does.
    The share, not the words: a simulated token is a word, a real answer has 1.43 tokens a word,
    so a simulated pair of the real answers' lengths puts more words at risk at any temperature."""
    real = json.loads((RESULTS / "promotion-real-seed0.json").read_text())["scenarios"]
    ours, theirs = simulated["scenarios"]["sampled"]["rates"], real["sampled"]["rates"]
    measured = theirs["sampled"]["pairs"]
    for figure in ("candidate", "noise_floor", "candidate_exact_match", "noise_exact_match"):
        low, high = bernoulli_interval(round(theirs["sampled"][figure] * measured), measured, 1e-3)
        assert low <= ours["sampled"][figure] <= high, (figure, ours["sampled"][figure])

    def kept(rates: dict) -> float:
        """A sampled pair's words at risk over a temperature-0 pair's."""
        words = "noise_words_at_risk_per_pair"
        return rates["sampled"][words] / rates["temperature_0"][words]

    assert kept(ours) == pytest.approx(kept(theirs), abs=0.05)


def test_harmful_errors_and_missed_slos_are_rejected(simulated: dict) -> None:
    for name in ("harmful", "worse_latency"):
        assert simulated["scenarios"][name]["reject_rate"] == 1.0, name


def test_sampled_traffic_is_decided_within_two_weeks(simulated: dict) -> None:
    sampled = simulated["scenarios"]["sampled"]
    assert "sampled" in sampled["rates"]
    assert sampled["promote_rate"] >= 0.8 and sampled["median_days_to_decision"] <= 14.0


@pytest.mark.alone  # five engines, their answers to every prompt: a minute of both cores
def test_the_real_fleet_is_measured_and_judged(tmp_path: Path) -> None:
    """One short calibration on llama.cpp engines: every part answers every prompt, the labels
    say how often each is right, and the analog part is rejected."""
    require_engine()
    result = calibrate("real", runs=5, seed=0, samples=1, logs=tmp_path)
    s = result["scenarios"]
    prompts = len(pairs.prompts())
    for name, scenario in s.items():
        rates = scenario["rates"]["temperature_0"]
        assert rates["pairs"] == rates["noise_pairs"] == prompts, name
        assert rates["labelled"] == 240, name
    harmful = s["harmful"]["rates"]["temperature_0"]
    # The analog part gets facts wrong: its labels say so, and so do its pairs.
    assert harmful["candidate_accuracy"] < harmful["primary_accuracy"] - 0.1
    assert harmful["candidate"] > harmful["noise_floor"] + 0.1
    assert s["harmful"]["reject_rate"] == 1.0
    # The answers it turns wrong are what departs: the departure share bounds the loss.
    assert harmful["turned_wrong"] > 0.1 * harmful["labelled"]
    assert harmful["turned_wrong_departed"] >= 0.9 * harmful["turned_wrong"]
    # Without embeddings the words catch them too: their first differing token is a near tie
    # at a KL the benign rule does not forgive, or no near tie at all (docs/promotion.md).
    assert harmful["turned_wrong_departed_by_words"] >= 0.9 * harmful["turned_wrong"]
    # The int8 part turns none wrong and is promoted at the default margin.
    assert s["benign"]["rates"]["temperature_0"]["turned_wrong"] == 0
    assert s["benign"]["promote_rate"] == 1.0
    # The replica is the reference's own hardware: it departs far less than the analog part.
    assert s["aa"]["rates"]["temperature_0"]["candidate"] < harmful["candidate"] / 10
    assert len(headline(result)) == len(s)
