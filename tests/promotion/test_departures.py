"""Departures: which compared pairs disagree in meaning, against the noise floor's tolerance."""

from __future__ import annotations

import json

import pytest

from gateway.compare.measures import JUDGED, MEASURES
from gateway.promotion.departures import (
    MIN_DIFFERING,
    MIN_PAIRS,
    NEAR_TIE_KL,
    SAME_MEANING,
    SAME_VECTOR,
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


def test_a_new_number_departs_however_alike_the_answers_read() -> None:
    # "4 kilograms is 4001 grams." beside "... 4000 grams.": a confident token replaced, which
    # an embedding model scores above any paraphrase figure and ROUGE-L near 0.95.
    changed = pair(new_number=True, near_tie=False, kl_divergence=0.4, semantic_similarity=0.99)
    for tol in (tolerance((), paraphrase=0.83), Tolerance()):
        assert departs(changed, tol)
        assert departs({**changed, "semantic_similarity": None, "similarity": 0.99}, tol)
        assert not departs({**changed, "new_number": False}, tol)
    # A near tie the two distributions reached alike stays benign: what follows it is the
    # part's own answer, numbers and all.
    assert not departs({**changed, "near_tie": True, "kl_divergence": 0.0}, Tolerance())


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
    noisy = [
        pair(semantic_similarity=0.90 + 0.1 * i / (MIN_PAIRS - 1), similarity=0.8)
        for i in range(MIN_PAIRS)
    ]
    tol = tolerance(noisy, paraphrase=0.83)
    assert 0.900 <= tol.meaning < 0.902 and tol.noise_pairs == MIN_PAIRS
    assert tol.words == 0.8
    # A pool whose own answers wander far: the start holds.
    wide = [pair(semantic_similarity=0.3 + 0.7 * i / 1999) for i in range(MIN_PAIRS)]
    assert tolerance(wide, paraphrase=0.83).meaning == 0.83
    # Greedy answers of a bf16 pool that differ only by flips: fully similar, so the cap holds.
    flips = [pair(semantic_similarity=1.0, similarity=0.99) for _ in range(MIN_DIFFERING)]
    exact = [pair(exact_match=True) for _ in range(MIN_PAIRS - MIN_DIFFERING)]
    assert tolerance([*flips, *exact], paraphrase=0.83).meaning == SAME_MEANING
    assert tolerance([*flips, *exact]).words == SAME_WORDS


# What one odd A/A pair measures: a changed fact, in meaning, in words, or in an embedding.
ODD = {"semantic_similarity": 0.45, "similarity": 0.45}
ODD_VECTOR = {"exact_match": None, "embedding_cosine": 0.45}


def floors(odd: int, benign: int = 0, n: int = 2500) -> tuple[list[dict], list[dict]]:
    """Return a text floor and an embedding floor of `n` pairs: `odd` of them odd, `benign`
    flips that stay close, the rest matching (text) or embedding alike (vectors)."""
    text = [pair(**ODD) for _ in range(odd)]
    text += [pair(semantic_similarity=0.99, similarity=0.97) for _ in range(benign)]
    text += [pair(exact_match=True) for _ in range(n - len(text))]
    vectors = [pair(**ODD_VECTOR) for _ in range(odd)]
    vectors += [pair(exact_match=None, embedding_cosine=0.9999) for _ in range(n - odd)]
    return text, vectors


def test_a_handful_of_odd_noise_floor_pairs_loosens_no_tolerance() -> None:
    """One differing A/A pair at 0.45 among 2,500 (or a handful, or the same few drawn again
    and again among many near-tie flips) loosens neither the meaning, the word nor the vector
    tolerance, with a declared paraphrase figure or without: it takes one floor pair in a
    hundred below a similarity to loosen a tolerance to it."""
    cases = [
        floors(odd=1),
        floors(odd=5),
        # 150 differing pairs, past MIN_DIFFERING, but only 5 of 2,500 odd.
        floors(odd=5, benign=150),
        # The calibration bench's week: 5 differing pairs of 1,500 measured, drawn 40,000 times.
        floors(odd=133, n=40_000),
    ]
    for text, vectors in cases:
        for paraphrase, meaning in ((None, SAME_MEANING), (0.83, 0.83)):
            tol = tolerance(text, paraphrase)
            assert (tol.meaning, tol.words) == (meaning, SAME_WORDS), (len(text), paraphrase)
            # A changed fact above the odd pair's similarity still departs.
            assert departs(pair(semantic_similarity=0.6), tol)
            assert departs(pair(similarity=0.6, near_tie=False), tol)
            assert tolerance(vectors, paraphrase).vectors == SAME_VECTOR
            assert departs(pair(exact_match=None, embedding_cosine=0.6), tolerance(vectors))


def test_a_floor_loosens_a_tolerance_once_a_pair_in_a_hundred_falls_below_it() -> None:
    # One pair in a hundred and more at 0.45 among 2,500 (and as many differing past
    # MIN_DIFFERING): that is the floor's own spread, so the undeclared tolerances loosen to it.
    text, vectors = floors(odd=30, benign=100)
    assert tolerance(text).meaning == tolerance(text).words == 0.45
    assert tolerance(text, paraphrase=0.83).meaning == 0.83  # a declared figure never loosens
    assert tolerance(vectors).vectors == SAME_VECTOR  # nor the vectors' declared start
    # Under 2,000 pairs in all, or 100 differing, the starts hold whatever the share.
    assert tolerance(text[: MIN_PAIRS - 1]) == Tolerance()
    assert tolerance(floors(odd=30)[0]) == Tolerance()


def test_a_sampled_floor_sets_its_looser_tolerance_from_its_many_differing_pairs() -> None:
    """Two samples of one pool differ by design: a sampled floor whose pairs differ on a
    seventh of its prompts, their word similarity from 0.3 to 0.95 and their meaning from 0.2
    up, loosens the undeclared tolerances to its 1st percentile over all its pairs."""
    n, differing = 2500, 350
    spread = [i / (differing - 1) for i in range(differing)]
    sampled = [
        pair(similarity=0.3 + 0.65 * x, semantic_similarity=0.2 + 0.79 * x) for x in spread
    ] + [pair(exact_match=True) for _ in range(n - differing)]
    tol = tolerance(sampled)
    # The 26th lowest of 2,500 pairs: 25 of them lie below it.
    assert tol.words == pytest.approx(0.3 + 0.65 * 25 / 349)
    assert tol.meaning == pytest.approx(0.2 + 0.79 * 25 / 349)
    assert tol.noise_pairs == n
    assert not departs(pair(similarity=0.5, near_tie=False), tol)  # a sample's other words
    assert tolerance(sampled, paraphrase=0.83).meaning == 0.83


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
    few = [pair(semantic_similarity=0.5, similarity=0.5) for _ in range(MIN_PAIRS - 1)]
    assert tolerance(few) == Tolerance()
    assert "the starts (a noise floor moves them from 2,000 pairs" in tolerance(few).describe()
    rare = [pair(semantic_similarity=0.5, similarity=0.5) for _ in range(MIN_DIFFERING - 1)]
    assert tolerance([*rare, *[pair(exact_match=True)] * MIN_PAIRS]) == Tolerance()


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
