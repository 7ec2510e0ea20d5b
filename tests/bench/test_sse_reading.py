"""Reading a stream's events takes time in proportion to its bytes, however it is chunked.

A ratio of two CPU times measured in one run, never an absolute time: reading four times the
bytes of one event in the same small chunks takes about four times as long when each byte is
looked at once, and sixteen times when every chunk re-reads what came before it.
"""

from __future__ import annotations

import time

import pytest

from gateway.compare.events import EventReader

pytestmark = pytest.mark.alone  # a ratio of CPU times, read best on a quiet machine

CHUNK = 100
LINEAR_BOUND = 8.0  # linear reading gives ~4; quadratic ~16


def cpu_to_read(size: int) -> float:
    """Return the least CPU time of three readings of one event of `size` bytes, 100 at a time."""
    body = b"data: " + b"x" * size + b"\n\n"
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    best = float("inf")
    for _ in range(3):
        reader = EventReader()
        started = time.process_time()
        found = [data for chunk in chunks for data in reader.feed(chunk)]
        best = min(best, time.process_time() - started)
        assert [len(data) for data in found] == [size]
    return best


def test_reading_four_times_the_bytes_takes_about_four_times_the_cpu() -> None:
    small, large = cpu_to_read(250_000), cpu_to_read(1_000_000)
    assert large / small < LINEAR_BOUND, f"{large:.4f} s against {small:.4f} s"
