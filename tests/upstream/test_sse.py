"""The SSE tally: token events, usage and [DONE], however the backend frames its stream."""

from __future__ import annotations

import pytest
from llamacpp import captured

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


def test_a_llamacpp_stream_of_two_choices_counts_both_choices_usage_and_its_prompt_once() -> None:
    # llama-server sends one usage event per choice: 15 tokens for the second, 22 for the first.
    stream = captured("chat-n2-logprobs-stream.txt")
    summed, last = StreamTally(per_choice_usage=True), StreamTally()
    for tally in (summed, last):
        tally.feed(stream, now=0.0)
    assert summed.done and summed.usage is not None and last.usage is not None
    assert (summed.usage["prompt_tokens"], summed.usage["completion_tokens"]) == (32, 37)
    assert last.usage["completion_tokens"] == 22  # one choice: what the engine's last event says
