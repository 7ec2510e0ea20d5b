"""The held-out calibration judges only what no threshold was fitted on.

`python -m bench.promotion --fleet held-out` reports the judge on prompts and parts kept apart
from every fit (docs/promotion.md, "Calibration"): these tests fail if a fitted prompt, noise
seed or part slips into it.
"""

from __future__ import annotations

import json

from bench import near_tie, pairs, promotion
from realfleet import corpus


def fitted_prompts() -> set[str]:
    """Every prompt text a threshold was fitted on: the shipped suites and the real fleet's."""
    texts = {json.dumps(body["messages"][-1]["content"]) for _, _, body in near_tie.fit_prompts()}
    return texts | {json.dumps(line["messages"][-1]["content"]) for line in pairs.prompts()}


def test_no_held_out_prompt_was_fitted_on() -> None:
    fitted = fitted_prompts()
    for seed in range(3):
        lines = pairs.held_out_prompts(seed)
        assert len(lines) == 240
        asked = {json.dumps(line["messages"][-1]["content"]) for line in lines}
        assert not asked & fitted
        assert all(line["model"] == corpus.MODEL for line in lines)
    # Each seed its own suite.
    assert pairs.held_out_prompts(0) != pairs.held_out_prompts(1)


def test_no_held_out_part_was_fitted_on() -> None:
    for seed in range(3):
        assert pairs.held_out_seed(seed) not in near_tie.FIT_SEEDS
    # Q8_0 is the fit's benign part: the held-out quantization is another.
    assert pairs.HELD_OUT_QUANT != "q8_0"
    # Every part a held-out scenario names is served, and every harmful one is judged.
    scenarios = promotion.SCENARIOS["held-out"]
    assert {s.candidate for s in scenarios.values()} == set(pairs.HELD_OUT_PARTS)
    for name in ("analog_10db", "analog_8db", *pairs.HELD_OUT_SHIMS):
        assert scenarios[name].truth == "reject"
