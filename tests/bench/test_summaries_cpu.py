"""bench/summaries_cpu.py: the folds it times take every request and copy it feeds them."""

from __future__ import annotations

from bench.summaries_cpu import run


def test_every_request_and_copy_is_folded_into_the_rows_handed_on() -> None:
    result = run(requests=6_000, rate=20.0, shadow_rate=0.1, window=2_000)

    assert result["requests_folded"] == 6_000
    assert result["copies_folded"] == 600
    assert result["keys"] > 1
    assert result["early_us_per_request"] > 0 and result["steady_us_per_request"] > 0
