"""Answers: what an OpenAI response said, read from a whole JSON body or a stream's bytes.

An answer is its text (or, for tool calls, the calls written out as text), its tool calls, its
embedding vectors and its usage: what comparing two answers needs. Reading is lenient: a body
that is not an OpenAI response reads as an empty answer rather than an error.
"""

from __future__ import annotations

import base64
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


@dataclass(slots=True)
class Answer:
    """What an OpenAI response said, as far as comparing it goes."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    embeddings: tuple[Sequence[float], ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


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


def read_body(body: bytes) -> Answer:
    """Read a whole (non-streamed) chat, completion or embeddings response."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer()
    if not isinstance(doc, dict):
        return Answer()
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
        return answer
    choice = choices[0]
    answer.finish_reason = choice.get("finish_reason")
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
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        choice = choices[0]
        if choice.get("finish_reason"):
            answer.finish_reason = choice["finish_reason"]
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
    answer.text = _tool_text(answer.tool_calls) if answer.tool_calls else "".join(pieces)
    return answer


def _tool_text(calls: Sequence[ToolCall]) -> str:
    return "\n".join(f"{c.name}({c.arguments})" for c in calls)
