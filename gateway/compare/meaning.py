"""Semantic similarity of two answers from their embeddings, window by window. Pure.

An embedding of a whole long answer dilutes one wrong sentence among many right ones, so each
answer is cut into windows of `WINDOW_WORDS` words and the windows are compared in order: the
answers' similarity is that of their least similar pair of windows. Where one answer has more
windows than the other, the extra windows count as unlike anything (0), as a long addition is.
The vectors come from the fleet's embedding route (gateway/shadow/semantic.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.compare.measures import cosine

WINDOW_WORDS = 200
MAX_WINDOWS = 8  # per answer: at most 1,600 words are embedded, the rest is not compared


def windows(text: str) -> list[str]:
    """Cut an answer into windows of WINDOW_WORDS words (one window for a short answer)."""
    words = text.split()
    if not words:
        return [text]
    cut = [
        " ".join(words[start : start + WINDOW_WORDS])
        for start in range(0, len(words), WINDOW_WORDS)
    ]
    return cut[:MAX_WINDOWS]


def similarity(
    primary: Sequence[Sequence[float]], candidate: Sequence[Sequence[float]]
) -> float | None:
    """Return the lowest cosine of the windows in order; None when a vector is unusable."""
    if not primary or not candidate:
        return None
    scores = [cosine(a, b) for a, b in zip(primary, candidate, strict=False)]
    if any(score is None for score in scores):
        return None
    if len(primary) != len(candidate):
        scores.append(0.0)
    return round(min(score for score in scores if score is not None), 6)
