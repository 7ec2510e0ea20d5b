"""The Responses API through the official openai client: plain and streamed, with instructions,
function tools and JSON formats, routed, recorded and shadowed as chat completions are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from llamacpp import llama_policy, llama_server
from shadowworld import shadow_policy, shadow_rows

from harness.gateways import GatewayServer, run_gateway
from policies import MODEL, fleet_policy

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def gw(sim_processes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    sims = sim_processes
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path_factory.mktemp("responses")) as server:
        yield server


def test_a_response_is_the_chat_answer_in_the_responses_shape(gw: GatewayServer) -> None:
    client = gw.client()
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        instructions="Answer briefly.",
        input="What is a compute-in-memory device?",
        max_output_tokens=24,
        temperature=0,
    )
    response = raw.parse()
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is a compute-in-memory device?"},
        ],
        max_tokens=24,
        temperature=0,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert raw.headers["x-gateway-route"] == "chat-8b-short"
    status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    assert response.status == status


def test_a_streamed_response_sends_the_typed_events_in_order(gw: GatewayServer) -> None:
    events = list(
        gw.client().responses.create(
            model=MODEL, input="Tell me about analog arrays.", max_output_tokens=30, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert deltas and deltas == events[-4].text == done.output_text
    assert done.usage.output_tokens == 30 and done.status == "incomplete"


def test_a_function_call_comes_back_as_a_function_call_item(gw: GatewayServer) -> None:
    client = gw.client()
    response = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    # The conversation goes on with the call and its output as input items.
    follow = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "4 °C, rain"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=10,
    )  # fmt: skip
    assert follow.output_text


def test_a_json_schema_text_format(gw: GatewayServer) -> None:
    response = gw.client().responses.create(
        model=MODEL,
        input="Grade this answer.",
        text={
            "format": {
                "type": "json_schema",
                "name": "grade",
                "schema": {
                    "type": "object",
                    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
                    "required": ["score"],
                },
            }
        },
        max_output_tokens=50,
    )
    assert 1 <= json.loads(response.output_text)["score"] <= 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "reasoning"}]}, "input[0]"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
    ],
)
def test_what_the_gateway_cannot_do_is_a_clear_400(gw: GatewayServer, fields, param) -> None:
    body = {"model": MODEL, "input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        gw.client().post("/responses", body=body, cast_to=object)
    assert refused.value.body["param"] == param


def test_responses_are_shadowed_and_recorded_as_chat(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        gw.client().responses.create(
            model=MODEL, input="hello", max_output_tokens=12, temperature=0
        )
        (row,) = shadow_rows(gw, 1)
        (record,) = gw.records(1)
    assert record["endpoint"] == "chat" and record["status"] == 200
    assert row["candidate_pool"] == "cim" and row["exact_match"] is not None


@pytest.mark.parametrize("stream", [False, True])
def test_llamacpps_cached_prompt_tokens_and_timings_reach_a_responses_client(
    tmp_path: Path, stream: bool
) -> None:
    with llama_server() as server, run_gateway(llama_policy(server.url), tmp_path) as gw:
        client = gw.client()
        asked = {"model": MODEL, "input": "Say something.", "max_output_tokens": 12}
        if stream:
            *_, completed = client.responses.create(**asked, stream=True)
            assert completed.type == "response.completed"
            response, extra = completed.response, completed.model_extra
        else:
            response = client.responses.create(**asked)
            extra = response.model_extra
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 31
    assert (extra or {})["timings"]["predicted_n"] == 12
    assert "\ufffd" in response.output_text
