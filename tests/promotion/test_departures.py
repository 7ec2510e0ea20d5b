"""Departures: which compared pairs disagree in meaning, against the noise floor's tolerance."""

from __future__ import annotations

import json

from gateway.compare.measures import JUDGED, MEASURES
from gateway.promotion.departures import (
    MIN_DIFFERING,
    NEAR_TIE_KL,
    SAME_MEANING,
    SAME_WORDS,
    Tolerance,
    at_risk,
    departs,
    tolerance,
    words_at_risk,
)


def pair(**measures: object) -> dict:
    return {"exact_match": False, "candidate_error": None, **measures}


class Read(dict):
    """A pair's row that notes which of its keys the rule read."""

    def __init__(self, **row: object) -> None:
        super().__init__(row)
        self.read: set[str] = set()

    def get(self, key: str, default: object = None) -> object:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> object:
        self.read.add(key)
        return super().__getitem__(key)


def test_the_rule_decides_by_the_measures_diff_declares_judged_and_no_other() -> None:
    # A pair no early answer decides: the rule reads everything it can decide by.
    row = Read(**pair(json_diff=None, near_tie=False, similarity=0.5))
    departs(row, tolerance([]))
    # What a precision check keeps of a departing pair (gateway/promotion/precision/figures.py)
    # is JUDGED, so it is what decided; the rest the rule reads are the check's marks.
    assert row.read & set(MEASURES) == set(JUDGED)
    assert row.read - set(MEASURES) == {"failure", "cut_after_tie"}


def test_an_exact_match_never_departs_whatever_else_was_measured() -> None:
    assert not departs(pair(exact_match=True, semantic_similarity=0.1), Tolerance())


def test_semantic_similarity_decides_where_it_was_measured() -> None:
    tol = Tolerance()
    assert not departs(pair(semantic_similarity=0.995, near_tie=False, similarity=0.2), tol)
    assert departs(pair(semantic_similarity=0.9, near_tie=True, similarity=0.99), tol)


def test_without_meaning_a_near_tie_at_the_first_difference_does_not_depart() -> None:
    tol = Tolerance()
    assert not departs(pair(near_tie=True, similarity=0.5), tol)
    assert departs(pair(near_tie=False, similarity=0.5), tol)
    assert not departs(pair(near_tie=None, similarity=0.97), tol)
    # Where KL says the distributions had moved before the tie, the words decide.
    assert departs(pair(near_tie=True, kl_divergence=10 * NEAR_TIE_KL, similarity=0.5), tol)


def test_a_near_tie_at_a_small_kl_does_not_depart_whatever_follows() -> None:
    # A benign flip: the answers part at a tie the two distributions reached alike, and the
    # rest goes its own way, far in meaning and in words.
    tol = tolerance((), paraphrase=0.83)
    for kl in (0.0, NEAR_TIE_KL / 10, NEAR_TIE_KL):
        flip = pair(near_tie=True, kl_divergence=kl, semantic_similarity=0.2, similarity=0.1)
        assert not departs(flip, tol)
        assert not departs(flip, Tolerance())  # the strictest tolerance too
        assert not departs({**flip, "semantic_similarity": None}, tol)  # without embeddings


def test_a_near_tie_at_a_large_kl_or_a_confident_token_replaced_departs() -> None:
    tol = tolerance((), paraphrase=0.83)
    moved = pair(near_tie=True, kl_divergence=NEAR_TIE_KL * 1.5, semantic_similarity=0.6)
    assert departs(moved, tol)
    confident = pair(near_tie=False, kl_divergence=0.0, semantic_similarity=0.6)
    assert departs(confident, tol)
    # A near tie whose KL was not measured (a primary answer without logprobs) is judged by
    # its meaning.
    unmeasured = pair(near_tie=True, kl_divergence=None, semantic_similarity=0.6)
    assert departs(unmeasured, tol)
    # Above the tolerance none of them departs: the benign rule only ever forgives.
    for row in (moved, confident, unmeasured):
        assert not departs({**row, "semantic_similarity": 0.9}, tol)


def test_a_failed_copy_departs_even_after_a_benign_flip() -> None:
    for failure in ("empty", "cut_short", "timeout"):
        row = pair(failure=failure, near_tie=True, kl_divergence=0.0, semantic_similarity=0.99)
        assert departs(row, Tolerance())


def test_a_changed_json_field_departs_even_after_a_benign_flip() -> None:
    diff = json.dumps({"missing": [], "extra": [], "changed": ["$.unit"]})
    row = pair(json_diff=diff, near_tie=True, kl_divergence=0.0, semantic_similarity=0.99)
    assert departs(row, Tolerance())


def test_a_changed_json_field_departs_even_if_the_texts_embed_alike() -> None:
    diff = json.dumps({"missing": [], "extra": [], "changed": ["$.unit"]})
    assert departs(pair(json_diff=diff, semantic_similarity=0.99), Tolerance())
    same = json.dumps({"missing": [], "extra": [], "changed": []})
    assert not departs(pair(json_diff=same, semantic_similarity=0.99), Tolerance())


def test_the_meaning_tolerance_starts_at_the_embedding_models_paraphrase_similarity() -> None:
    tol = tolerance((), paraphrase=0.83)
    assert tol.meaning == 0.83
    # A right answer worded differently (all-MiniLM-L6-v2 rates such pairs 0.865 to 0.976) does
    # not depart; a changed fact far below does.
    assert not departs(pair(semantic_similarity=0.865, first_divergence=0), tol)
    assert departs(pair(semantic_similarity=0.6, first_divergence=0), tol)
    assert tolerance(()).meaning == SAME_MEANING  # a model that declares no figure


def test_a_noise_floor_tightens_the_meaning_tolerance_and_never_loosens_it() -> None:
    # Sampled answers of one pool: their similarity spreads from 0.90 to 1.0.
    noisy = [pair(semantic_similarity=0.90 + 0.1 * i / 999, similarity=0.8) for i in range(1000)]
    tol = tolerance(noisy, paraphrase=0.83)
    assert 0.900 <= tol.meaning < 0.902 and tol.noise_pairs == 1000
    assert tol.words == 0.8
    # A pool whose own answers wander far: the start holds.
    wide = [pair(semantic_similarity=0.3 + 0.7 * i / 999) for i in range(1000)]
    assert tolerance(wide, paraphrase=0.83).meaning == 0.83
    # Greedy answers of a bf16 pool that differ only by flips: fully similar, so the cap holds.
    flips = [pair(semantic_similarity=1.0, similarity=0.99) for _ in range(MIN_DIFFERING)]
    assert tolerance(flips, paraphrase=0.83).meaning == SAME_MEANING
    assert tolerance(flips).words == SAME_WORDS


def test_one_odd_noise_floor_pair_cannot_loosen_the_meaning_tolerance() -> None:
    floor = [pair(exact_match=True) for _ in range(2499)]
    before = tolerance(floor, paraphrase=0.83)
    after = tolerance([*floor, pair(semantic_similarity=0.45)], paraphrase=0.83)
    assert before.meaning == after.meaning == 0.83


def test_a_failed_copy_departs_at_its_first_word() -> None:
    empty = pair(failure="empty", semantic_similarity=None, first_divergence=0, reference_words=40)
    assert departs(empty, Tolerance()) and at_risk(empty) == 1
    timeout = {"exact_match": None, "candidate_error": "upstream_timeout", "failure": "timeout"}
    assert departs(timeout, Tolerance()) and at_risk(timeout) == 1
    cut = pair(
        failure="cut_short", semantic_similarity=0.99, first_divergence=30, reference_words=40
    )
    assert departs(cut, Tolerance()) and at_risk(cut) == 31


def test_too_few_noise_pairs_give_the_default_tolerance() -> None:
    few = [pair(semantic_similarity=0.5) for _ in range(MIN_DIFFERING - 1)]
    assert tolerance(few) == Tolerance()
    assert "too few noise-floor pairs" in tolerance(few).describe()


def test_words_at_risk_run_to_the_first_difference_or_the_whole_answer() -> None:
    assert words_at_risk(True, None, 30) == 30
    assert words_at_risk(False, 0, 30) == 1  # the first word differs: one word was at risk
    assert words_at_risk(False, 11, 30) == 12
    assert words_at_risk(False, 40, 30) == 30  # the candidate ran on past the reference's end
    assert words_at_risk(None, None, 7) == 7  # without the measure, the whole answer


def test_a_record_without_the_primarys_length_has_no_words_at_risk() -> None:
    # Stored before the length was measured: a matching pair cannot say what it put at risk.
    assert at_risk(pair(exact_match=True, first_divergence=None)) is None
    assert at_risk(pair(first_divergence=3, reference_words=20)) == 4
    assert at_risk(pair(exact_match=True, reference_words=20)) == 20
    # An embedding answer has no words: one vector, one at risk.
    assert at_risk(pair(exact_match=None, embedding_cosine=0.99)) == 1
