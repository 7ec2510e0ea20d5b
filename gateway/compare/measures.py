"""Measures: how two OpenAI answers differ. Pure: no I/O, no clock.

Answers are read first (gateway/compare/answers.py). Comparators then measure a pair of
answers; each is a function registered by name, so a route's policy picks the measures it
wants and a new one plugs in with `@comparator("name")`:

| name               | measures                                                          |
| ------------------ | ----------------------------------------------------------------- |
| `exact`            | `exact_match`: the two texts are identical                        |
| `normalized`       | `normalized_match`: equal after case, punctuation, whitespace     |
| `rouge_l`          | `similarity`: ROUGE-L F1 over word tokens (0..1)                  |
| `edit_ratio`       | `similarity`: 1 - token edit distance / longer length (0..1)      |
| `first_divergence` | `first_divergence`: index of the first word token that differs;   |
|                    | `reference_words`: word tokens in the primary's answer (what a    |
|                    | matching pair puts at risk, gateway/promotion/precision/rates.py) |
| `length_ratio`     | `length_ratio`: candidate tokens / primary tokens                 |
| `structure`        | `json_diff`: paths missing, extra, changed in JSON or tool calls  |
| `embedding_cosine` | `embedding_cosine`: mean cosine similarity of the vectors         |
| `near_tie`         | `token_divergence`: index of the first model token that differs;  |
|                    | `near_tie`: the candidate's token there is one of the primary's   |
|                    | top alternatives (None: no divergence, or no top alternatives)    |
| `kl`               | `kl_divergence`: mean KL(primary || candidate) per model token up |
|                    | to the first that differs, estimated from top-k logprobs (>= 0)   |
| `numbers`          | `new_number`: the candidate states a number the primary does not  |

Tokens here are words and punctuation marks (`\\w+|[^\\w\\s]`): no model tokenizer is
needed, and the same split is used for both answers. ROUGE-L and the edit distance use
bit-parallel algorithms (Allison-Dix/Hyyrö, Myers), so long answers cost microseconds per
token rather than a quadratic table.

`near_tie` and `kl` read the model's own tokens, which an answer carries when its request asked
for `logprobs` (and `top_logprobs` for the alternatives). `near_tie` is the check vLLM's tests
make between two runs of a model (`check_logprobs_close`): where the tokens first differ, a
candidate token the primary itself ranked among its top alternatives is a near tie broken the
other way, not a wrong answer. Shadow copies ask for logprobs; a client's answer has them only
when the client asked. Without them on the primary, `near_tie` looks from the other side: the
candidate's tokens are aligned on the primary's text, and where they leave it, the text going
on with one of the candidate's own top alternatives is the near tie. `kl` needs both.

`numbers` reads the numbers each answer states, by value ("4,000", "4000" and "4000.0" are one
number; a list's ordinal, "2." or "2)" opening a line, numbers the answer's parts and is not
one). A candidate that states a number the primary's answer does not, or more often than it
does (a number changed into one stated elsewhere in the answer), has changed or added a fact,
which an embedding of the two sentences barely sees ("4 kilograms is 4001 grams." embeds at
0.96 or more beside "... 4000 grams." on all-MiniLM-L6-v2); one that leaves a number out
(answering "4000 grams." where the primary restated the question's 4 kilograms) has not.
Numbers written in words, and a sign, are not read.

`kl` estimates KL divergence as llama.cpp's `llama-perplexity --kl-divergence` does (its `Mean
KLD`), but from the top-k logprobs the two answers returned instead of full-vocabulary logits.
It compares each position up to and including the first divergence (after it the two answers
continue different texts) where both sides returned top alternatives:

- a side knows the probabilities of its top alternatives and of its chosen token (alternatives
  with the same text are summed);
- the mass it does not know, 1 - their sum (at least 1e-6), is shared evenly between the
  tokens only the other side listed and one "rest" bucket for every other token; a share is at
  most the side's smallest top probability (a token it did not list is no likelier than the
  last it did) and the rest bucket takes what is left;
- every bucket is at least 1e-6 and each side is scaled to sum to 1, so the estimate is finite
  and never negative, and identical distributions give 0;
- KL(P || Q) = sum of p log(p / q) over the union of the two lists and the rest bucket.

`kl_divergence` is the mean over the positions compared (natural log, nats), None when no
position has top alternatives on both sides. Sources: vllm-project/vllm `tests/models/utils.py`
(`check_logprobs_close`), ggml-org/llama.cpp `tools/perplexity/perplexity.cpp` (KLD).

Tokens are compared by their bytes (gateway/compare/answers.py), so pieces of a UTF-8 character
never match by their shared U+FFFD or empty text. llama.cpp writes a character that its
tokenizer split into several tokens as one entry holding them all, with the alternatives of
the last piece; two answers that agree so far split alike, so positions still line up up to
the first divergence. Where that divergence is such an entry, the pieces before the last are
its context (the bytes before the piece its alternatives are for: found as the alternative the
entry ends with, where what comes before it ends inside a character, as llama.cpp's own check
of incomplete UTF-8 says): `near_tie` asks whether the candidate's entry begins with that
context and one of the alternatives, and `kl` compares the position only when both entries
have the same context. Against a text, a token is found where the text holds its bytes, or them
with U+FFFD for bytes of no character (as llama.cpp's text has them), or what the response
wrote for the token.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

import orjson

from gateway.compare.answers import Answer, TokenChoice, ToolCall

WORD = re.compile(r"\w+|[^\w\s]")
MAX_DIFF_PATHS = 50
EPSILON = 1e-6  # the least probability a KL bucket holds: log(p / q) stays finite


def _described(
    comment: str | None = None,
    *,
    shown: str | None = None,
    rate: bool = False,
    judged: bool = False,
) -> Any:
    """A measure's field: what the table says of it (`comment`); for a measure the summary,
    the report and the console show over many pairs, its label (`shown`) and whether it is
    shown as the share of pairs where it holds (`rate`) or as its mean; and whether the
    departure rule decides by it (`judged`, gateway/promotion/departures.py), which makes it
    the evidence a precision check keeps of each departing pair."""
    metadata: dict[str, Any] = {}
    if comment is not None:
        metadata["comment"] = comment
    if shown is not None:
        metadata["shown"] = Shown(shown, rate)
    if judged:
        metadata["judged"] = True
    return field(default=None, metadata=metadata)


@dataclass(frozen=True, slots=True)
class Shown:
    """How a measure is shown over many pairs."""

    label: str
    rate: bool

    def key(self, name: str) -> str:
        """The figure's name: `exact_match_rate`, `mean_similarity`."""
        return f"{name}_rate" if self.rate else f"mean_{name}"


@dataclass(slots=True)
class Diff:
    """The measures of one pair of answers; None where a measure did not apply.

    The one definition of them: a shadow record stores each as a column of its own (the field's
    metadata is what the table says of it, gateway/db/schema.py), the summary, the console
    and the report list them from here (`SHOWN`), and a precision check keeps of each departing
    pair those the departure rule reads (`JUDGED`).
    """

    exact_match: bool | None = _described(shown="exact match", rate=True, judged=True)
    normalized_match: bool | None = _described(shown="normalized match", rate=True)
    similarity: float | None = _described(shown="similarity", judged=True)
    similarity_method: str | None = field(default=None, metadata={"width": 16})
    first_divergence: int | None = None
    reference_words: int | None = _described("Word tokens in the primary's answer.")
    length_ratio: float | None = None
    json_diff: dict[str, Any] | None = _described(judged=True)  # noqa: RUF009 (None by default)
    embedding_cosine: float | None = _described(judged=True)
    token_divergence: int | None = _described("First token that differs (logprobs).")
    near_tie: bool | None = _described(
        "The candidate's token there is a primary top-k.", shown="near ties", rate=True, judged=True
    )
    kl_divergence: float | None = _described(
        "Mean KL from top-k logprobs, in nats.", shown="KL divergence", judged=True
    )
    new_number: bool | None = _described(
        "The candidate states a number the primary does not.",
        shown="new numbers",
        rate=True,
        judged=True,
    )
    # Needs an embedding model, so the shadow path sets it after the comparators have run.
    semantic_similarity: float | None = _described(
        "Cosine of the answers' embeddings.", shown="semantic similarity", judged=True
    )
    measures: dict[str, Any] = field(default_factory=dict)

    def stored(self) -> dict[str, Any]:
        """The measures as a shadow record's columns hold them: JSON as text, none as None."""
        row = {name: getattr(self, name) for name in MEASURES}
        if self.json_diff is not None:
            row["json_diff"] = orjson.dumps(self.json_diff).decode()
        row["measures"] = orjson.dumps(self.measures).decode() if self.measures else None
        return row


MEASURES = tuple(f.name for f in fields(Diff))
# The measures shown over many pairs, in Diff's order: (name, how it is shown).
SHOWN = tuple((f.name, f.metadata["shown"]) for f in fields(Diff) if "shown" in f.metadata)
# The measures the departure rule decides by, in Diff's order.
JUDGED = tuple(f.name for f in fields(Diff) if f.metadata.get("judged"))
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
    "near_tie",
    "kl",
    "numbers",
)
_DIFF_FIELDS = frozenset(MEASURES) - {"measures"}


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
    primary_words = tokens(texts[0])
    return {
        "first_divergence": first_divergence(primary_words, tokens(texts[1])),
        "reference_words": len(primary_words),
    }


@comparator("length_ratio")
def _length_ratio(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    a, b = len(tokens(texts[0])), len(tokens(texts[1]))
    if a == 0:
        return {"length_ratio": 1.0 if b == 0 else None}
    return {"length_ratio": round(b / a, 6)}


# A number as an answer writes it: digits, with thousands separators or a decimal part; and a
# list's ordinal, which numbers the answer's parts rather than stating a number.
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
ORDINAL = re.compile(r"^[ \t]*\d+[.)](?=\s)", re.MULTILINE)
THOUSANDS = re.compile(r",(?=\d{3}(?!\d))")


def numbers(text: str) -> Counter[str]:
    """Return the numbers a text states and how often, each by its value where it reads as one
    ("4,000" and "4000.0" as "4000"), else as written ("1.2.3", "4,5")."""
    stated: Counter[str] = Counter()
    for match in NUMBER.finditer(ORDINAL.sub(" ", text)):
        written = THOUSANDS.sub("", match.group())
        if written.count(".") <= 1 and "," not in written:
            written = format(Decimal(written).normalize(), "f")
        stated[written] += 1
    return stated


@comparator("numbers")
def _numbers(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    texts = _texts(primary, candidate)
    if texts is None:
        return {}
    # More often counts, not only anew: a number changed into one stated elsewhere.
    return {"new_number": bool(numbers(texts[1]) - numbers(texts[0]))}


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


# Logprobs ----------------------------------------------------------------------------------


def token_divergence(
    primary: Sequence[TokenChoice], candidate: Sequence[TokenChoice]
) -> int | None:
    """Return the index of the first model token whose text differs, None when none does."""
    return first_divergence([c.token for c in primary], [c.token for c in candidate])


def piece(token: str) -> bytes:
    """Return a token's bytes (a piece of a character is kept as a lone surrogate, above)."""
    return token.encode("utf-8", "surrogateescape")


def splits_a_character(data: bytes) -> bool:
    """Say whether bytes end inside a UTF-8 character, by llama.cpp's rule (`validate_utf8` in
    tools/server/server-common.cpp): a lead byte among the last four whose character needs
    more bytes than follow it."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        needs = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        if byte & 0xC0 == 0xC0 and byte & 0xF8 != 0xF8 and back < needs:
            return True
    return False


def context(choice: TokenChoice) -> bytes:
    """Return the bytes of an entry before the piece its alternatives are for: b"" for one
    token, the pieces before the last for a character llama.cpp split (see above)."""
    whole = piece(choice.token)
    for token, _ in choice.top:
        last = piece(token)
        if 0 < len(last) < len(whole) and whole.endswith(last):
            before = whole[: -len(last)]
            if splits_a_character(before):
                return before
    return b""


def near_tie(
    primary: Sequence[TokenChoice], candidate: Sequence[TokenChoice], at: int
) -> bool | None:
    """Whether the candidate's token at `at` is among the primary's top alternatives there.

    None when either answer has no token there or the primary returned no alternatives.
    """
    if at >= len(primary) or at >= len(candidate) or not primary[at].top:
        return None
    chosen = candidate[at].token
    before = context(primary[at])
    if not before:
        return any(token == chosen for token, _ in primary[at].top)
    raw = piece(chosen)
    return any(token and raw.startswith(before + piece(token)) for token, _ in primary[at].top)


def text_near_tie(text: str, candidate: Sequence[TokenChoice]) -> tuple[int | None, bool | None]:
    """Where the candidate's tokens first leave `text` (an answer without logprobs, such as a
    client's that asked none), and whether the text goes on there with one of the candidate's
    top alternatives: the near tie seen from the candidate's side.

    The answer is aligned on its text, so a token that is a prefix of the one the text holds
    (" big" where it says " bigger") counts as the same; (None, None) when the tokens spell it.
    Alignment is on bytes, a token found as its bytes or as the text written for it (above).
    """
    written = piece(text)
    offset = 0
    for at, choice in enumerate(candidate):
        spelled = _spelled(written, offset, choice)
        if spelled is not None:
            offset += spelled
            continue
        if not choice.top:
            return at, None
        rest, before = written[offset:], context(choice)
        return at, any(token and rest.startswith(before + piece(token)) for token, _ in choice.top)
    return (None, None) if offset == len(written) else (len(candidate), None)


def _spelled(written: bytes, offset: int, choice: TokenChoice) -> int | None:
    """Return the bytes of a text a token takes at `offset`: its own bytes, those bytes with
    U+FFFD for each run of no character (as JSON writers replace them: llama.cpp's and
    Python's agree), or the text the response wrote for it; None when the text holds none."""
    raw = piece(choice.token)
    forms = [raw, raw.decode("utf-8", "replace").encode()]
    if choice.shown is not None:
        forms.append(piece(choice.shown))
    for form in forms:
        if written.startswith(form, offset):
            return len(form)
    return None


def _probability(logprob: float) -> float:
    return math.exp(min(logprob, 0.0))


# A reference's position is compared with the candidate's and with the noise floor's: read once.
@functools.lru_cache(maxsize=4096)
def _known(choice: TokenChoice) -> tuple[Mapping[str, float], float]:
    """Return what a position's logprobs say: known probabilities, and the smallest top one."""
    known: dict[str, float] = {}
    for token, logprob in choice.top:
        known[token] = known.get(token, 0.0) + _probability(logprob)
    # Of an entry holding a split character, the logprob is its last piece's.
    chosen = piece(choice.token)[len(context(choice)) :].decode("utf-8", "surrogateescape")
    known.setdefault(chosen, _probability(choice.logprob))
    smallest = min((_probability(logprob) for _, logprob in choice.top), default=1.0)
    return known, smallest


def _buckets(known: Mapping[str, float], smallest: float, support: Sequence[str]) -> list[float]:
    """Return one side's distribution over support and a final rest bucket (see above)."""
    missing = sum(1 for token in support if token not in known)
    unknown = max(1.0 - math.fsum(known.values()), EPSILON)
    share = min(unknown / (missing + 1), smallest)
    buckets = [known.get(token, share) for token in support]
    buckets.append(unknown - share * missing)
    buckets = [max(b, EPSILON) for b in buckets]
    total = math.fsum(buckets)
    return [b / total for b in buckets]


def top_k_kl(primary: TokenChoice, candidate: TokenChoice) -> float:
    """Estimate KL(primary || candidate) at one position from the logprobs both returned."""
    if primary == candidate:  # the same entry: the same distribution (an A/A pair, mostly)
        return 0.0
    known_p, smallest_p = _known(primary)
    known_q, smallest_q = _known(candidate)
    support = [*known_p, *(token for token in known_q if token not in known_p)]
    p = _buckets(known_p, smallest_p, support)
    q = _buckets(known_q, smallest_q, support)
    return max(0.0, math.fsum(a * math.log(a / b) for a, b in zip(p, q, strict=True)))


def mean_top_k_kl(primary: Sequence[TokenChoice], candidate: Sequence[TokenChoice]) -> float | None:
    """Mean top-k KL over positions up to the first divergence with alternatives on both sides
    (the divergence itself only where both entries have the same context, above)."""
    end = min(len(primary), len(candidate))
    at = token_divergence(primary, candidate)
    if at is not None and at < end:
        end = at + 1 if context(primary[at]) == context(candidate[at]) else at
    scores = [
        top_k_kl(p, q)
        for p, q in zip(primary[:end], candidate[:end], strict=True)
        if p.top and q.top
    ]
    return math.fsum(scores) / len(scores) if scores else None


@comparator("near_tie")
def _near_tie(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    if candidate.tokens and not primary.tokens and primary.text is not None:
        if candidate.text == primary.text:
            # The same text: llama.cpp's entries may end before it does (the last tokens of an
            # answer cut inside a character have none), which is no divergence.
            return {"token_divergence": None, "near_tie": None}
        at, tie = text_near_tie(primary.text, candidate.tokens)
        return {"token_divergence": at, "near_tie": tie}
    if not primary.tokens or not candidate.tokens:
        return {}
    at = token_divergence(primary.tokens, candidate.tokens)
    tie = None if at is None else near_tie(primary.tokens, candidate.tokens, at)
    return {"token_divergence": at, "near_tie": tie}


@comparator("kl")
def _kl(primary: Answer, candidate: Answer) -> Mapping[str, Any]:
    if not primary.tokens or not candidate.tokens:
        return {}
    score = mean_top_k_kl(primary.tokens, candidate.tokens)
    return {"kl_divergence": None if score is None else round(score, 6)}
