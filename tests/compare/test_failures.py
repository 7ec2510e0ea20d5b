"""Failures: an answer the client could not use, judged against the other side's answer."""

from __future__ import annotations

import pytest

from gateway.compare.answers import Answer, ToolCall, read_body, read_stream
from gateway.compare.failures import failure

FINISHED = Answer(text=" ".join(f"word{i}" for i in range(40)) + ".", finish_reason="stop")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("upstream_timeout", "timeout"),
        ("stream_broken", "broken"),
        ("upstream_error", "error"),
        ("upstream_client_error", "error"),
    ],
)
def test_an_upstream_error_is_the_copys_failure(error: str, kind: str) -> None:
    assert failure(error, Answer(), FINISHED) == kind


def test_a_body_that_is_no_openai_response_is_broken() -> None:
    assert failure(None, read_body(b"<html>bad gateway</html>"), FINISHED) == "broken"
    assert failure(None, read_body(b'{"detail": "oops"}'), FINISHED) == "broken"
    assert failure(None, read_stream(b"data: [DONE]\n\n"), FINISHED) == "broken"


def test_null_and_empty_answers_fail_unless_the_primary_gave_the_same() -> None:
    null = read_body(b'{"choices": [{"message": {"content": null}, "finish_reason": "stop"}]}')
    empty = read_body(b'{"choices": [{"message": {"content": " "}, "finish_reason": "stop"}]}')
    assert failure(None, null, FINISHED) == "null"
    assert failure(None, empty, FINISHED) == "empty"
    assert failure(None, empty, Answer(text="", finish_reason="stop")) is None
    # Tool calls are an answer without content.
    calls = Answer(text=None, tool_calls=(ToolCall("f", "{}"),), finish_reason="tool_calls")
    assert failure(None, calls, FINISHED) is None


def test_an_answer_cut_short_where_the_primary_finished_fails() -> None:
    words = FINISHED.text.split(" ")
    half = Answer(text=" ".join(words[:20]), finish_reason="stop")
    assert failure(None, half, FINISHED) == "cut_short"
    # Stopped for length where the primary finished, whatever its words.
    assert failure(None, Answer(text=FINISHED.text, finish_reason="length"), FINISHED) == (
        "cut_short"
    )
    # Much shorter, other words.
    other = Answer(text="Something else entirely.", finish_reason="stop")
    assert failure(None, other, FINISHED) == "cut_short"
    # The primary ran out of tokens itself: nothing to hold the copy to.
    assert failure(None, half, Answer(text=FINISHED.text, finish_reason="length")) is None


def test_a_different_answer_of_its_own_length_is_no_failure() -> None:
    reworded = Answer(text=" ".join(f"other{i}" for i in range(35)) + ".", finish_reason="stop")
    assert failure(None, reworded, FINISHED) is None
    assert failure(None, FINISHED, FINISHED) is None
    # A short answer may rightly be shorter still.
    short = Answer(text="Paris is the capital of France.", finish_reason="stop")
    assert failure(None, Answer(text="Paris.", finish_reason="stop"), short) is None


def test_the_primary_is_judged_against_the_copy_the_same_way() -> None:
    empty = Answer(text="", finish_reason="stop")
    assert failure(None, empty, FINISHED) == "empty"
    assert failure(None, FINISHED, empty) is None


def test_an_embeddings_answer_fails_without_vectors() -> None:
    reference = Answer(embeddings=([0.1, 0.2],))
    assert failure(None, read_body(b'{"object": "list", "data": []}'), reference) == "empty"
    assert failure(None, Answer(embeddings=([0.1, 0.2],)), reference) is None
