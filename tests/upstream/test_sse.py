"""The SSE tally: token events, usage and [DONE], however the backend frames its stream."""

from __future__ import annotations

import pytest

from gateway.upstream.sse import StreamTally

LF = (
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
    b": keep-alive\n\n"
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_the_tally_counts_tokens_usage_and_done_whatever_the_line_endings(ending: bytes) -> None:
    stream = LF.replace(b"\n", ending)
    tally = StreamTally()
    for start in range(0, len(stream), 5):
        tally.feed(stream[start : start + 5], now=float(start))
    assert (tally.tokens, tally.done) == (2, True)
    assert tally.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert tally.first_token_at is not None and tally.last_token_at is not None
