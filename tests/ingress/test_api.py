"""End to end: the official openai client through the gateway to simulator pools."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from waiting import wait_for

from gateway.routing.classify import MS_PATTERN
from harness.gateways import GatewayServer, run_gateway
from policies import BIG, EMBED, MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Explain what a compute-in-memory device is."}]


@pytest.fixture
def gw(sims, tmp_path: Path) -> Iterator[GatewayServer]:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, max_body_bytes=64 * 1024) as server:
        yield server


def test_chat_is_served_by_the_policy_pool_with_routing_headers(gw: GatewayServer) -> None:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=PROMPT, max_tokens=20, temperature=0
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 20
    assert raw.headers["x-gateway-route"] == "chat-8b-short"
    assert raw.headers["x-gateway-pool"] == "asic"
    assert raw.headers["x-gateway-backend"] == "asic-0"
    assert len(raw.headers["x-gateway-decision-id"]) == 32


def test_long_prompt_goes_to_the_gpu(gw: GatewayServer) -> None:
    long = [{"role": "user", "content": "word " * 3000}]
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=long, max_tokens=5
    )
    assert raw.headers["x-gateway-route"] == "chat-8b"
    assert raw.headers["x-gateway-pool"] == "gpu"


def test_streaming_relays_every_chunk_and_matches_the_plain_answer(gw: GatewayServer) -> None:
    client = gw.client()
    plain = client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=40, temperature=0)
    stream = client.chat.completions.create(
        model=BIG, messages=PROMPT, max_tokens=40, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 5
    assert "".join(pieces) == plain.choices[0].message.content


def test_stream_arrives_chunk_by_chunk_not_buffered(sims, gw: GatewayServer) -> None:
    for sim in sims.gpu:
        sim.set_faults(slow_factor=100)  # the answer takes seconds, long after its first token
    body = {
        "model": BIG,
        "messages": PROMPT,
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    with gw.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        first = next(response.iter_raw())
        decoding = sum(sim.metric("sim_active_requests") for sim in sims.gpu)
    # A buffered relay would send nothing until the backend had finished the answer.
    assert first.startswith(b"data: ") and decoding == 1
    wait_for(  # the backend drops the answer its client left
        lambda: not any(sim.metric("sim_active_requests") for sim in sims.gpu),
        message="the backend kept decoding the abandoned answer",
    )


def test_completions_endpoint(gw: GatewayServer) -> None:
    completion = gw.client().completions.create(model=MODEL, prompt="Once upon", max_tokens=8)
    assert completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens <= 8


def test_embeddings_are_served_by_the_asic(gw: GatewayServer) -> None:
    raw = gw.client().embeddings.with_raw_response.create(model=EMBED, input=["a", "b"])
    result = raw.parse()
    assert len(result.data) == 2 and len(result.data[0].embedding) == 1024
    assert raw.headers["x-gateway-pool"] == "asic"


def test_model_list_is_the_union_of_live_pools(gw: GatewayServer) -> None:
    ids = {m.id for m in gw.client().models.list()}
    assert ids == {MODEL, BIG, EMBED}


def test_unknown_model_is_404(gw: GatewayServer) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        gw.client().chat.completions.create(model="gpt-nope", messages=PROMPT)
    assert info.value.code == "model_not_found"


def test_invalid_field_is_400_naming_it(gw: GatewayServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=-1)
    assert info.value.param == "max_tokens"


def test_malformed_json_is_400(gw: GatewayServer) -> None:
    with gw.http() as http:
        response = http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "not valid JSON" in error["message"]


def test_prompt_over_every_context_is_400(gw: GatewayServer) -> None:
    huge = [{"role": "user", "content": "w" * 60_000}]
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model=BIG, messages=huge, max_tokens=120_000)
    assert info.value.code == "context_length_exceeded"


def test_body_over_the_limit_is_413(gw: GatewayServer) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        gw.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * 100_000}]
        )
    assert info.value.status_code == 413


def test_unknown_path_and_wrong_method(gw: GatewayServer) -> None:
    with gw.http() as http:
        assert http.post("/v1/images/generations", json={}).status_code == 404
        wrong = {
            (method, path): http.request(method, path)
            for method, path in [
                ("GET", "/v1/chat/completions"),
                ("PUT", "/v1/responses"),
                ("POST", "/v1/models"),
                ("DELETE", "/v1/models"),
            ]
        }
    for (method, path), response in wrong.items():
        assert response.status_code == 405, f"{method} {path}: {response.text}"
        assert response.json()["error"]["code"] == "method_not_allowed"
        assert response.headers["allow"] == ("GET" if path == "/v1/models" else "POST")


@pytest.mark.parametrize(
    "value", ["soon", "-5", "+250", "0", "0.0", "1e3", "1_000", "nan", "9" * 10]
)
def test_a_target_header_off_the_described_pattern_is_a_400(gw: GatewayServer, value: str) -> None:
    assert re.fullmatch(MS_PATTERN, value) is None  # what the description says is refused
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=4, extra_headers={"x-slo-ttft-ms": value}
        )
    assert info.value.param == "x-slo-ttft-ms"


def test_a_target_header_on_the_described_pattern_is_served(gw: GatewayServer) -> None:
    for value in ("250", "12.5", "0.5", "999999999"):
        assert re.fullmatch(MS_PATTERN, value)
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=4, extra_headers={"x-slo-tpot-ms": value}
        )
        assert raw.http_response.status_code == 200


def test_health_readiness_and_metrics(gw: GatewayServer) -> None:
    gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4)
    with gw.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")
        metrics = http.get("/metrics").text
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert (
        'gateway_requests_total{model="llama-3.1-8b-instruct",pool="asic",'
        'route="chat-8b-short",status="200"} 1.0' in metrics
    )
    for name in (
        "gateway_request_duration_seconds_bucket",
        "gateway_overhead_seconds_bucket",
        "gateway_pool_free_slots",
        "gateway_pool_in_flight_requests",
        'gateway_backend_in_flight_requests{backend="asic-0",pool="asic"} 0.0',
        "gateway_prompt_tokens_total",
        "gateway_completion_tokens_total",
    ):
        assert name in metrics


def test_every_request_gets_a_record_without_text(gw: GatewayServer) -> None:
    client = gw.client()
    client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=6)
    list(client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=6, stream=True))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=PROMPT)
    rows = gw.records(3)
    assert len(rows) == 3
    by_model = {r["model"]: r for r in rows}
    chat, streamed, missing = by_model[MODEL], by_model[BIG], by_model["gpt-nope"]
    assert (chat["route"], chat["pool"], chat["status"], chat["stream"]) == (
        "chat-8b-short",
        "asic",
        200,
        False,
    )
    assert chat["prompt_tokens"] > 0 and 0 < chat["completion_tokens"] <= 6
    assert streamed["stream"] and streamed["ttft_ms"] > 0 and streamed["completion_tokens"] > 0
    assert (missing["status"], missing["error"], missing["pool"]) == (404, "model_not_found", None)
    assert all(r["tenant"] == "anonymous" and r["slo_class"] for r in rows[:2])
    text = repr(rows)
    assert "compute-in-memory" not in text  # prompts are never stored


def test_slo_class_header_changes_the_route(gw: GatewayServer) -> None:
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=PROMPT, max_tokens=4, extra_headers={"x-slo-class": "batch"}
    )
    assert raw.headers["x-gateway-route"] == "chat-8b"
    with pytest.raises(openai.BadRequestError):
        gw.client().chat.completions.create(
            model=MODEL, messages=PROMPT, extra_headers={"x-slo-class": "platinum"}
        )


def test_prompt_estimate_calibrates_against_backend_usage(gw: GatewayServer) -> None:
    client = gw.client()
    for _ in range(5):
        client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2)
    assert gw.gateway.estimator.ratio(MODEL) != 1.0


def test_plain_http_clients_get_the_openai_error_shape(gw: GatewayServer) -> None:
    # A plain HTTP client sees the same OpenAI error shape as the SDK.
    with httpx.Client(base_url=gw.url) as http:
        response = http.post("/v1/embeddings", json={"model": EMBED, "input": 5})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"
