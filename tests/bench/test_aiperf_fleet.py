"""bench/aiperf_fleet.py: the conversations aiperf replays, the tokenizer it counts them with and
what is read back from its summary (the run itself needs aiperf and the real fleet)."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from bench import aiperf_fleet
from gateway.whatif.trace import MOONCAKE_BLOCK_TOKENS
from realfleet import corpus, weights


def test_conversations_are_mooncake_sessions_of_their_own_that_fit_the_context() -> None:
    lines = aiperf_fleet.conversations(200, 5, 1500, seed=1, first_block=10)
    sessions: dict[str, list[dict]] = {}
    for line in lines:
        sessions.setdefault(line["session_id"], []).append(line)
    assert len(sessions) == 200
    firsts = [turns[0] for turns in sessions.values()]
    for line in firsts:  # whole blocks but the last, as the format counts them
        assert len(line["hash_ids"]) == -(-line["input_length"] // MOONCAKE_BLOCK_TOKENS)
        assert 300 <= line["input_length"] <= 1400
    ids = [i for line in firsts for i in line["hash_ids"]]
    assert len(set(ids)) == len(ids) and min(ids) == 10  # no conversation shares a block
    starts = [line["timestamp"] for line in firsts]
    assert starts[0] == 0 and starts == sorted(starts)
    assert 1300 < starts[-1] / 199 < 1700  # 1.5 s apart on average
    assert 4 < len(lines) / 200 < 6  # five turns a conversation on average
    for turns in sessions.values():
        later = turns[1:]
        assert all("hash_ids" not in t and "timestamp" not in t for t in later)
        assert all(40 <= t["input_length"] <= 80 and 200 <= t["delay"] <= 1000 for t in later)
        assert sum(t["input_length"] + t["output_length"] for t in turns) <= 2048 * 0.9
    # Another arm's trace: the same shapes and times, blocks of its own.
    other = aiperf_fleet.conversations(200, 5, 1500, seed=1, first_block=10_000)
    shape = ("timestamp", "input_length", "delay", "output_length")
    assert [[t.get(k) for k in shape] for t in other] == [[t.get(k) for k in shape] for t in lines]
    assert min(i for t in other for i in t.get("hash_ids", [10_000])) == 10_000


def test_the_tokenizer_is_placed_where_transformers_finds_it_offline(tmp_path: Path) -> None:
    aiperf_fleet.place_tokenizer(tmp_path)
    repo = tmp_path / "hub" / f"models--shadow-gateway--{corpus.MODEL}"
    revision = (repo / "refs" / "main").read_text()
    snapshot = repo / "snapshots" / revision
    config = json.loads((snapshot / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    placed = tokenizers.Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    tok = weights.tokenizer(weights.SHIPPED)
    text = corpus.suite_lines("facts")[0]
    assert placed.encode(text, add_special_tokens=False).ids == tok.encode(text)


def test_the_figures_are_read_from_aiperfs_summary() -> None:
    # The shape of aiperf 0.13.0's profile_export_aiperf.json (a run against the simulator).
    summary = {
        "time_to_first_token": {"unit": "ms", "avg": 15.9, "p50": 14.6, "p90": 24.7, "p99": 30.9},
        "inter_token_latency": {"unit": "ms", "avg": 0.05, "p50": 0.0, "p90": 0.13, "p99": 0.2},
        "request_latency": {"unit": "ms", "avg": 17.9, "p50": 15.8, "p90": 27.0, "p99": 35.7},
        "request_count": {"unit": "requests", "avg": 10.0},
        "request_throughput": {"unit": "requests/sec", "avg": 4.2},
        "usage_prompt_tokens_diff_pct": {"unit": "%", "avg": 0.4, "p50": 0.0},
        "time_to_second_token": {"unit": "ms", "avg": 0.0},
    }
    found = aiperf_fleet.figures(summary)
    assert found["ttft_p50_ms"] == 14.6 and found["ttft_p99_ms"] == 30.9
    assert found["e2e_p90_ms"] == 27.0 and found["itl_avg_ms"] == 0.05
    assert found["request_count"] == 10.0 and found["usage_prompt_tokens_diff_pct"] == 0.4
    assert "request_error_rate" not in found  # absent from a run without errors


def test_the_headline_is_the_gateways_figures_over_round_robins_run_by_run() -> None:
    runs = [
        {"gateway": {"ttft_p50_ms": g, "cached_share": 0.9},
         "round-robin": {"ttft_p50_ms": r, "cached_share": 0.5}}
        for g, r in ((50.0, 100.0), (60.0, 100.0), (45.0, 50.0))
    ]  # fmt: skip
    headline = aiperf_fleet.headline(runs)
    assert headline["ttft_p50_ms_gateway_over_round_robin"] == {
        "median": 0.6, "min": 0.5, "max": 0.9,
    }  # fmt: skip
    assert headline["round-robin_cached_share"]["median"] == 0.5
