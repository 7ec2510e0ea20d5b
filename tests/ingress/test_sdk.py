"""What applications send every day, through the official openai client: async clients under
concurrency, streamed completions with usage, tools, JSON schemas, seeds, base64 embeddings, and
a clear OpenAI-shaped 400 for what a backend cannot honour."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import openai
import pytest

from harness.gateways import GatewayServer, run_gateway
from policies import EMBED, MODEL, fleet_policy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gw(sim_processes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    sims = sim_processes
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path_factory.mktemp("sdk")) as server:
        yield server


def async_client(gw: GatewayServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="test-key", max_retries=0)


def test_an_async_client_with_many_requests_in_flight(gw: GatewayServer) -> None:
    async def scenario() -> list:
        async with async_client(gw) as client:
            return await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"question {i}"}],
                        max_tokens=12,
                        temperature=0,
                    )
                    for i in range(24)
                )
            )

    answers = asyncio.run(scenario())
    assert len(answers) == 24
    assert all(a.choices[0].message.content and a.usage.completion_tokens <= 12 for a in answers)
    assert len({a.id for a in answers}) == 24


def test_streamed_completions_with_usage_in_the_last_chunk(gw: GatewayServer) -> None:
    chunks = list(
        gw.client().completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = gw.client().completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0
    )
    assert text == plain.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_chat_with_usage_and_a_tool_call(gw: GatewayServer) -> None:
    chunks = list(
        gw.client().chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    arguments = json.loads("".join(call.function.arguments or "" for call in calls))
    assert calls[0].function.name == "get_weather"
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


def test_tools_and_tool_choice(gw: GatewayServer) -> None:
    client = gw.client()
    called = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required"
    )
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    json.loads(choice.message.tool_calls[0].function.arguments)
    prose = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=10
    )
    assert prose.choices[0].message.tool_calls is None and prose.choices[0].message.content


def test_a_json_schema_response_format(gw: GatewayServer) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
        "required": ["answer", "score"],
    }
    completion = gw.client().chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "graded", "schema": schema, "strict": True},
        },
        max_tokens=200,
    )
    value = json.loads(completion.choices[0].message.content)
    assert set(value) == {"answer", "score"} and isinstance(value["score"], float | int)


def test_a_seed_makes_sampled_answers_repeat(gw: GatewayServer) -> None:
    client = gw.client()

    def sampled(seed: int) -> str:
        # Hot and long: a model as sure as the real fleet's repeats most short answers at 0.9
        # whatever the seed (docs/simulator.md, temperature).
        completion = client.chat.completions.create(
            model=MODEL, messages=ASK, temperature=1.5, seed=seed, max_tokens=200
        )
        return completion.choices[0].message.content or ""

    assert sampled(7) == sampled(7)
    assert {sampled(7), sampled(8), sampled(9)} != {sampled(7)}


def test_base64_embeddings_decode_to_the_float_vectors(gw: GatewayServer) -> None:
    client = gw.client()
    packed = client.embeddings.create(model=EMBED, input=["energy", "memory"])  # base64
    floats = client.embeddings.create(
        model=EMBED, input=["energy", "memory"], encoding_format="float"
    )
    assert len(packed.data) == 2
    for a, b in zip(packed.data, floats.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)


def test_an_option_the_backend_cannot_honour_is_a_clear_400(gw: GatewayServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model=MODEL, messages=ASK, n=2, max_tokens=5)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == "n"
    assert "n=1" in error["message"]
