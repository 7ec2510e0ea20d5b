"""What a device answers: deterministic text, its length, and where a device departs from it.

The reference answer to a prompt is a pure function of (model, prompt): a stream of prose
tokens drawn from a generator seeded by their hash, with a heavy-tailed natural length.
Every reference-precision device therefore says the same thing at temperature 0.

- Temperature > 0 keeps a geometric-length prefix of the reference answer, then continues
  from a sampled stream (seeded by the request's `seed` when it gives one).
- A low-precision device deviates on a fraction of requests (the profile's deviation
  rate): from a uniformly drawn token on, its text follows a different stream, as a device
  whose accumulated numeric error flips one argmax would. Structured answers (JSON mode,
  tool calls) keep their shape; one field's value changes.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

import orjson

from simulator.tokenizer import split_tokens

_VOCABULARY = """
    the of and to in is that for it as with was on be by this are or from at an which can has
    have not but its more other one all also new may these some such than used time most then
    each where two first make data model system value energy power memory device signal result
    method number large small high low state order point level form change cost rate load token
    answer reason simple fast slow test case step set use work show find give keep run read
    write send serve route queue batch cache layer weight vector matrix input output source
    target path node link graph table field record event clock cycle phase stage block chip card
    array cell charge noise error range scale limit bound peak mean sum share part whole group
    class kind type name term word line page book story idea plan goal need want help good great
    clear early late long short near far open close light heavy warm cold city river market
    price trade paper study review report policy rule law right left north south water air earth
    fire stone tree plant animal people person family friend home school office room door road
    car train
"""
WORDS = tuple(_VOCABULARY.split())
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
# Chance per token, per unit of temperature, that sampling leaves the greedy path.
DEPARTURE_PER_TOKEN = 0.1


def stable_seed(*parts: object) -> int:
    """Return a 64-bit seed that depends only on `parts`, the same in every process."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(str(part).encode())
        digest.update(b"\x00")
    return int.from_bytes(digest.digest(), "big")


@dataclass(frozen=True)
class Question:
    """What a request asks for, as far as the content of the answer is concerned."""

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


@dataclass(frozen=True)
class ToolCall:
    """The function a tool-calling answer invokes; its arguments are the answer's text."""

    id: str
    name: str


@dataclass(frozen=True)
class Answer:
    """The tokens a device will decode, in order, and how the answer ends.

    For a tool call the first piece is empty: it stands for the token that opens the call.
    """

    pieces: tuple[str, ...]
    finish_reason: str
    tool_call: ToolCall | None = None
    deviated: bool = False

    @property
    def completion_tokens(self) -> int:
        """Return the number of tokens the answer costs."""
        return len(self.pieces)

    @property
    def text(self) -> str:
        """Return the answer's text (for a tool call, its JSON arguments)."""
        return "".join(self.pieces)


def compose(question: Question, *, deviation_rate: float, rng: Random) -> Answer:
    """Compose the answer a device gives to `question`.

    `rng` is the device process's generator: it decides whether this answer deviates and
    seeds sampling when the request gives no seed.
    """
    deviates = deviation_rate > 0 and rng.random() < deviation_rate
    divergence = _Divergence(at=rng.random(), seed=rng.getrandbits(64)) if deviates else None
    sampler = _sampler(question, rng)
    tool = _chosen_tool(question)
    if tool is not None:
        name = str(tool.get("name", "tool"))
        arguments = _structured(tool.get("parameters"), question, sampler, divergence)
        pieces, truncated = _cut(["", *split_tokens(arguments)], question.limit)
        return Answer(
            pieces=pieces,
            finish_reason="length" if truncated else "tool_calls",
            tool_call=ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name),
            deviated=deviates,
        )
    schema = _json_schema(question.response_format)
    if schema is not None:
        text = _structured(schema, question, sampler, divergence)
        pieces, truncated = _cut(split_tokens(text), question.limit)
        return Answer(pieces, "length" if truncated else "stop", deviated=deviates)
    return _prose_answer(question, sampler, divergence)


@dataclass(frozen=True)
class _Divergence:
    at: float
    seed: int


def _sampler(question: Question, rng: Random) -> Random | None:
    if question.temperature <= 0:
        return None
    if question.seed is not None:
        return Random(stable_seed("sample", question.model, question.prompt_key, question.seed))
    return Random(rng.getrandbits(64))


def _prose_answer(
    question: Question, sampler: Random | None, divergence: _Divergence | None
) -> Answer:
    reference = Random(stable_seed("text", question.model, question.prompt_key))
    natural = _natural_length(reference)
    if sampler is not None:
        kept = _departure(sampler, question.temperature)
        natural = _natural_length(sampler)
    target = math.inf if question.ignore_eos else max(natural, question.min_tokens)
    length = int(min(target, question.limit))
    pieces = _prose(reference, length, opening=True)
    if sampler is not None and kept < length:
        pieces[kept:] = _prose(sampler, length - kept, opening=kept == 0)
    if divergence is not None:
        at = int(divergence.at * length)
        tail = _prose(Random(divergence.seed), length - at, opening=at == 0)
        if tail[0] == pieces[at]:
            tail[0] = _other_word(tail[0])
        pieces[at:] = tail
    return Answer(
        pieces=tuple(pieces),
        finish_reason="length" if target > question.limit else "stop",
        deviated=divergence is not None,
    )


def _natural_length(rng: Random) -> int:
    length = round(math.exp(rng.gauss(math.log(NATURAL_MEDIAN_TOKENS), NATURAL_SIGMA)))
    return max(NATURAL_MIN_TOKENS, min(NATURAL_MAX_TOKENS, length))


def _departure(sampler: Random, temperature: float) -> int:
    chance = min(1.0, DEPARTURE_PER_TOKEN * temperature)
    if chance >= 1.0:
        return 0
    # log1p keeps a tiny chance (temperature 1e-50) from rounding to log(1) = 0.
    return int(min(math.log(1.0 - sampler.random()) / math.log1p(-chance), sys.maxsize))


def _prose(rng: Random, count: int, *, opening: bool) -> list[str]:
    """Draw `count` tokens of sentences; `opening` means no space before the first word."""
    pieces: list[str] = []
    left = 0
    while len(pieces) < count:
        word = WORDS[int(rng.random() * len(WORDS))]
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


def _other_word(piece: str) -> str:
    word = piece.strip().lower()
    index = WORDS.index(word) if word in WORDS else 0
    replacement = WORDS[(index + 1) % len(WORDS)]
    return piece.replace(piece.strip(), replacement) if piece.strip() else replacement


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
    divergence: _Divergence | None,
) -> str:
    """Return a JSON object (as text) that fits `schema`; a deviating device alters one field."""
    rng = sampler or Random(stable_seed("json", question.model, question.prompt_key))
    if isinstance(schema, Mapping) and schema.get("properties"):
        value = _value(schema, rng, depth=0)
    else:
        value = _free_object(rng)
    if divergence is not None and isinstance(value, dict) and value:
        drift = Random(divergence.seed)
        key = sorted(value)[int(drift.random() * len(value))]
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        field_schema = (properties or _FREE_FIELDS).get(key)
        value[key] = _different_value(value[key], field_schema, drift)
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
