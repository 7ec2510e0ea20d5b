"""Measures: how two OpenAI answers differ. Pure: no I/O, no clock.

Answers are read first (gateway/compare/answers.py). Comparators then measure a pair of
answers; each is a function registered by name, so a route's policy picks the measures it
wants and a new one plugs in with `@comparator("name")`:

| name               | measures                                                        |
| ------------------ | --------------------------------------------------------------- |
| `exact`            | `exact_match`: the two texts are identical                      |
| `normalized`       | `normalized_match`: equal after case, punctuation, whitespace   |
| `rouge_l`          | `similarity`: ROUGE-L F1 over word tokens (0..1)                |
| `edit_ratio`       | `similarity`: 1 - token edit distance / longer length (0..1)    |
| `first_divergence` | `first_divergence`: index of the first word token that differs  |
| `length_ratio`     | `length_ratio`: candidate tokens / primary tokens               |
| `structure`        | `json_diff`: paths missing, extra, changed in JSON or tool calls |
| `embedding_cosine` | `embedding_cosine`: mean cosine similarity of the vectors       |

Tokens here are words and punctuation marks (`\\w+|[^\\w\\s]`): no model tokenizer is
needed, and the same split is used for both answers. ROUGE-L and the edit distance use
bit-parallel algorithms (Allison-Dix/Hyyrö, Myers), so long answers cost microseconds per
token rather than a quadratic table.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from gateway.compare.answers import Answer, ToolCall

WORD = re.compile(r"\w+|[^\w\s]")
MAX_DIFF_PATHS = 50


@dataclass(slots=True)
class Diff:
    """The measures of one pair of answers; None where a measure did not apply."""

    exact_match: bool | None = None
    normalized_match: bool | None = None
    similarity: float | None = None
    similarity_method: str | None = None
    first_divergence: int | None = None
    length_ratio: float | None = None
    json_diff: dict[str, Any] | None = None
    embedding_cosine: float | None = None
    measures: dict[str, Any] = field(default_factory=dict)


Comparator = Callable[[Answer, Answer], Mapping[str, Any]]
COMPARATORS: dict[str, Comparator] = {}
SIMILARITY = ("rouge_l", "edit_ratio")
DEFAULT_COMPARATORS = (
    "exact",
    "normalized",
    "rouge_l",
    "first_divergence",
    "length_ratio",
    "structure",
    "embedding_cosine",
)
_DIFF_FIELDS = frozenset(f.name for f in fields(Diff)) - {"measures"}


def comparator(name: str) -> Callable[[Comparator], Comparator]:
    """Register a comparator under name; its results land in Diff fields or Diff.measures."""

    def register(fn: Comparator) -> Comparator:
        COMPARATORS[name] = fn
        return fn

    return register


def compare(
    primary: Answer,
    candidate: Answer,
    names: Iterable[str] = DEFAULT_COMPARATORS,
    registry: Mapping[str, Comparator] = COMPARATORS,
) -> Diff:
    """Run the named comparators on a pair of answers."""
    diff = Diff()
    for name in names:
        for key, value in registry[name](primary, candidate).items():
            if key in _DIFF_FIELDS:
                setattr(diff, key, value)
            else:
                diff.measures[key] = value
    return diff


# Text measures -----------------------------------------------------------------------------


def tokens(text: str) -> list[str]:
    """Split text into word and punctuation tokens."""
    return WORD.findall(text)


def normalize(text: str) -> str:
    """Fold case, drop punctuation and collapse whitespace."""
    kept = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text.casefold())
    return " ".join(kept.split())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Return the length of the longest common subsequence of two token sequences."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, token in enumerate(a):
        masks[token] = masks.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for token in b:
        u = v & masks.get(token, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Return the Levenshtein distance between two token sequences."""
    if not a:
        return len(b)
    peq: dict[str, int] = {}
    for i, token in enumerate(a):
        peq[token] = peq.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    high = 1 << (len(a) - 1)
    pv, mv, score = full, 0, len(a)
    for token in b:
        eq = peq.get(token, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & high:
            score += 1
        elif mh & high:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def rouge_l(a: Sequence[str], b: Sequence[str]) -> float:
    """Return the ROUGE-L F1 score of two token sequences (1.0 when both are empty)."""
    if not a and not b:
        return 1.0
    lcs = lcs_length(a, b)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(b), lcs / len(a)
    return 2 * precision * recall / (precision + recall)


def edit_ratio(a: Sequence[str], b: Sequence[str]) -> float:
    """Return 1 - edit distance / length of the longer sequence (1.0 when both are empty)."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else 1.0 - edit_distance(a, b) / longest


def first_divergence(a: Sequence[str], b: Sequence[str]) -> int | None:
    """Return the index of the first token that differs, or None when the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _texts(primary: Answer, candidate: Answer) -> tuple[str, str] | None:
    if primary.text is None or candidate.text is None:
        return None
    return primary.text, candidate.text


@comparator("exact")
def _exact(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    return {} if texts is None else {"exact_match": texts[0] == texts[1]}


@comparator("normalized")
def _normalized(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    return {"normalized_match": normalize(texts[0]) == normalize(texts[1])}


@comparator("rouge_l")
def _rouge_l(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    score = rouge_l(tokens(texts[0]), tokens(texts[1]))
    return {"similarity": round(score, 6), "similarity_method": "rouge_l"}


@comparator("edit_ratio")
def _edit_ratio(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    score = edit_ratio(tokens(texts[0]), tokens(texts[1]))
    return {"similarity": round(score, 6), "similarity_method": "edit_ratio"}


@comparator("first_divergence")
def _first_divergence(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    return {"first_divergence": first_divergence(tokens(texts[0]), tokens(texts[1]))}


@comparator("length_ratio")
def _length_ratio(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    a, b = len(tokens(texts[0])), len(tokens(texts[1]))
    if a == 0:
        return {"length_ratio": 1.0 if b == 0 else None}
    return {"length_ratio": round(b / a, 6)}


# Structure ---------------------------------------------------------------------------------


def structural_diff(primary: Any, candidate: Any) -> dict[str, list[str]]:
    """List the JSON paths the candidate misses, adds, or holds a different value at."""
    found: dict[str, list[str]] = {"missing": [], "extra": [], "changed": []}

    def note(kind: str, path: str) -> None:
        if len(found[kind]) < MAX_DIFF_PATHS:
            found[kind].append(path)

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in a:
                if key in b:
                    walk(a[key], b[key], f"{path}.{key}")
                else:
                    note("missing", f"{path}.{key}")
            for key in b:
                if key not in a:
                    note("extra", f"{path}.{key}")
        elif isinstance(a, list) and isinstance(b, list):
            for i in range(min(len(a), len(b))):
                walk(a[i], b[i], f"{path}[{i}]")
            for i in range(len(b), len(a)):
                note("missing", f"{path}[{i}]")
            for i in range(len(a), len(b)):
                note("extra", f"{path}[{i}]")
        elif (type(a) is not type(b) and not (_number(a) and _number(b))) or a != b:
            # 1 and 1.0 are the same JSON number; True and 1 are not the same value.
            note("changed", path)

    walk(primary, candidate, "$")
    return found


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_NOT_JSON = object()


def _json(text: str) -> Any:
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return _NOT_JSON
    try:
        return orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _calls_document(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    document = []
    for call in calls:
        arguments = _json(call.arguments)
        document.append(
            {
                "name": call.name,
                "arguments": call.arguments if arguments is _NOT_JSON else arguments,
            }
        )
    return document


@comparator("structure")
def _structure(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    if primary.tool_calls or candidate.tool_calls:
        diff = structural_diff(
            _calls_document(primary.tool_calls), _calls_document(candidate.tool_calls)
        )
        return {"json_diff": diff}
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    a, b = _json(texts[0]), _json(texts[1])
    if a is _NOT_JSON and b is _NOT_JSON:
        return {}
    if a is _NOT_JSON or b is _NOT_JSON:
        invalid = "primary" if a is _NOT_JSON else "candidate"
        return {"json_diff": {"missing": [], "extra": [], "changed": ["$"], "invalid": invalid}}
    return {"json_diff": structural_diff(a, b)}


# Embeddings --------------------------------------------------------------------------------


def cosine(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Return the cosine similarity of two vectors; None when one is zero or sizes differ."""
    if len(a) != len(b) or not a:
        return None
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return None if norm == 0 else dot / norm


@comparator("embedding_cosine")
def _embedding_cosine(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    if not primary.embeddings or not candidate.embeddings:
        return {}
    scores = [cosine(a, b) for a, b in zip(primary.embeddings, candidate.embeddings, strict=False)]
    valid = [s for s in scores if s is not None]
    if len(primary.embeddings) != len(candidate.embeddings) or len(valid) != len(scores):
        return {"embedding_cosine": None, "embedding_mismatch": True}
    return {"embedding_cosine": round(math.fsum(valid) / len(valid), 6)}
