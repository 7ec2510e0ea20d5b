"""What a device answers: deterministic text, its length, and where a device departs from it.

The reference answer to a prompt is a pure function of (model, prompt): sentences drawn from
simulator/words.py by a generator seeded by their hash, with a heavy-tailed natural length.
A device decodes it through its precision (simulator/precision.py):

- at temperature 0, its logit noise flips near-tie words to their synonyms (benign flips);
- at temperature > 0, each content word is sampled from the noisy logits (same length, same
  sentences: a sampled answer says the same thing in other words, now and then another word);
- with the profile's `harmful_rate`, one content word is another concept (a wrong fact) and the
  rest of its sentence goes on from it, or in a structured answer (JSON mode, tool calls) one
  field's value changes; the answer keeps its shape.

Each answer says which of these it is (`precision`), for the simulator's metrics and for
benchmarks that score decisions; the gateway never sees it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

import orjson

from simulator.precision import Decoded, TokenLogprob, decode, entry
from simulator.tokenizer import split_tokens
from simulator.words import CONTENT_WORDS, FUNCTION_WORDS, WORDS, concept, restyle

_FREE_FIELDS: dict[str, dict[str, Any]] = {
    "answer": {"type": "string"},
    "summary": {"type": "string"},
    "topic": {"type": "string"},
    "reason": {"type": "string"},
    "category": {"type": "string"},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    "count": {"type": "integer", "minimum": 0, "maximum": 50},
    "priority": {"type": "integer", "minimum": 1, "maximum": 5},
    "tags": {"type": "array", "items": {"type": "string"}},
    "valid": {"type": "boolean"},
}
NATURAL_MEDIAN_TOKENS = 100
NATURAL_SIGMA = 0.8
NATURAL_MIN_TOKENS = 20
NATURAL_MAX_TOKENS = 400
FUNCTION_SHARE = 0.4  # of a sentence's words
# What an answer is, against the reference: the labels of sim_answers_total.
EXACT, BENIGN, HARMFUL, SAMPLED = "exact", "benign", "harmful", "sampled"


def stable_seed(*parts: object) -> int:
    """Return a 64-bit seed that depends only on `parts`, the same in every process."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(str(part).encode())
        digest.update(b"\x00")
    return int.from_bytes(digest.digest(), "big")


@dataclass(frozen=True)
class Question:
    """What a request asks for, as far as the content of the answer is concerned.

    `top_logprobs` is None when the request asked for no logprobs, else how many alternatives
    each token lists.
    """

    model: str
    prompt_key: str
    limit: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    response_format: Mapping[str, Any] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: Any = None
    top_logprobs: int | None = None


@dataclass(frozen=True)
class ToolCall:
    """The function a tool-calling answer invokes; its arguments are the answer's text."""

    id: str
    name: str


@dataclass(frozen=True)
class Answer:
    """The tokens a device will decode, in order, and how the answer ends.

    For a tool call the first piece is empty: it stands for the token that opens the call.
    `logprobs` has one entry a piece when the request asked for them (never for tool calls).
    """

    pieces: tuple[str, ...]
    finish_reason: str
    tool_call: ToolCall | None = None
    precision: str = EXACT
    flips: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def completion_tokens(self) -> int:
        """Return the number of tokens the answer costs."""
        return len(self.pieces)

    @property
    def text(self) -> str:
        """Return the answer's text (for a tool call, its JSON arguments)."""
        return "".join(self.pieces)


def compose(
    question: Question, *, noise: float, harmful_rate: float, rng: Random, drift: float = 0.0
) -> Answer:
    """Compose the answer a device with `noise`, `drift` and `harmful_rate` gives to `question`.

    `rng` is the device process's generator: it draws the numeric noise, whether this answer
    has a harmful error, and the sampling when the request gives no seed.
    """
    harm = Random(rng.getrandbits(64)) if harmful_rate > 0 and rng.random() < harmful_rate else None
    sampler = _sampler(question, rng)
    tool = _chosen_tool(question)
    if tool is not None:
        name = str(tool.get("name", "tool"))
        arguments = _structured(tool.get("parameters"), question, sampler, harm)
        pieces, truncated = _cut(["", *split_tokens(arguments)], question.limit)
        return Answer(
            pieces=pieces,
            finish_reason="length" if truncated else "tool_calls",
            tool_call=ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name),
            precision=_label(question, harm, 0),
        )
    schema = _json_schema(question.response_format)
    if schema is not None:
        text = _structured(schema, question, sampler, harm)
        pieces, truncated = _cut(split_tokens(text), question.limit)
        decoded = _decode(question, pieces, noise, drift, rng, None, structured=True)
        return Answer(
            pieces,
            "length" if truncated else "stop",
            precision=_label(question, harm, 0),
            logprobs=decoded.logprobs,
        )
    return _prose_answer(question, noise, drift, rng, sampler, harm)


def _label(question: Question, harm: Random | None, flips: int) -> str:
    if harm is not None:
        return HARMFUL
    if question.temperature > 0:
        return SAMPLED
    return BENIGN if flips else EXACT


def _decode(
    question: Question,
    pieces: Sequence[str],
    noise: float,
    drift: float,
    rng: Random,
    sampler: Random | None,
    *,
    structured: bool,
) -> Decoded:
    """Decode the reference's pieces on a device, with this prompt's margins."""
    return decode(
        pieces,
        Random(stable_seed("margins", question.model, question.prompt_key)),
        structured=structured,
        noise=noise,
        noise_rng=rng,
        sampler=sampler,
        temperature=question.temperature,
        top=question.top_logprobs,
        drift=drift,
    )


def _sampler(question: Question, rng: Random) -> Random | None:
    if question.temperature <= 0:
        return None
    if question.seed is not None:
        return Random(stable_seed("sample", question.model, question.prompt_key, question.seed))
    return Random(rng.getrandbits(64))


def _prose_answer(
    question: Question,
    noise: float,
    drift: float,
    rng: Random,
    sampler: Random | None,
    harm: Random | None,
) -> Answer:
    reference = Random(stable_seed("text", question.model, question.prompt_key))
    natural = _natural_length(reference)
    target = math.inf if question.ignore_eos else max(natural, question.min_tokens)
    length = int(min(target, question.limit))
    prose = _prose(reference, length, opening=True)
    decoded = _decode(question, prose, noise, drift, rng, sampler, structured=False)
    pieces, logprobs = list(decoded.pieces), decoded.logprobs
    if harm is not None:
        changed = _wrong_fact(pieces, harm)
        if logprobs is not None:
            entries = list(logprobs)
            for index in changed:
                top = question.top_logprobs or 0
                entries[index] = entry(pieces[index], harm.getrandbits(32), top, decoded.lift)
            logprobs = tuple(entries)
    return Answer(
        pieces=tuple(pieces),
        finish_reason="length" if target > question.limit else "stop",
        precision=_label(question, harm, decoded.flips),
        flips=decoded.flips,
        logprobs=logprobs,
    )


def _wrong_fact(pieces: list[str], harm: Random) -> list[int]:
    """Put a wrong fact in one sentence: a content word of another concept, and the rest of the
    sentence going on from it, as the real fleet's wrong answers do. Return where."""
    sentences: list[list[int]] = [[]]
    for index, piece in enumerate(pieces):
        if concept(piece.strip()) is not None:
            sentences[-1].append(index)
        if piece == ".":
            sentences.append([])
    sentences = [words for words in sentences if words]
    if not sentences:
        return []
    sentence = sentences[int(harm.random() * len(sentences))]
    chosen = sentence[int(harm.random() * len(sentence)) :]
    old = concept(pieces[chosen[0]].strip())
    word = CONTENT_WORDS[int(harm.random() * len(CONTENT_WORDS))]
    while concept(word) == old:
        word = CONTENT_WORDS[int(harm.random() * len(CONTENT_WORDS))]
    pieces[chosen[0]] = restyle(pieces[chosen[0]], word)
    for index in chosen[1:]:
        pieces[index] = restyle(
            pieces[index], CONTENT_WORDS[int(harm.random() * len(CONTENT_WORDS))]
        )
    return chosen


def _natural_length(rng: Random) -> int:
    length = round(math.exp(rng.gauss(math.log(NATURAL_MEDIAN_TOKENS), NATURAL_SIGMA)))
    return max(NATURAL_MIN_TOKENS, min(NATURAL_MAX_TOKENS, length))


def _prose(rng: Random, count: int, *, opening: bool) -> list[str]:
    """Draw `count` tokens of sentences; `opening` means no space before the first word."""
    pieces: list[str] = []
    left = 0
    while len(pieces) < count:
        words = FUNCTION_WORDS if rng.random() < FUNCTION_SHARE else CONTENT_WORDS
        word = words[int(rng.random() * len(words))]
        if left == 0:
            left = 5 + int(rng.random() * 12)
            word = word.capitalize()
        pieces.append(word if opening and not pieces else " " + word)
        left -= 1
        if left == 0:
            pieces.append(".")
        elif rng.random() < 0.08:
            pieces.append(",")
    del pieces[count:]
    return pieces


def _cut(pieces: list[str], limit: int) -> tuple[tuple[str, ...], bool]:
    return tuple(pieces[:limit]), len(pieces) > limit


def _chosen_tool(question: Question) -> Mapping[str, Any] | None:
    """Return the function the answer calls, or None for a plain answer."""
    if not question.tools or question.tool_choice == "none":
        return None
    functions = [tool.get("function", {}) for tool in question.tools]
    choice = question.tool_choice
    if isinstance(choice, Mapping):
        wanted = choice.get("function", {}).get("name")
        for function in functions:
            if function.get("name") == wanted:
                return function
    index = stable_seed("tool", question.model, question.prompt_key) % len(functions)
    return functions[index]


def _json_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Return the schema a JSON answer follows ({} for free JSON), or None for prose."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {}
    if kind == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema")
        return schema if isinstance(schema, Mapping) else {}
    return None


def _structured(
    schema: Any,
    question: Question,
    sampler: Random | None,
    harm: Random | None,
) -> str:
    """Return a JSON object (as text) that fits `schema`; a harmful error alters one field."""
    rng = sampler or Random(stable_seed("json", question.model, question.prompt_key))
    if isinstance(schema, Mapping) and schema.get("properties"):
        value = _value(schema, rng, depth=0)
    else:
        value = _free_object(rng)
    if harm is not None and isinstance(value, dict) and value:
        key = sorted(value)[int(harm.random() * len(value))]
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        field_schema = (properties or _FREE_FIELDS).get(key)
        value[key] = _different_value(value[key], field_schema, harm)
    return orjson.dumps(value).decode()


def _free_object(rng: Random) -> dict[str, Any]:
    names = sorted(rng.sample(sorted(_FREE_FIELDS), 3 + int(rng.random() * 3)))
    return {name: _value(_FREE_FIELDS[name], rng, depth=1) for name in names}


def _different_value(old: Any, schema: Any, rng: Random) -> Any:
    if isinstance(old, bool):
        return not old
    for _ in range(8):
        new = _value(schema, rng, depth=1) if schema is not None else _like(old, rng)
        if new != old:
            return new
    return _like(old, rng) if not isinstance(old, str) else old + " " + WORDS[0]


def _like(old: Any, rng: Random) -> Any:
    if isinstance(old, int):
        return old + 1 + int(rng.random() * 9)
    if isinstance(old, float):
        return round(old + 0.01 + rng.random(), 2)
    if isinstance(old, list):
        return [*old, _phrase(rng)]
    return _phrase(rng)


def _value(schema: Any, rng: Random, depth: int) -> Any:
    """Draw a value that validates against a (simple) JSON schema."""
    if not isinstance(schema, Mapping):
        return _phrase(rng)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        options = schema["enum"]
        return options[int(rng.random() * len(options))]
    for combinator in ("anyOf", "oneOf", "allOf"):
        if schema.get(combinator):
            return _value(schema[combinator][0], rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((option for option in kind if option != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        if depth >= 4:
            return {}
        properties = schema.get("properties", {})
        return {name: _value(sub, rng, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        low = int(schema.get("minItems", 1))
        high = max(low, int(schema.get("maxItems", 3)))
        count = low + int(rng.random() * (high - low + 1))
        return [_value(schema.get("items", {}), rng, depth + 1) for _ in range(count)]
    if kind == "integer":
        low = int(schema.get("minimum", 0))
        high = max(low, int(schema.get("maximum", 100)))
        return low + int(rng.random() * (high - low + 1))
    if kind == "number":
        bottom = float(schema.get("minimum", 0.0))
        top = max(bottom, float(schema.get("maximum", 100.0)))
        return round(bottom + rng.random() * (top - bottom), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _phrase(rng)


def _phrase(rng: Random) -> str:
    return " ".join(WORDS[int(rng.random() * len(WORDS))] for _ in range(1 + int(rng.random() * 3)))
