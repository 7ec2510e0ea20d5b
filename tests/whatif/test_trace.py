"""Traces: arrivals, token counts and prefix blocks, read from the Azure and Mooncake formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.whatif.trace import TraceError, read_trace


def test_rate_scale_compresses_arrivals(trace: Path) -> None:
    normal = read_trace(trace, limit=50)
    doubled = read_trace(trace, limit=50, rate_scale=2.0)
    assert doubled[-1].arrival_s == pytest.approx(normal[-1].arrival_s / 2)
    assert [r.output_tokens for r in doubled] == [r.output_tokens for r in normal]


def test_a_mooncake_trace_reads_arrivals_tokens_and_prefix_blocks(mooncake: Path) -> None:
    head = read_trace(mooncake, limit=8)
    first_line = {"timestamp": 0, "input_length": 6758, "output_length": 500}
    assert len(head) == 8
    assert (head[0].arrival_s, head[0].prompt_tokens, head[0].output_tokens) == (
        first_line["timestamp"] / 1000,
        first_line["input_length"],
        first_line["output_length"],
    )
    assert head[0].blocks == tuple(range(14)) and head[0].block_tokens == 512
    # Conversations open with the same system prompt: their first block is one block.
    assert {r.blocks[0] for r in head} == {0}
    assert all(len(r.blocks) == -(-r.prompt_tokens // 512) for r in head)
    assert read_trace(mooncake, limit=8, rate_scale=2.0)[-1].arrival_s == head[-1].arrival_s / 2


def test_a_trace_is_told_by_its_content_when_its_name_does_not_say(
    mooncake: Path, trace: Path, tmp_path: Path
) -> None:
    lines = mooncake.read_text().splitlines(keepends=True)[:20]
    unnamed = tmp_path / "conversation"
    unnamed.write_text("".join(lines))
    assert read_trace(unnamed) == read_trace(mooncake, limit=20)
    csv_copy = tmp_path / "azure"
    csv_copy.write_text("".join(trace.read_text().splitlines(keepends=True)[:20]))
    assert read_trace(csv_copy)[0].blocks == ()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "the line is not JSON"),
        ("[1, 2]", "expected a JSON object with timestamp (ms), input_length"),
        ('{"timestamp": 5, "input_length": 10}', "the line lacks output_length, hash_ids"),
        (
            '{"timestamp": 5, "input_length": "10", "output_length": 3, "hash_ids": [1]}',
            "input_length must be an integer >= 0, got '10'",
        ),
        (
            '{"timestamp": -1, "input_length": 10, "output_length": 3, "hash_ids": [1]}',
            "timestamp must be milliseconds >= 0, got -1",
        ),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [1.5]}',
            "hash_ids must be a list of integers, got [1.5]",
        ),
        (
            '{"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [1]}',
            "1 hash_ids for 1000 input tokens, which make 2 blocks of 512",
        ),
    ],
)
def test_a_malformed_mooncake_line_is_named_with_what_was_expected(
    tmp_path: Path, line: str, expected: str
) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}'
    path = tmp_path / "trace.jsonl"
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert str(raised.value).startswith(f"{path}:2: ")
    assert expected in str(raised.value)
