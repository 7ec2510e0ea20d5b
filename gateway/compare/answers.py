"""Answers: what an OpenAI response said, read from a whole JSON body or a stream's bytes.

An answer is its text (or, for tool calls, the calls written out as text), its tool calls, its
embedding vectors, its usage and, when the request asked for logprobs, the tokens the model chose
with their logprobs and top alternatives: what comparing two answers needs. Reading is lenient: a
body that is not an OpenAI response reads as an empty answer marked unreadable (`readable`)
rather than an error, and a logprob entry without a token string and a finite logprob is
skipped.

Logprobs are read from chat responses (`choices[0].logprobs.content[*]`: `token`, `logprob`,
`top_logprobs[*].token/.logprob`; in a stream each chunk's list follows the last, the choice of
index 0 alone when the request asked for several) and from legacy completions
(`choices[0].logprobs`: `tokens`, `token_logprobs`, `top_logprobs` as one token -> logprob
object a position).

A token is known by its `bytes` where the entry gives them (OpenAI, vLLM and llama.cpp do), not
by its text: a token that is part of a UTF-8 character has no text of its own, and engines
write it as U+FFFD or as nothing (llama.cpp cuts a lead byte off a top alternative's text), so
two different pieces would read alike. Its bytes are kept as a str decoded with
`surrogateescape`: valid UTF-8 reads as its text, and a byte of no whole character becomes a
lone surrogate, which no JSON text read here can hold (orjson refuses them), so a piece never
equals a text or another piece. llama.cpp also gives fewer entries than tokens: a token that
ends inside a character has none, and the token completing it carries both pieces, their
bytes and text together (and the logprob and alternatives of the last).
"""

from __future__ import annotations

import base64
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.compare.events import events


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call in an answer: its name and its JSON arguments as text."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class TokenChoice:
    """A token the model chose, its logprob and the top alternatives it returned there.

    `top` holds (token, logprob) pairs in the order the response gave them; it is empty when the
    request asked for no top_logprobs. Tokens are their bytes where the response gave them (see
    above); `shown` is the text the response wrote for the token, when it differs from them.
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    shown: str | None = None


@dataclass(slots=True)
class Answer:
    """What an OpenAI response said, as far as comparing it goes."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    embeddings: tuple[Sequence[float], ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tokens: tuple[TokenChoice, ...] = ()
    readable: bool = True  # False: the body or stream is not an OpenAI response


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _vector(value: Any) -> Sequence[float]:
    if isinstance(value, str):  # encoding_format: base64, little-endian float32
        floats = array("f")
        floats.frombytes(base64.b64decode(value))
        return floats
    if isinstance(value, list):
        return [float(v) for v in value]
    return []


def _logprob(value: Any) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _token(entry: dict[str, Any]) -> str | None:
    """Return an entry's token: its bytes where it gives them (decoded as above), else its text;
    None when it has no text."""
    text, raw = entry.get("token"), entry.get("bytes")
    if not isinstance(text, str):
        return None
    if isinstance(raw, list):
        try:
            return bytes(raw).decode("utf-8", "surrogateescape")
        except (TypeError, ValueError):  # not a list of byte values
            pass
    return text


def _chat_tokens(content: Any) -> list[TokenChoice]:
    """Read a chat response's `logprobs.content` list."""
    found: list[TokenChoice] = []
    if not isinstance(content, list):
        return found
    for entry in content:
        if not isinstance(entry, dict):
            continue
        token, logprob = _token(entry), _logprob(entry.get("logprob"))
        if token is None or logprob is None:
            continue
        top: list[tuple[str, float]] = []
        alternatives = entry.get("top_logprobs")
        for alternative in alternatives if isinstance(alternatives, list) else ():
            if not isinstance(alternative, dict):
                continue
            other, other_logprob = _token(alternative), _logprob(alternative.get("logprob"))
            if other is not None and other_logprob is not None:
                top.append((other, other_logprob))
        shown = entry["token"] if entry["token"] != token else None
        found.append(TokenChoice(token, logprob, tuple(top), shown))
    return found


def _completion_tokens(logprobs: dict[str, Any]) -> list[TokenChoice]:
    """Read a legacy completion's `logprobs`: parallel lists of tokens, logprobs, top maps."""
    chosen, values, tops = (
        logprobs.get("tokens"),
        logprobs.get("token_logprobs"),
        logprobs.get("top_logprobs"),
    )
    found: list[TokenChoice] = []
    if not isinstance(chosen, list) or not isinstance(values, list):
        return found
    if not isinstance(tops, list):
        tops = []
    for i, (token, value) in enumerate(zip(chosen, values, strict=False)):
        logprob = _logprob(value)
        if not isinstance(token, str) or logprob is None:
            continue  # e.g. the first prompt token of an echo, which has no logprob
        alternatives = tops[i] if i < len(tops) else None
        top: list[tuple[str, float]] = []
        if isinstance(alternatives, dict):
            for other, other_value in alternatives.items():
                other_logprob = _logprob(other_value)
                if isinstance(other, str) and other_logprob is not None:
                    top.append((other, other_logprob))
        found.append(TokenChoice(token, logprob, tuple(top)))
    return found


def _token_choices(logprobs: Any) -> list[TokenChoice]:
    """Read a choice's `logprobs`, chat or legacy completion; anything else reads as none."""
    if not isinstance(logprobs, dict):
        return []
    if "content" in logprobs:
        return _chat_tokens(logprobs["content"])
    return _completion_tokens(logprobs)


def read_body(body: bytes) -> Answer:
    """Read a whole (non-streamed) chat, completion or embeddings response."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer(readable=False)
    if not isinstance(doc, dict):
        return Answer(readable=False)
    answer = Answer()
    usage = doc.get("usage")
    if isinstance(usage, dict):
        answer.prompt_tokens = _int(usage.get("prompt_tokens"))
        answer.completion_tokens = _int(usage.get("completion_tokens"))
    if doc.get("object") == "list" and isinstance(doc.get("data"), list):
        answer.embeddings = tuple(
            _vector(item.get("embedding")) for item in doc["data"] if isinstance(item, dict)
        )
        return answer
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        answer.readable = False
        return answer
    choice = choices[0]
    answer.finish_reason = choice.get("finish_reason")
    answer.tokens = tuple(_token_choices(choice.get("logprobs")))
    message = choice.get("message")
    if isinstance(message, dict):
        calls = []
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                calls.append(
                    ToolCall(str(function.get("name", "")), str(function.get("arguments", "")))
                )
        answer.tool_calls = tuple(calls)
        content = message.get("content")
        answer.text = content if isinstance(content, str) else None
    elif isinstance(choice.get("text"), str):
        answer.text = choice["text"]
    if answer.tool_calls:
        answer.text = _tool_text(answer.tool_calls)
    return answer


def read_stream(data: bytes) -> Answer:
    """Read the bytes of a streamed chat or completion response (server-sent events)."""
    answer = Answer()
    pieces: list[str] = []
    calls: dict[int, list[str]] = {}
    chosen: list[TokenChoice] = []
    answer.readable = False  # until a chunk holds a choice of the first answer
    for event in events(data):
        payload = event.strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        usage = doc.get("usage")
        if isinstance(usage, dict):
            answer.prompt_tokens = _int(usage.get("prompt_tokens"))
            answer.completion_tokens = _int(usage.get("completion_tokens"))
        choice = _first_choice(doc.get("choices"))
        if choice is None:
            continue
        answer.readable = True
        if choice.get("finish_reason"):
            answer.finish_reason = choice["finish_reason"]
        chosen += _token_choices(choice.get("logprobs"))
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if isinstance(delta.get("content"), str):
                pieces.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                name_args = calls.setdefault(_int(call.get("index")) or 0, ["", ""])
                function = call.get("function")
                if isinstance(function, dict):
                    name_args[0] += str(function.get("name") or "")
                    name_args[1] += str(function.get("arguments") or "")
        elif isinstance(choice.get("text"), str):
            pieces.append(choice["text"])
    answer.tool_calls = tuple(ToolCall(n, a) for _, (n, a) in sorted(calls.items()))
    answer.tokens = tuple(chosen)
    answer.text = _tool_text(answer.tool_calls) if answer.tool_calls else "".join(pieces)
    return answer


def _first_choice(choices: Any) -> dict[str, Any] | None:
    """Return a stream chunk's choice of the first answer: with `n`, each chunk carries one
    choice, of any index."""
    if not isinstance(choices, list):
        return None
    return next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)


def _tool_text(calls: Sequence[ToolCall]) -> str:
    return "\n".join(f"{c.name}({c.arguments})" for c in calls)
