"""Usage: the tokens an answer used, from the `usage` its serving engine reported.

Engines agree on `usage` for an answer of one choice. For several (`n`), vLLM, SGLang and
OpenAI count every choice's completion tokens; llama.cpp's llama-server (as of the 0.3.36
sources, `usage_json_oaicompat` in tools/server/server-task.cpp) counts one: a whole answer's
`usage` is its first choice's, and a stream sends one usage event per choice, each with that
choice's completion tokens and the whole prompt. For an engine that counts one choice
(`ONE_CHOICE`), the gateway counts every choice itself, so that request records, the
completion-token counter, energy attribution and a tenant's token budget see what was
generated:

- a stream: the completion tokens of its usage events are summed, one event a choice, and the
  prompt counted once (gateway/upstream/sse.py, `StreamTally(per_choice_usage=True)`);
- a whole answer: the first choice's count from `usage`, and for each other choice
  - `max_tokens` when it stopped for length: llama.cpp stops there, or sooner only when the
    slot's context ran out;
  - else the number of its logprob entries, when it has them: one a token, except that a token
    ending inside a UTF-8 character has none (it comes with the token that completes the
    character) and a cut stop string's tokens have none, so a lower bound;
  - else the estimate of its text and tool calls by the gateway's token estimator
    (gateway/routing/classify.py: characters by script, times the model's learned ratio).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import orjson

from gateway.routing.classify import text_tokens
from gateway.upstream.sse import StreamTally

ONE_CHOICE = frozenset({"llamacpp"})


def counts_one_choice(engine: str | None) -> bool:
    """Say whether an engine's `usage` counts only one choice of an answer with several."""
    return engine in ONE_CHOICE


class Used(NamedTuple):
    """What an answer's usage says: its prompt and completion tokens, and the prompt tokens
    the engine found in its prefix cache; None where it does not say."""

    prompt: int | None = None
    completion: int | None = None
    cached: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cached(usage: dict[str, Any]) -> int | None:
    """Return the prompt tokens a usage says came from the engine's prefix cache
    (`prompt_tokens_details.cached_tokens`, as OpenAI, vLLM, SGLang and llama.cpp send it)."""
    details = usage.get("prompt_tokens_details")
    return _int(details.get("cached_tokens")) if isinstance(details, dict) else None


def of(usage: dict[str, Any]) -> Used:
    """Return what a usage object says, as the engine counted it."""
    return Used(
        _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), cached(usage)
    )


def whole(body: bytes, engine: str | None, max_tokens: int | None, ratio: float) -> Used:
    """Return what a whole answer used, every choice counted."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Used()
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return Used()
    used = of(usage)
    choices = doc.get("choices")
    if used.completion is None or not counts_one_choice(engine) or not isinstance(choices, list):
        return used
    listed = [c for c in choices if isinstance(c, dict)]
    counted = next((c for c in listed if c.get("index") == 0), listed[0] if listed else None)
    return used._replace(
        completion=used.completion
        + sum(choice_tokens(c, max_tokens, ratio) for c in listed if c is not counted)
    )


def streamed(data: bytes, engine: str | None) -> Used:
    """Return what a whole stream's bytes used, every choice counted."""
    tally = StreamTally(per_choice_usage=counts_one_choice(engine))
    tally.feed(data, 0.0)
    return Used() if tally.usage is None else of(tally.usage)


def choice_tokens(choice: dict[str, Any], max_tokens: int | None, ratio: float) -> int:
    """Return the completion tokens of one choice whose engine did not count them (above)."""
    if choice.get("finish_reason") == "length" and max_tokens is not None:
        return max_tokens
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        entries = logprobs.get("content", logprobs.get("tokens"))
        if isinstance(entries, list) and entries:
            return len(entries)
    return math.ceil(text_tokens(_text(choice)) * ratio)


def _text(choice: dict[str, Any]) -> str:
    """Return what a choice generated as text: its content and its tool calls' names and
    arguments (a chat choice), or its text (a completion)."""
    message = choice.get("message")
    if not isinstance(message, dict):
        text = choice.get("text")
        return text if isinstance(text, str) else ""
    parts = [message.get("content")]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts += [function.get("name"), function.get("arguments")]
    return "".join(p for p in parts if isinstance(p, str))
