"""SSE tally: watch an OpenAI event stream go by, chunk by chunk, without holding it.

A stream is relayed in whatever chunks the backend's writes arrive in; events may span chunks,
and are read as the specification says (gateway/compare/events.py). The tally counts token
events, keeps the usage a final event reports, and notes the `[DONE]` that marks a complete
answer. From an engine that reports usage once a choice (llama.cpp, gateway/upstream/usage.py),
it sums the choices' completion tokens.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.compare.events import EventReader


class StreamTally:
    """Watch an SSE stream go by: count token events, find usage and the final [DONE]."""

    __slots__ = (
        "_events",
        "done",
        "first_token_at",
        "last_token_at",
        "per_choice_usage",
        "tokens",
        "usage",
    )

    def __init__(self, per_choice_usage: bool = False) -> None:
        self._events = EventReader()
        self.per_choice_usage = per_choice_usage
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """Account for a chunk as it is relayed."""
        for data in self._events.feed(chunk):
            self._event(data.strip(), now)

    def _event(self, data: bytes, now: float) -> None:
        if not data:
            return
        if data == b"[DONE]":
            self.done = True
            return
        if _has_text(data):
            self.tokens += 1
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
        if b'"usage":{' in data or b'"usage": {' in data:
            try:
                usage = orjson.loads(data).get("usage")
            except (orjson.JSONDecodeError, AttributeError):
                return
            if isinstance(usage, dict):
                self.usage = self._sum(usage) if self.per_choice_usage else usage

    def _sum(self, usage: dict[str, Any]) -> dict[str, Any]:
        """Add the completion tokens of the choices' usage events seen before to this one's."""
        before = _count(self.usage.get("completion_tokens")) if self.usage is not None else 0
        now = _count(usage.get("completion_tokens"))
        if before is None or now is None:
            return usage
        return usage | {"completion_tokens": before + now}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _has_text(data: bytes) -> bool:
    for marker in (b'"content":"', b'"text":"'):
        i = data.find(marker)
        if i >= 0 and data[i + len(marker) : i + len(marker) + 1] != b'"':
            return True
    return False
