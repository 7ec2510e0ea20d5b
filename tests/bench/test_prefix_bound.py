"""The prefix bound: what a cache that kept every earlier prompt would spare each prefill."""

from __future__ import annotations

import json
from pathlib import Path

from bench.prefix_bound import bound


def test_a_repeated_prompt_is_bounded_by_its_prefill_with_its_prefix_cached(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 4000, "output_length": 10, "hash_ids": list(range(8))},
        # The same conversation's next turn, then a stranger's prompt.
        {
            "timestamp": 10,
            "input_length": 5000,
            "output_length": 10,
            "hash_ids": [*range(8), 50, 51],
        },
        {
            "timestamp": 20,
            "input_length": 4000,
            "output_length": 10,
            "hash_ids": list(range(90, 98)),
        },
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = bound(trace)
    assert found["requests"] == 3
    # Only the second finds anything: what the first kept, its 16-token blocks before its last
    # token, 3,984 tokens.
    assert found["cached_share"] == round(3984 / 13000, 4)
    cold, warm = found["nothing_cached"], found["everything_earlier_cached"]
    assert warm["p50_ms"] == cold["p50_ms"]  # the first and the stranger's: nothing to reuse
    assert warm["p99_ms"] < cold["p99_ms"]  # the second, the longest: 1,016 tokens of 5,000
