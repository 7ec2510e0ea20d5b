"""Traces: arrivals and token counts read from the Azure LLM format."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.replay.trace import read_trace


def test_rate_scale_compresses_arrivals(trace: Path) -> None:
    normal = read_trace(trace, limit=50)
    doubled = read_trace(trace, limit=50, rate_scale=2.0)
    assert doubled[-1].arrival_s == pytest.approx(normal[-1].arrival_s / 2)
    assert [r.output_tokens for r in doubled] == [r.output_tokens for r in normal]
