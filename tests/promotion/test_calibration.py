"""Calibration: each scenario's answers come from the simulator's precision model and are read by
the gateway's own comparison code; the judge decides on a virtual clock over one or two weeks."""

from __future__ import annotations

import pytest

from gateway.promotion.calibration import calibrate


@pytest.fixture(scope="module")
def result() -> dict:
    return calibrate(runs=10, seed=3, pairs=300)


def test_every_scenario_meets_its_target(result: dict) -> None:
    assert result["targets_met"] == dict.fromkeys(result["targets"], True)
    assert result["false_promotion_rate"] <= 0.05
    assert result["power_reject_worse"] >= 0.95
    assert result["power_promote_good"] >= 0.90


def test_same_hardware_is_never_promoted(result: dict) -> None:
    assert result["scenarios"]["aa"]["outcomes"] == {"hold": 10}


def test_an_int8_part_with_benign_flips_only_is_promoted_once_a_week_has_passed(result):
    benign = result["scenarios"]["benign_int8"]
    rates = benign["departure_rates"]["temperature_0"]
    # Most of its answers differ from the GPU's word for word, far more than the GPU's own do.
    assert rates["candidate_exact_match"] < rates["noise_exact_match"] - 0.3
    assert benign["promote_rate"] == 1.0 and benign["median_days_to_decision"] >= 7.0


def test_harmful_errors_hidden_among_benign_flips_are_rejected(result: dict) -> None:
    harmful = result["scenarios"]["harmful"]
    assert harmful["promote_rate"] == 0.0 and harmful["reject_rate"] >= 0.9


def test_a_good_candidate_on_mostly_sampled_traffic_is_promoted_within_two_weeks(result):
    sampled = result["scenarios"]["sampled"]
    assert "sampled" in sampled["departure_rates"]
    assert sampled["promote_rate"] >= 0.8 and sampled["median_days_to_decision"] <= 14.0
