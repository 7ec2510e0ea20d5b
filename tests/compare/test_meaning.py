"""Semantic similarity over windows: a wrong sentence in a long answer is not diluted away."""

from __future__ import annotations

from gateway.compare.meaning import MAX_WINDOWS, WINDOW_WORDS, similarity, windows


def test_a_short_answer_is_one_window_and_a_long_one_is_cut_by_words() -> None:
    assert windows("a short answer") == ["a short answer"]
    long = " ".join(f"w{i}" for i in range(2 * WINDOW_WORDS + 5))
    cut = windows(long)
    assert [len(w.split()) for w in cut] == [WINDOW_WORDS, WINDOW_WORDS, 5]
    assert len(windows("x " * (WINDOW_WORDS * (MAX_WINDOWS + 3)))) == MAX_WINDOWS


def test_the_least_similar_window_decides() -> None:
    same, other = [1.0, 0.0], [0.6, 0.8]
    assert similarity([same, same], [same, same]) == 1.0
    assert similarity([same, same], [same, other]) == 0.6


def test_an_answer_with_more_windows_than_the_other_is_unlike_it() -> None:
    assert similarity([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]) == 0.0


def test_a_missing_or_broken_vector_gives_no_similarity() -> None:
    assert similarity([], [[1.0]]) is None
    assert similarity([[0.0, 0.0]], [[1.0, 0.0]]) is None
