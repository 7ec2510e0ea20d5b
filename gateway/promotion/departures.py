"""Departures: which compared pairs disagree in meaning, measured against the noise floor.

Exact match cannot judge low-precision hardware: an int8 part flips near-tie tokens on most long
answers and means the same thing, and two runs of a bf16 GPU differ too. A pair *departs* when
its answers differ by more than the route's own noise floor lets two answers of one pool differ:

- pairs that match exactly never depart;
- a structured answer (JSON, tool calls) departs when a field differs;
- where the answers' semantic similarity was measured (the fleet's embedding route), a pair
  departs when it falls below the tolerance: the 1st percentile of the similarity of the noise
  floor's differing pairs, at most `SAME_MEANING`; the same for embedding answers' cosine;
- otherwise the words decide: a pair whose first differing token was a near tie (the
  candidate's token among the primary's top logprobs) does not depart, else one whose word
  similarity (ROUGE-L) falls below the word tolerance (at most `SAME_WORDS`) does.

A pair departs at most once, and its words at risk say how often it could have: the reference's
words up to and including the first that differs, all of them when none does. Departures per word
at risk are what a precision check (gateway/promotion/precision/rates.py) and the judge's quality
check count. An embedding answer is one vector, so one at risk.

Pure: rows in, counts out. Rows carry a shadow record's measures (gateway/shadow/records.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Ceilings of the tolerance: an embedding model rates a paraphrase at or above 0.98 and a
# changed fact below; ROUGE-L keeps 0.95 through a few changed words in a hundred.
SAME_MEANING = 0.98
SAME_WORDS = 0.95
PERCENTILE = 0.01
# A percentile of the noise floor is trusted from this many differing pairs (or this many
# pairs in all, when a pool almost never differs from itself); before, the ceilings apply.
MIN_DIFFERING = 100
MIN_PAIRS = 2000

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """The similarities below which a pair departs, from the noise floor's pairs."""

    meaning: float = SAME_MEANING
    words: float = SAME_WORDS
    noise_pairs: int = 0

    def describe(self) -> str:
        """Say what the tolerance is in words, for a verdict's detail."""
        source = (
            f"from {self.noise_pairs} noise-floor pairs"
            if self.noise_pairs
            else "the default (too few noise-floor pairs to measure one)"
        )
        return (
            f"semantic similarity below {self.meaning:.3f}, or without embeddings ROUGE-L below"
            f" {self.words:.3f} and no near tie; {source}"
        )


def tolerance(noise: Iterable[Row]) -> Tolerance:
    """Return the tolerance the noise floor's compared pairs allow."""
    rows = list(noise)
    meaning = [
        value for r in rows if not r.get("exact_match") and (value := _meaning(r)) is not None
    ]
    words = [
        r["similarity"]
        for r in rows
        if not r.get("exact_match") and r.get("similarity") is not None
    ]
    trusted = len(rows) >= MIN_PAIRS
    return Tolerance(
        meaning=_floor(meaning, SAME_MEANING, trusted),
        words=_floor(words, SAME_WORDS, trusted),
        noise_pairs=len(rows) if trusted or len(meaning) >= MIN_DIFFERING else 0,
    )


def departs(row: Row, tol: Tolerance) -> bool:
    """Say whether one compared pair disagrees in meaning beyond what the noise floor allows."""
    if row.get("exact_match"):
        return False
    if _fields_differ(row.get("json_diff")):
        return True
    meaning = _meaning(row)
    if meaning is not None:
        return meaning < tol.meaning
    if row.get("near_tie"):
        return False
    similarity = row.get("similarity")
    return similarity is not None and similarity < tol.words


def compared(row: Row) -> bool:
    """Say whether a row is a pair whose answers were compared (no error, some measure)."""
    return row.get("candidate_error") is None and (
        row.get("exact_match") is not None or row.get("embedding_cosine") is not None
    )


def words_at_risk(exact_match: bool | None, first_divergence: int | None, words: int) -> int:
    """Return the words of a pair at risk of departing: up to and including the first that
    differs, or all `words` of the reference's answer when the answers match."""
    if exact_match or first_divergence is None:
        return words
    return min(first_divergence + 1, max(words, 1))


def at_risk(row: Row) -> int | None:
    """Return the words a compared pair put at risk of departing; None for a text pair stored
    before the primary's length in words was measured, whose matching answers cannot say."""
    if row.get("exact_match") is None:
        return 1  # an embedding answer: one vector to depart on
    words = row.get("reference_words")
    if words is None:
        return None
    return words_at_risk(row["exact_match"], row.get("first_divergence"), words)


def _meaning(row: Row) -> float | None:
    value = row.get("semantic_similarity")
    return value if value is not None else row.get("embedding_cosine")


def _fields_differ(json_diff: Any) -> bool:
    if not json_diff:
        return False
    diff = json.loads(json_diff) if isinstance(json_diff, str) else json_diff
    return any(diff.get(kind) for kind in ("missing", "extra", "changed"))


def _floor(values: list[float], ceiling: float, trusted: bool) -> float:
    if not values or (len(values) < MIN_DIFFERING and not trusted):
        return ceiling
    values.sort()
    at = values[min(len(values) - 1, math.floor(PERCENTILE * len(values)))]
    return min(at, ceiling)
