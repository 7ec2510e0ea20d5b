"""The simulator's precision model held to the real fleet it is fit to (bench/precision_fit.py):
each profile, answering prompts of the real answers' lengths, flips and turns answers wrong
within the 1 - ALPHA interval of the real part it stands for (docs/results/precision-fit.json).
The simulated answers are seeded, so each test's figure is the same every run."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from random import Random

import pytest

from bench import pairs
from bench.precision_fit import STANDS_FOR, noise_for, sampling_fit, summary
from gateway.promotion.departures import NEAR_TIE_KL
from simulator.answers import HARMFUL, Question, compose
from simulator.precision import SAMPLING_SURENESS, flip_chance
from simulator.profile import load_profile

FIT = json.loads((Path(__file__).parents[2] / "docs/results/precision-fit.json").read_text())
LENGTHS = FIT["lengths"]


@functools.cache
def _answered(profile: str) -> dict:
    """Ten answers a prompt of the real suite, each as long as the real reference's answer."""
    return summary(
        pairs.simulated(profile, 0.0, 10 * len(LENGTHS), 0, 0.0, lengths=LENGTHS).candidate
    )


@pytest.mark.parametrize("profile", sorted(STANDS_FOR))
def test_a_profile_flips_benignly_as_often_as_the_real_part_it_stands_for(profile: str) -> None:
    fitted = FIT["fit"]["profiles"][profile]
    rate = _answered(profile)["flip_rate_per_token"]
    low, high = fitted["benign_flip_rate_interval"]
    assert low <= rate <= high, (profile, rate, fitted)


@pytest.mark.parametrize("profile", ["asic", "cim"])
def test_a_profiles_differing_answers_depart_as_the_real_parts_do(profile: str) -> None:
    """After a flip the answer goes its own way, as the real part's does, and is judged as the
    real part's are under the benign rule: the analog part's depart (its flips come at a KL
    the rule never forgives), the int8 part's are forgiven."""
    s, fitted = _answered(profile), FIT["fit"]["profiles"][profile]
    low, high = fitted["differing_departed_interval"]
    assert s["differing"] and low <= s["differing_departed"] / s["differing"] <= high, s


@pytest.mark.parametrize("profile", sorted(STANDS_FOR))
def test_a_profile_turns_answers_wrong_as_often_as_the_real_part_it_stands_for(
    profile: str,
) -> None:
    fitted = FIT["fit"]["profiles"][profile]
    precision = load_profile(profile).precision
    rng = Random(0)
    answers = [
        compose(
            Question("m", f"fact {i}", limit=LENGTHS[i % len(LENGTHS)], temperature=0),
            noise=precision.logit_noise,
            harmful_rate=precision.harmful_rate,
            rng=rng,
        )
        for i in range(10 * len(LENGTHS))
    ]
    share = sum(answer.precision == HARMFUL for answer in answers) / len(answers)
    low, high = fitted["turned_wrong_interval"]
    assert low <= share <= high, (profile, share, fitted)


def test_the_fitted_noise_gives_back_the_rate_it_was_fit_to() -> None:
    share = FIT["fit"]["content_share"]
    for rate in (1e-4, 2e-4, 0.028):
        assert flip_chance(noise_for(rate, share)) * share == pytest.approx(rate, rel=1e-9)


def test_sampling_is_as_sure_as_the_fit_to_the_real_sampled_pairs_says() -> None:
    """The sureness the simulator samples with is the one its fit gives back: two answers sampled
    at 0.7 match as often as the real reference's and its replica's (86% of 840 pairs)."""
    fitted = sampling_fit()
    assert fitted["fitted_sampling_sureness"] == pytest.approx(SAMPLING_SURENESS, rel=0.05)


@pytest.mark.parametrize("profile", ["asic", "cim"])
def test_a_profiles_flips_come_at_the_kl_the_real_parts_do(profile: str) -> None:
    """The benign rule reads a flip's KL: a profile's flips fall within the benign limit as
    often as the real part's do (Q8_0's nearly all, the analog part's none), at a median KL
    within a factor of two of the real part's."""
    fitted = FIT["fit"]["profiles"][profile]
    flips = [
        r["kl_divergence"]
        for r in pairs.simulated(profile, 0.0, 10 * len(LENGTHS), 0, 0.0, lengths=LENGTHS).candidate
        if not r["exact_match"] and r["kl_divergence"] is not None
    ]
    within = sum(kl <= NEAR_TIE_KL for kl in flips) / len(flips)
    low, high = fitted["flip_kl_within_limit_interval"]
    assert low <= within <= high, (profile, within, fitted)
    assert 0.5 <= statistics.median(flips) / fitted["flip_kl_median"] <= 2.0, flips


@pytest.mark.parametrize("profile", sorted(STANDS_FOR))
def test_a_profiles_drift_is_the_one_its_fit_gives(profile: str) -> None:
    """Each profile's drift is what the fit to the real part's flips gives back, within 10%."""
    fitted = FIT["fit"]["profiles"][profile]
    assert load_profile(profile).precision.drift == pytest.approx(fitted["fitted_drift"], rel=0.1)
