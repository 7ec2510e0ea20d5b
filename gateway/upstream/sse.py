"""SSE framing: watch an OpenAI event stream go by, chunk by chunk, without holding it.

A stream is relayed in whatever chunks the backend's writes arrive in; events (`data: ...`
followed by a blank line) may span chunks, so the tally keeps an event's start until its end
arrives. It counts token events, keeps the usage a final event reports, and notes the `[DONE]`
that marks a complete answer.
"""

from __future__ import annotations

from typing import Any

import orjson


class StreamTally:
    """Watch an SSE stream go by: count token events, find usage and the final [DONE]."""

    __slots__ = ("_buffer", "done", "first_token_at", "last_token_at", "tokens", "usage")

    def __init__(self) -> None:
        self._buffer = b""
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """Account for a chunk as it is relayed."""
        events = (self._buffer + chunk).split(b"\n\n")
        self._buffer = events.pop()
        for event in events:
            self._event(event, now)

    def _event(self, event: bytes, now: float) -> None:
        data = event.partition(b"data:")[2].strip()
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
                self.usage = usage


def _has_text(data: bytes) -> bool:
    for marker in (b'"content":"', b'"text":"'):
        i = data.find(marker)
        if i >= 0 and data[i + len(marker) : i + len(marker) + 1] != b'"':
            return True
    return False
