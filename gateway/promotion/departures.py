"""Departures: which compared pairs disagree in meaning, measured against the noise floor.

Exact match cannot judge low-precision hardware: an int8 part flips near-tie tokens on most long
answers and means the same thing, and two runs of a bf16 GPU differ too. A pair *departs* when
its answers differ by more than a paraphrase does, or than the route's own noise floor lets two
answers of one pool differ:

- a copy that failed (gateway/compare/failures.py: an error, a timeout, a broken stream, a
  null, empty or cut-short answer) departs: it is an answer the client would have seen; a pair
  whose primary's answer failed is the primary's failure, and is left out of quality;
- a copy that the failure rules call cut short (stopped at `max_tokens`, or with under half
  the words, where the reference's answer finished) after a benign divergence (`cut_after_tie`:
  it left the reference at a near tie reached alike, below) departs: the answer is the part's
  own from the tie, and its length cannot say whether it was cut, so it is not forgiven; the
  precision check counts it here, in the departure rate and its limit, rather than as a failed
  request, which a check allows none of (docs/promotion.md, "Cut short after a benign flip");
- pairs that match exactly never depart;
- a structured answer (JSON, tool calls) departs when a field differs;
- a **benign divergence** never departs, whatever follows it (`benign`): the first differing
  token was a near tie (the candidate's token among the primary's top logprobs there) and the
  two distributions agreed up to it (`kl_divergence`, KL(primary || candidate) per token up to
  the first difference, at most `NEAR_TIE_KL`). A tie broken the other way by a part that
  otherwise reads the model as the primary does is lower precision, not harm; once the answers
  differ they go their own ways, so the later similarity says nothing of the part. A near tie
  reached through distributions that had already moved (analog noise) is not benign, and is
  judged by what follows as any other difference is; so is a near tie whose KL was not
  measured (the primary's answer carried no logprobs);
- a pair whose candidate states a number the primary's answer does not (`new_number`,
  gateway/compare/measures.py) departs: a changed quantity is a changed fact, however alike the
  two sentences read to an embedding model or in words;
- where the answers' semantic similarity was measured (the fleet's embedding route), a pair
  departs when it falls below the meaning tolerance. It starts at the similarity the embedding
  model gives paraphrases of an answer (`paraphrase_similarity`, declared with the model in the
  policy), or at `SAME_MEANING` for a model that declares none;
- embedding answers are one vector each: the same rule on their cosine, from `SAME_VECTOR`;
- otherwise the words decide: a near tie whose KL was not measured does not depart (words
  cannot tell a flip from a changed fact, and without KL nothing says the tie was not benign),
  else a pair whose word similarity (ROUGE-L) falls below the word tolerance, from
  `SAME_WORDS`, does.

The noise floor moves a tolerance from its start once it has `MIN_PAIRS` compared pairs,
`MIN_DIFFERING` of them differing. A start no one declared (`SAME_MEANING` where the model has
no paraphrase figure, `SAME_WORDS`) it loosens to the 1st percentile of all its compared pairs,
an exact match counting as 1: one floor pair in a hundred must fall below a similarity for the
tolerance to loosen to it, so a handful of odd pairs among thousands (or the same few drawn
again and again) cannot. A declared start (the paraphrase similarity, and `SAME_VECTOR`, the
cosine two parts' embeddings of one input keep) it only tightens, to the 1st percentile of its
differing pairs where that is higher, up to `SAME_MEANING`. Sampled traffic has a floor of its
own, whose samples differ by design: their many differing pairs loosen its tolerances.

The one rule for every place pairs are counted: the judge's quality checks
(gateway/promotion/evidence.py), the rollout's agreement guard (gateway/promotion/rollout.py)
and the precision check, whose pass opens the go-live gate (gateway/promotion/precision/).

A pair departs at most once, and its words at risk say how often it could have: the reference's
words up to and including the first that differs, all of them when none does. Departures per word
at risk are what a precision check (gateway/promotion/precision/rates.py) and the judge's quality
check count. An embedding answer is one vector, so one at risk; so is a copy that failed with
no answer to compare.

Pure: rows in, counts out. Rows carry a shadow record's measures (gateway/shadow/records.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Where the tolerances start and how far a floor may tighten them. SAME_MEANING is the start for
# an embedding model that declares no paraphrase similarity (strict: its benign rewordings may
# count as departures) and the most a floor tightens any to: an answer and its near-tie flip
# embed at 0.98 or above. Two embeddings of one input by two parts keep a cosine of 0.98;
# ROUGE-L keeps 0.95 through a few changed words in a hundred.
SAME_MEANING = 0.98
SAME_VECTOR = 0.98
SAME_WORDS = 0.95
# The most KL(primary || candidate) per token, up to a near tie, that a benign flip shows. Fitted
# on the real fleet's shipped suites (bench/near_tie.py, docs/results/near-tie-fit.json): Q8_0's
# flips reach at most 0.0028, a wrong answer parting at a near tie at least 0.022 (analog parts);
# their geometric middle, 0.0078, rounded. Held to other prompts and parts in docs/precision.md.
NEAR_TIE_KL = 0.008
PERCENTILE = 0.01
# A noise floor moves a tolerance from its start once it has this many compared pairs, and this
# many of them differing on the tolerance's similarity; before, the starts apply.
MIN_PAIRS = 2000
MIN_DIFFERING = 100

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """The similarities below which a pair departs, from where they start and the noise floor."""

    meaning: float = SAME_MEANING
    words: float = SAME_WORDS
    noise_pairs: int = 0
    vectors: float = SAME_VECTOR

    def describe(self) -> str:
        """Say what the tolerance is in words, for a verdict's detail."""
        source = (
            f"from {self.noise_pairs} noise-floor pairs"
            if self.noise_pairs
            else (
                f"the starts (a noise floor moves them from {MIN_PAIRS:,} pairs,"
                f" {MIN_DIFFERING} of them differing)"
            )
        )
        return (
            f"semantic similarity below {self.meaning:.3f}, or without embeddings ROUGE-L below"
            f" {self.words:.3f}, unless the first difference is a near tie at KL at most"
            f" {NEAR_TIE_KL:g}; {source}"
        )


def tolerance(noise: Iterable[Row], paraphrase: float | None = None) -> Tolerance:
    """Return the tolerance the noise floor's compared pairs allow. With the embedding model's
    `paraphrase` similarity the meaning tolerance starts there and the floor may only tighten
    it; without, it starts at `SAME_MEANING` and the floor may loosen it, as it may the word
    tolerance, but only to the 1st percentile of all its pairs (an exact match counting as 1)."""
    rows = [r for r in noise if not r.get("failure") and not r.get("primary_failure")]
    differing = [r for r in rows if not r.get("exact_match")]
    meaning = Counter(v for r in differing if (v := r.get("semantic_similarity")) is not None)
    vectors = Counter(
        v
        for r in differing
        if r.get("semantic_similarity") is None and (v := r.get("embedding_cosine")) is not None
    )
    words = Counter(r["similarity"] for r in differing if r.get("similarity") is not None)
    return tolerance_of(len(rows), meaning, vectors, words, paraphrase)


def tolerance_of(
    pairs: int,
    meaning: Mapping[float, int],
    vectors: Mapping[float, int],
    words: Mapping[float, int],
    paraphrase: float | None = None,
) -> Tolerance:
    """Return the tolerance of a noise floor given as counts (`tolerance`): its pairs that did
    not fail, and how many of its differing pairs have each semantic similarity, embeddings'
    cosine (where no semantic similarity was measured) and word similarity. What the shadow
    minutes keep of a floor (gateway/promotion/tally.py), read without a row per pair."""
    return Tolerance(
        meaning=(
            _loosened(meaning, pairs, SAME_MEANING)
            if paraphrase is None
            else _tightened(meaning, pairs, paraphrase, max(paraphrase, SAME_MEANING))
        ),
        words=_loosened(words, pairs, SAME_WORDS),
        noise_pairs=pairs if any(_moves(v, pairs) for v in (meaning, vectors, words)) else 0,
        vectors=_tightened(vectors, pairs, SAME_VECTOR, SAME_VECTOR),
    )


def departs(row: Row, tol: Tolerance) -> bool:
    """Say whether one pair disagrees in meaning beyond what the noise floor allows (a copy
    that failed always does)."""
    verdict = decided(row)
    if verdict is not None:
        return verdict
    name, value = deciding(row)
    return value < {"semantic_similarity": tol.meaning, "embedding_cosine": tol.vectors}.get(
        name, tol.words
    )


def benign(row: Row) -> bool:
    """Say whether a pair's answers part at a near tie the two distributions reached alike:
    its first differing token among the primary's top logprobs, at most `NEAR_TIE_KL` per token
    up to it."""
    kl = row.get("kl_divergence")
    return bool(row.get("near_tie")) and kl is not None and kl <= NEAR_TIE_KL


def compared(row: Row) -> bool:
    """Say whether a row is a pair whose answers were compared (no error, some measure)."""
    return row.get("candidate_error") is None and (
        row.get("exact_match") is not None or row.get("embedding_cosine") is not None
    )


def judged(row: Row) -> bool:
    """Say whether a pair counts toward quality: its answers were compared or the copy failed,
    and the primary's answer did not fail."""
    if row.get("primary_failure"):
        return False
    return bool(row.get("failure")) or compared(row)


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
        return 1  # an embedding answer, or a failed copy with no text: one to depart on
    words = row.get("reference_words")
    if words is None:
        return None
    return words_at_risk(row["exact_match"], row.get("first_divergence"), words)


def _fields_differ(json_diff: Any) -> bool:
    if not json_diff:
        return False
    diff = json.loads(json_diff) if isinstance(json_diff, str) else json_diff
    return any(diff.get(kind) for kind in ("missing", "extra", "changed"))


def _n(values: Mapping[float, int]) -> int:
    return sum(values.values())


def _moves(values: Mapping[float, int], pairs: int) -> bool:
    """Say whether a floor of `pairs` compared pairs, `values` the similarities of those that
    differ, is large enough to move a tolerance from its start."""
    return pairs >= MIN_PAIRS and _n(values) >= MIN_DIFFERING


def _loosened(values: Mapping[float, int], pairs: int, start: float) -> float:
    """Return the floor's 1st percentile over all its `pairs` where it is below the start, a
    pair without a similarity in `values` (an exact match) at 1: one pair in a hundred of the
    floor must fall below a similarity for the tolerance to loosen to it."""
    if not _moves(values, pairs):
        return start
    return min(_percentile(values, pairs), start)


def _tightened(values: Mapping[float, int], pairs: int, start: float, ceiling: float) -> float:
    """Return the 1st percentile of the floor's differing pairs between the start and the
    ceiling: a floor may tighten a declared tolerance, never loosen it, and never past what two
    answers of like meaning keep."""
    if not _moves(values, pairs):
        return start
    return min(max(start, _percentile(values)), ceiling)


def _percentile(values: Mapping[float, int], pairs: int = 0) -> float:
    """Return the 1st percentile (the lower one) of values given with their counts, among
    `pairs` in all where more are given, the rest at 1."""
    n = max(pairs, _n(values))
    rank = min(n - 1, math.floor(PERCENTILE * n))
    seen = 0
    for value in sorted(values):
        seen += values[value]
        if seen > rank:
            return value
    if n > seen:
        return 1.0
    raise ValueError("no values")


def decided(row: Row) -> bool | None:
    """Say whether a pair departs whatever the tolerance (True or False); None when its
    similarity against the tolerance decides (`deciding`; the shadow minutes keep such a pair
    by that similarity alone: gateway/promotion/tally.py)."""
    if row.get("failure") or row.get("cut_after_tie"):
        return True
    if row.get("exact_match"):
        return False
    if _fields_differ(row.get("json_diff")):
        return True
    if benign(row):
        return False
    if row.get("new_number"):
        return True
    if row.get("semantic_similarity") is not None or row.get("embedding_cosine") is not None:
        return None
    if row.get("near_tie") and row.get("kl_divergence") is None:
        return False  # words alone: a near tie whose distributions were not read is forgiven
    return None if row.get("similarity") is not None else False


def deciding(row: Row) -> tuple[str, float]:
    """Return the similarity a pair that `decided` leaves open is judged on, and its value."""
    for name in ("semantic_similarity", "embedding_cosine", "similarity"):
        if (value := row.get(name)) is not None:
            return name, float(value)
    raise ValueError(f"a pair with no similarity is decided without a tolerance: {row}")
