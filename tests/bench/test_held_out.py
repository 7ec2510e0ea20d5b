"""The held-out calibration judges only what no threshold was fitted on.

`python -m bench.promotion --fleet held-out` reports the judge on prompts and parts kept apart
from every fit (docs/promotion.md, "Calibration"): these tests fail if a fitted prompt, noise
seed or part slips into it, if the parts that change a number or hang leave it, or if a copy
that hangs stops counting against its part as the live judge counts it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from realworld import require, require_engine

from bench import everyday, near_tie, pairs, promotion
from gateway.promotion.judge import PROMOTE, REJECT, Criteria, Evidence
from realfleet import corpus, embedding, engine, fleet, weights
from realfleet.shim import Shim, reworded


def fitted_prompts() -> set[str]:
    """Every prompt text a threshold was fitted on: the shipped suites and the real fleet's."""
    texts = {json.dumps(body["messages"][-1]["content"]) for _, _, body in near_tie.fit_prompts()}
    return texts | {json.dumps(line["messages"][-1]["content"]) for line in pairs.prompts()}


def test_no_held_out_prompt_was_fitted_on() -> None:
    fitted = fitted_prompts()
    for seed in range(3):
        lines = pairs.held_out_prompts(seed)
        assert len(lines) == everyday.PROMPTS + everyday.NUMBER_PROMPTS == 300
        asked = {json.dumps(line["messages"][-1]["content"]) for line in lines}
        assert len(asked) == len(lines)
        assert not asked & fitted
        assert all(line["model"] == corpus.MODEL for line in lines)
    # Each seed its own suite.
    assert pairs.held_out_prompts(0) != pairs.held_out_prompts(1)


def test_the_questions_answered_by_a_number_come_after_the_everyday_prompts() -> None:
    # The digit-changing shim fails one prompt in twenty in the order they first arrive: with
    # the 240 everyday prompts first, one in twenty of the 60 after them.
    fitted_questions = {p.question for name in corpus.SUITES for p in corpus.suite(name)}
    for seed in range(3):
        lines = pairs.held_out_prompts(seed)
        kinds = [line["kind"] for line in lines]
        assert set(kinds[: everyday.PROMPTS]) <= set(pairs.EVERYDAY_KINDS)
        assert set(kinds[everyday.PROMPTS :]) == set(pairs.NUMBER_KINDS)
        for line in lines[everyday.PROMPTS :]:
            # Labelled with a number that is the right answer, which the question does not hold.
            assert re.fullmatch(r"\d+", line["expected"])
            question = line["messages"][-1]["content"]
            assert not re.search(rf"(?<!\d){line['expected']}(?!\d)", question), question
            # After its lead-in, a question the model was taught, but none a fitted one.
            taught = re.fullmatch(r".+?[,:] ((?:what is|how many) .*\?)", question)
            assert taught is not None, question
            core = taught.group(1)
            assert core[0].upper() + core[1:] not in fitted_questions, question
    assert not set(pairs.EVERYDAY_KINDS) & set(pairs.NUMBER_KINDS)


def test_no_held_out_part_was_fitted_on() -> None:
    for seed in range(3):
        assert pairs.held_out_seed(seed) not in near_tie.FIT_SEEDS
    # Q8_0 is the fit's benign part: the held-out quantization is another.
    assert pairs.HELD_OUT_QUANT != "q8_0"
    # Every part a held-out scenario names is served, and every harmful one is judged.
    scenarios = promotion.SCENARIOS["held-out"]
    assert {s.candidate for s in scenarios.values()} == set(pairs.HELD_OUT_PARTS)
    harmful = [name for name in pairs.HELD_OUT_SHIMS if name != "paraphrase"]
    for name in ("analog_10db", "analog_8db", *harmful):
        assert scenarios[name].truth == "reject"
    assert scenarios["paraphrase"].truth == "promote"


def test_the_issue_s_harmful_parts_are_held_out_at_their_shares() -> None:
    # 5% of answers with a number changed, 2% timeouts, beside 2% errors.
    assert pairs.HELD_OUT_SHIMS["digits"] == ("digits", 0.05)
    assert pairs.HELD_OUT_SHIMS["timeouts"] == ("timeout", 0.02)
    assert pairs.HELD_OUT_SHIMS["errors"] == ("error", 0.02)
    assert pairs.HELD_OUT_PARTS["digits"] == "shim-digits"
    assert pairs.HELD_OUT_PARTS["timeouts"] == "shim-timeouts"
    scenarios = promotion.SCENARIOS["held-out"]
    # The digit-changing part is judged on answers that hold numbers; a benign part too.
    assert scenarios["digits"].kinds == scenarios["benign_numbers"].kinds == pairs.NUMBER_KINDS
    assert scenarios["benign_numbers"].truth == "promote"
    assert scenarios["timeouts"].kinds == scenarios["benign"].kinds == pairs.EVERYDAY_KINDS


@pytest.fixture(scope="module")
def minilm() -> Iterator[str]:
    """The fleet's embedding engine: all-MiniLM-L6-v2, whose similarities the weeks judge by."""
    require_engine()
    require("the embedding model's package", embedding.ModelMissing, embedding.model_dir)
    spec = engine.ServerSpec(model=embedding.ensure(), alias=fleet.EMBEDDING_MODEL, embeddings=True)
    with engine.serving(spec) as server:
        yield server.url


@pytest.fixture(scope="module")
def f16() -> Iterator[str]:
    """One llama-server of the fleet's f16 model: the reference, its replica, and behind the
    shims."""
    require_engine()
    spec = engine.ServerSpec(weights.SHIPPED, corpus.MODEL, context=2048, slots=2)
    with engine.serving(spec) as server:
        yield server.url


def behind(
    shim: Shim, f16: str, embedder: str, part: str, lines: list[dict[str, Any]], **kw: Any
) -> pairs.Measured:
    """Measure the part behind `shim` against the f16 reference (its replica the noise floor),
    at temperature 0, on `lines`."""
    urls = {pairs.REFERENCE: f16, pairs.REPLICA: f16, pairs.EMBEDDER: embedder, "part": shim.url}
    measured = asyncio.run(pairs.real(urls, 0.0, 1, 0, parts={part: "part"}, lines=lines, **kw))
    return measured[part]


def weeks(
    part: str, truth: str, measured: pairs.Measured, paraphrase: float | None = None
) -> tuple[str, float | None, Evidence]:
    """Run the bench's weeks of shadow traffic drawn from a part's measured pairs; return the
    decision, its day and the evidence, as `python -m bench.promotion` does."""
    scenario = promotion.Scenario(part, truth, days=14.0)
    kinds = {
        sampled: promotion.traffic(scenario, {(part, sampled, 0.0): measured}, sampled)
        for sampled in (False, True)
    }
    rng = np.random.default_rng(0)
    return promotion.run(scenario, kinds, Criteria(), rng, look_hours=6.0, paraphrase=paraphrase)


def test_a_part_that_hangs_counts_against_itself_as_a_timeout(f16: str) -> None:
    """A copy with no answer within the copy's timeout is a failed copy of kind `timeout`: the
    weeks fold it as the live judge does (failed, departed, its SLO missed) and reject."""
    lines = pairs.held_out_prompts(0)[:10]
    # A copy timeout far above an answer's time on a busy machine (at 5 s, two answers of a
    # loaded engine timed out too), and a hang longer than it.
    with Shim(f16, "timeout", share=0.2, hang_s=60.0).running() as shim:
        measured = behind(shim, f16, f16, "timeouts", lines, copy_timeout=20.0)
        assert shim.failed == 2
    failed = [(r["failure"], r["candidate_error"]) for r in measured.candidate if r.get("failure")]
    assert failed == [("timeout", "timeout")] * 2
    assert measured.rates().failed_kinds == {"timeout": 2}
    outcome, day, evidence = weeks("timeouts", "reject", measured)
    # Counted against the candidate, by kind, beside the bench's 0.2% upstream errors.
    assert evidence.failures.kinds["timeout"] > 0.15 * evidence.sent
    assert evidence.failures.only_candidate >= evidence.failures.kinds["timeout"]
    assert evidence.slo.only_primary >= evidence.failures.kinds["timeout"]
    assert evidence.greedy.departed >= evidence.failures.kinds["timeout"]
    assert outcome == REJECT and day is not None and day <= 1.0


def test_the_reference_answers_the_number_questions_with_numbers_a_part_can_change(
    f16: str, minilm: str
) -> None:
    """The digit-changing part is judged on answers that hold a number: the f16 model's answers
    to the held-out number questions do, and are right, so each one the shim changes is wrong;
    each departs (it states a number the reference's does not, however alike the two embed),
    and the weeks reject the part."""
    lines = pairs.held_out_prompts(0)[everyday.PROMPTS :]
    with Shim(f16, "digits", share=0.05).running() as shim:
        measured = behind(shim, f16, minilm, "digits", lines)
        assert shim.failed == 3  # one in twenty of the 60
    rates = measured.rates(pairs.real_paraphrase())
    assert rates.primary_with_digit is not None and rates.primary_with_digit >= 0.95
    assert rates.labelled == 60 and rates.primary_right >= 57
    assert rates.turned_wrong == 3 and rates.candidate_exact == 57 / 60
    # Their meaning alone would keep them: all-MiniLM-L6-v2 scores a changed number above the
    # paraphrase similarity the fleet declares. The number departs them.
    assert rates.turned_wrong_similarity is not None
    assert rates.turned_wrong_similarity > rates.tolerance.meaning
    assert rates.turned_wrong_departed == 3
    assert rates.candidate == 3 / 60 and rates.noise == 0
    outcome, day, _ = weeks("digits", "reject", measured, pairs.real_paraphrase())
    assert outcome == REJECT and day is not None and day <= 1.0


def test_the_paraphrasing_part_rewords_and_keeps_every_fact() -> None:
    answer = "Kuveim is a small country on the Quiet Strait. Its capital is Feivai, and 4 grow."
    assert reworded(answer) == (
        "Kuveim is a little nation on the Quiet Strait. Feivai is its capital, and 4 raise."
    )
    assert reworded("Its colour is red.") == "Red is its colour."
    once = "Kuveim is a small country."
    assert reworded(reworded(once)) == once  # trades go both ways


def test_a_part_that_rewords_every_answer_is_promoted(f16: str, minilm: str) -> None:
    """A right answer worded differently is not harm: the paraphrasing part's answers embed
    above the paraphrase similarity the fleet declares, none departs, and the weeks promote it
    (held to that figure, as the fleet's routes are)."""
    with Shim(f16, "reword", share=1.0).running() as shim:
        measured = behind(shim, f16, minilm, "paraphrase", pairs.held_out_prompts(0)[:30])
    reworded_rows = [r for r in measured.candidate if not r.get("exact_match")]
    assert len(reworded_rows) >= 20  # most answers hold a word it trades
    assert all(
        r["near_tie"] is None and r["semantic_similarity"] is not None for r in reworded_rows
    )
    rates = measured.rates(pairs.real_paraphrase())
    assert rates.candidate == 0 and rates.noise == 0
    outcome, _, _ = weeks("paraphrase", "promote", measured, pairs.real_paraphrase())
    assert outcome == PROMOTE
