"""Server-sent events read as the specification says, in whatever chunks they arrive."""

from __future__ import annotations

import pytest

from gateway.compare.events import EventReader, events

STREAM = (
    b": a comment, then three events with each kind of line ending\r\n"
    b"data: first\r\n\r\n"
    b"event: message\rdata: second\rdata:  two lines\r\r"
    b"id: 7\ndata\ndata: third\n\n"
    b"data: never ended"
)
EVENTS = [b"first", b"second\n two lines", b"\nthird"]


def test_every_line_ending_comment_field_and_multi_line_data_is_read() -> None:
    assert events(STREAM) == EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_any_chunking_reads_the_same_events_a_crlf_split_included(size: int) -> None:
    reader = EventReader()
    found = []
    for start in range(0, len(STREAM), size):
        found += reader.feed(STREAM[start : start + size])
    assert found == EVENTS


def test_a_large_event_in_small_chunks_is_read_whole() -> None:
    reader = EventReader()
    payload = b"x" * 1_000_000
    stream = b"data: " + payload + b"\n\n"
    found = []
    for start in range(0, len(stream), 100):
        found += reader.feed(stream[start : start + 100])
    assert found == [payload]
