"""The tokens an answer used: every choice counted where the engine's `usage` counts one."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
from llamacpp import captured, llama_policy, llama_server

from gateway.routing.classify import text_tokens
from gateway.upstream import usage
from harness.gateways import run_gateway
from harness.metrics import metric_value
from policies import MODEL

PROMPT = [{"role": "user", "content": "Say something."}]


def test_a_whole_llamacpp_answer_counts_its_other_choices_by_their_logprob_entries() -> None:
    body = captured("chat-n2-logprobs.json")
    # Its usage says 22, the first choice's; the second stopped at a stop string after 10
    # entries (15 tokens, its stream's usage says: an entry is missing where a token ended
    # inside a character, and the stop string's are cut).
    assert usage.whole(body, "llamacpp", 24, 1.0) == (32, 22 + 10, 31)
    # An engine whose usage counts every choice is taken at its word.
    assert usage.whole(body, "vllm", 24, 1.0) == (32, 22, 31)
    assert usage.whole(body, None, 24, 1.0) == (32, 22, 31)


def test_a_choice_that_stopped_for_length_used_max_tokens() -> None:
    body = captured("completions-n2-logprobs.json")  # both choices ran to max_tokens, 12
    assert usage.whole(body, "llamacpp", 12, 1.0) == (13, 24, 0)


def test_a_choice_without_logprobs_is_estimated_from_its_text_at_the_models_ratio() -> None:
    doc = orjson.loads(captured("chat-n2-logprobs.json"))
    for choice in doc["choices"]:
        del choice["logprobs"]
    second = doc["choices"][1]["message"]["content"]
    estimate = math.ceil(text_tokens(second) * 1.5)
    assert estimate > 0
    assert usage.whole(orjson.dumps(doc), "llamacpp", 24, 1.5) == (32, 22 + estimate, 31)


def test_a_llamacpp_stream_counts_each_choices_usage_event() -> None:
    stream = captured("chat-n2-logprobs-stream.txt")
    assert usage.streamed(stream, "llamacpp") == (32, 15 + 22, 31)
    assert usage.streamed(stream, "vllm") == (32, 22, 31)  # its last event, as for any engine
    assert usage.streamed(b"data: [DONE]\n\n", "llamacpp") == (None, None, None)


def test_the_cached_prompt_tokens_are_read_from_the_usage_details() -> None:
    assert usage.cached({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}) == 8
    assert usage.cached({"prompt_tokens": 9}) is None
    assert usage.cached({"prompt_tokens_details": {"cached_tokens": True}}) is None


def test_an_answer_without_usage_or_not_json_says_nothing() -> None:
    assert usage.whole(b'{"choices": []}', "llamacpp", 8, 1.0) == (None, None, None)
    assert usage.whole(b"<html>", "llamacpp", 8, 1.0) == (None, None, None)
    assert usage.whole(b'{"usage": {"prompt_tokens": "3"}}', None, 8, 1.0) == (None, None, None)


def test_records_and_counters_of_a_llamacpp_pool_count_every_choice(tmp_path: Path) -> None:
    with llama_server() as server, run_gateway(llama_policy(server.url), tmp_path) as gw:
        client = gw.client()
        whole = client.chat.completions.create(
            model=MODEL, messages=PROMPT, n=2, max_tokens=24, logprobs=True, top_logprobs=2
        )
        stream = client.chat.completions.create(
            model=MODEL,
            messages=PROMPT,
            n=2,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        rows = sorted(gw.records(2), key=lambda r: r["stream"])
        text = gw.http().get("/metrics").text
    # The client sees the engine's usage as it was sent: one choice's.
    assert whole.usage is not None and whole.usage.completion_tokens == 22
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [15, 22]
    assert [(r["stream"], r["completion_tokens"]) for r in rows] == [(False, 32), (True, 37)]
    counted = metric_value(text, "gateway_completion_tokens_total", pool="llama")
    assert counted == 32 + 37
