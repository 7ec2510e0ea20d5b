from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import replace

import pytest

from gateway.errors import InvalidRequest, SloNotAllowed, Unauthorized
from gateway.policy.load import parse_policy, to_yaml
from gateway.routing.classify import TokenEstimator, classify, tenant_of, text_tokens
from gateway.routing.tokenizers import load_tokenizer
from gateway.routing.tokens import token_blocks
from policies import MODEL, fleet_policy
from simulator.schema import EngineTokenizer


def chat(**kw: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}]} | kw


def test_profile_carries_model_tokens_class_and_stream() -> None:
    policy = fleet_policy()
    p = classify("chat", chat(max_tokens=64, stream=True), {}, None, policy, TokenEstimator())
    assert (p.model, p.max_tokens, p.stream, p.slo_class) == (MODEL, 64, True, "interactive")
    assert p.prompt_tokens == 104  # 400 chars / 4 + one message's overhead
    assert (p.ttft_ms, p.tpot_ms) == (500, 50)


def test_slo_headers_set_class_and_targets() -> None:
    policy = fleet_policy()
    headers = {"x-slo-class": "batch", "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"}
    p = classify("chat", chat(), headers, None, policy, TokenEstimator())
    assert (p.slo_class, p.ttft_ms, p.tpot_ms, p.e2e_ms) == ("batch", 250, 20, 60000)


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"x-slo-class": "gold"}, "x-slo-class"),
        ({"x-slo-ttft-ms": "soon"}, "x-slo-ttft-ms"),
        ({"x-slo-tpot-ms": "-5"}, "x-slo-tpot-ms"),
    ],
)
def test_bad_slo_headers_are_invalid(headers: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        classify("chat", chat(), headers, None, fleet_policy(), TokenEstimator())
    assert info.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": ["hi"]}, "messages[0]"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens="10"), "max_tokens"),
        (chat(stream="yes"), "stream"),
        (chat(n=0), "n"),
        (chat(n=129), "n"),
        (chat(n=3, best_of=2), "best_of"),
        (chat(max_tokens=10, min_tokens=11), "min_tokens"),
        (chat(min_tokens=-1), "min_tokens"),
        (chat(ignore_eos="yes"), "ignore_eos"),
        (chat(prompt_cache_key=7), "prompt_cache_key"),
    ],
)
def test_invalid_bodies_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        classify("chat", body, {}, None, fleet_policy(), TokenEstimator())
    assert info.value.param == param


def test_a_request_generates_n_answers_or_best_of_them() -> None:
    policy, est = fleet_policy(), TokenEstimator()
    assert classify("chat", chat(), {}, None, policy, est).sequences == 1
    assert classify("chat", chat(n=3), {}, None, policy, est).sequences == 3
    assert (
        classify(
            "completions",
            {"model": MODEL, "prompt": "x", "n": 2, "best_of": 5},
            {},
            None,
            policy,
            est,
        ).sequences
        == 5
    )


def test_completions_and_embeddings_read_their_prompt_fields() -> None:
    policy, est = fleet_policy(), TokenEstimator()
    assert (
        classify(
            "completions", {"model": MODEL, "prompt": "y" * 80}, {}, None, policy, est
        ).prompt_tokens
        == 20
    )
    emb = classify(
        "embeddings", {"model": MODEL, "input": ["ab" * 10, "cd" * 10]}, {}, None, policy, est
    )
    assert emb.prompt_tokens == 10 and emb.max_tokens is None
    with pytest.raises(InvalidRequest):
        classify("embeddings", {"model": MODEL, "input": 5}, {}, None, policy, est)


def test_estimator_calibrates_toward_reported_usage() -> None:
    est = TokenEstimator(smoothing=0.2)
    first = est.estimate(MODEL, 1000.0)
    for _ in range(60):
        est.observe(MODEL, est.estimate(MODEL, 1000.0), 1500, est.ratio(MODEL))
    assert first == 1000
    assert est.estimate(MODEL, 1000.0) == pytest.approx(1500, rel=0.02)
    assert est.estimate("other-model", 1000.0) == 1000


def test_estimator_stays_calibrated_with_many_requests_in_flight() -> None:
    # Each answer's usage arrives 200 estimates after its own: the ratio moves in between.
    est, in_flight = TokenEstimator(), deque[tuple[int, float, int]]()
    rng = random.Random(1)
    for _ in range(20_000):
        chars = rng.randint(1000, 3000)
        in_flight.append((est.estimate(MODEL, chars / 4), est.ratio(MODEL), int(chars / 4 * 1.3)))
        if len(in_flight) > 200:
            est.observe(MODEL, *in_flight.popleft())
    assert est.ratio(MODEL) == pytest.approx(1.3, rel=0.01)


def test_one_odd_request_moves_the_ratio_by_a_bounded_step() -> None:
    # Usage 88 times the estimate (tool schemas the estimate missed, say): one observation
    # moves the model's ratio by at most a smoothing step toward twice the current one.
    est = TokenEstimator(smoothing=0.05)
    est.observe(MODEL, 80, 7_040, 1.0)
    assert est.ratio(MODEL) == pytest.approx(1.05)
    est.observe(MODEL, 7_040, 80, est.ratio(MODEL))
    assert est.ratio(MODEL) == pytest.approx(1.05 - 0.05 * 1.05 / 2)


def test_text_is_estimated_by_script() -> None:
    assert text_tokens("a" * 400) == 100
    chinese = "能源效率的硬件路由网关" * 800  # 8,800 characters
    assert text_tokens(chinese) == pytest.approx(8_800 / 1.26)
    assert text_tokens("energy 能源") == pytest.approx(7 / 4 + 2 / 1.26)
    assert text_tokens("привет") == pytest.approx(6 / 2)


def test_every_part_the_backend_tokenizes_is_counted() -> None:
    est = TokenEstimator()
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "x" * 4000}},
            },
        },
    }
    plain = classify("chat", chat(), {}, None, fleet_policy(), est).prompt_tokens
    with_tools = classify("chat", chat(tools=[tool]), {}, None, fleet_policy(), est).prompt_tokens
    assert with_tools - plain > 1000  # the schema's 4,000 characters
    call = {
        "role": "assistant",
        "content": None,
        "name": "n" * 400,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "y" * 4000}}
        ],
    }
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}},
        ],
    }
    body = chat()
    body["messages"] = [*body["messages"], call, image]
    tokens = classify("chat", body, {}, None, fleet_policy(), est).prompt_tokens
    # The call's arguments and name (1,100), the image (1,000, not its 100 kB of base64).
    assert 2_100 < tokens - plain < 2_200


def test_tenant_from_key_and_required_keys() -> None:
    digest = hashlib.sha256(b"sk-acme").hexdigest()
    open_policy = fleet_policy(tenants=[{"name": "acme", "api_key_sha256": [digest]}])
    est = TokenEstimator()
    acme = tenant_of(open_policy, {"authorization": "Bearer sk-acme"})
    assert acme is not None and acme.name == "acme"
    assert classify("chat", chat(), {}, acme, open_policy, est).tenant == "acme"
    assert tenant_of(open_policy, {"authorization": "Bearer nope"}) is None
    assert classify("chat", chat(), {}, None, open_policy, est).tenant == "anonymous"
    closed = fleet_policy(
        tenants=[{"name": "acme", "api_key_sha256": [digest]}], require_tenant_key=True
    )
    with pytest.raises(Unauthorized):
        tenant_of(closed, {"authorization": "Bearer nope"})


def test_a_session_is_named_within_its_tenant() -> None:
    digest = hashlib.sha256(b"sk-acme").hexdigest()
    policy = fleet_policy(tenants=[{"name": "acme", "api_key_sha256": [digest]}])
    acme = tenant_of(policy, {"authorization": "Bearer sk-acme"})
    est, named = TokenEstimator(), {"x-session-id": "7"}
    assert classify("chat", chat(), named, acme, policy, est).session == "acme/7"
    assert classify("chat", chat(), named, None, policy, est).session == "anonymous/7"
    keyed = chat(prompt_cache_key="k")  # the body's key wins over a header
    assert classify("chat", keyed, named, None, policy, est).session == "anonymous/k"
    assert classify("chat", chat(), {}, None, policy, est).session is None
    # The affinity keys aiperf sends, each alone: any of them names the session.
    for header in ("x-session-affinity", "x-dynamo-session-id", "x-smg-routing-key"):
        assert classify("chat", chat(), {header: "c9"}, None, policy, est).session == "anonymous/c9"


def test_tenant_defaults_and_limits_its_slo_headers() -> None:
    digest = hashlib.sha256(b"sk-batch").hexdigest()
    policy = fleet_policy(
        tenants=[
            {
                "name": "nightly",
                "api_key_sha256": [digest],
                "default_slo_class": "batch",
                "slo_classes": ["batch"],
                "slo_overrides": False,
            }
        ]
    )
    nightly = tenant_of(policy, {"authorization": "Bearer sk-batch"})
    est = TokenEstimator()
    assert classify("chat", chat(), {}, nightly, policy, est).slo_class == "batch"
    with pytest.raises(SloNotAllowed) as denied:
        classify("chat", chat(), {"x-slo-class": "interactive"}, nightly, policy, est)
    assert denied.value.status == 403 and "'interactive'" in denied.value.message
    with pytest.raises(SloNotAllowed):
        classify("chat", chat(), {"x-slo-ttft-ms": "50"}, nightly, policy, est)
    # Anonymous traffic keeps the policy's defaults and may still override.
    anonymous = classify("chat", chat(), {"x-slo-ttft-ms": "50"}, None, policy, est)
    assert (anonymous.slo_class, anonymous.ttft_ms) == ("interactive", 50)


def test_tenant_slo_classes_must_exist() -> None:
    from gateway.errors import PolicyError

    with pytest.raises(PolicyError, match="tenant 'x' names SLO class 'gold'"):
        fleet_policy(tenants=[{"name": "x", "default_slo_class": "gold"}])


def test_an_engines_cached_tokens_are_read_in_the_estimates_blocks() -> None:
    p = classify("chat", chat(), {}, None, fleet_policy(), TokenEstimator())
    p = replace(p, prompt_tokens=1000, block_tokens=50.0)
    # The engine counts the prompt as 1,100 tokens and found 990 cached: 90 % of it.
    assert p.blocks_found(990, 1100) == 18
    assert p.blocks_found(990) == 19  # in the estimate's own count
    assert replace(p, block_tokens=0.0).blocks_found(990, 1100) == 0


def test_a_model_with_a_tokenizer_is_keyed_by_token_and_counted_exactly() -> None:
    doc = fleet_policy().model_dump(mode="json", exclude_defaults=True)
    doc["models"] = {MODEL: {"params_b": 8, "tokenizer": "simulator.schema:EngineTokenizer"}}
    policy = parse_policy(to_yaml(doc), "tokenized.yaml")
    estimator = TokenEstimator(tokenizers=load_tokenizer)
    body = chat(max_tokens=8)
    body["messages"] = [{"role": "user", "content": "The harbour at dawn. " * 60}]
    profile = classify("chat", body, {}, None, policy, estimator)
    ids = EngineTokenizer().prompt_ids("chat", body)
    assert ids is not None and profile.prompt_tokens == len(ids)
    assert profile.blocks == token_blocks(ids) and profile.block_tokens == 64.0
    # Without the tokenizer the same prompt is keyed by its text: other keys.
    plain = classify("chat", body, {}, None, fleet_policy(), TokenEstimator())
    assert plain.blocks and not set(plain.blocks) & set(profile.blocks)
