"""The simulator's precision model held to the real fleet it is fit to (bench/precision_fit.py):
each profile, answering prompts of the real answers' lengths, flips and turns answers wrong
within the 1 - ALPHA interval of the real part it stands for (docs/results/precision-fit.json).
The simulated answers are seeded, so each test's figure is the same every run."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from random import Random

import pytest

from bench import pairs
from bench.precision_fit import STANDS_FOR, noise_for, sampling_fit, summary
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


@pytest.mark.parametrize(
    "profile",
    [
        pytest.param(
            "asic",
            marks=pytest.mark.xfail(
                strict=True,
                reason="the real int8 part's share was measured before near-tie flips at a small"
                " KL were forgiven (docs/results/precision-fit.json: 100 of 104 depart); under"
                " the rule its differing answers rarely depart (3 of 34 on the near-tie fit),"
                " as the profile's do: refit on the real fleet with bench.precision_fit",
            ),
        ),
        pytest.param(
            "cim",
            marks=pytest.mark.xfail(
                strict=True,
                reason="the simulated CIM's flips are near ties at a KL the benign rule forgives,"
                " the real analog part's come at a KL of 0.3 to 0.46: the simulator's precision"
                " model is not yet fit to the real KL",
            ),
        ),
    ],
)
def test_a_profiles_differing_answers_depart_as_the_real_parts_do(profile: str) -> None:
    """After a flip the answer goes its own way, as the real part's does (100 of 104 depart)."""
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
