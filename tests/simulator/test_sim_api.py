"""The OpenAI-compatible surface, exercised with the official `openai` client."""

import json
import math

import httpx
import openai
import pytest

from harness.metrics import metric_value
from harness.simulators import start_simulator
from simulator.tokenizer import count_tokens

CHAT = "llama-3.1-8b-instruct"
EMBEDDING = "bge-large-en-v1.5"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
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


@pytest.fixture
def client(gpu):
    with openai.OpenAI(base_url=gpu.base_url, api_key="unused", max_retries=0) as client:
        yield client


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_chat_answers_with_exact_usage(client):
    reply = client.chat.completions.create(
        model=CHAT, messages=_messages("What is a slot?"), temperature=0
    )
    content = reply.choices[0].message.content
    # 3 tokens of template per message, 3 to prime the reply.
    expected_prompt = 3 + count_tokens("Be brief.") + 3 + count_tokens("What is a slot?") + 3
    assert reply.usage.prompt_tokens == expected_prompt
    assert reply.usage.completion_tokens == count_tokens(content)
    assert reply.usage.total_tokens == expected_prompt + count_tokens(content)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == CHAT


def test_a_prompt_of_digits_that_are_not_ascii_is_answered(client):
    # "²" and "٣" are digits to str.isdigit but are words of text, not token ids.
    reply = client.chat.completions.create(
        model=CHAT, messages=_messages("²٣ and 42"), temperature=0, max_tokens=4
    )
    assert (
        reply.usage.prompt_tokens
        == 3 + count_tokens("Be brief.") + 3 + count_tokens("²٣ and 42") + 3
    )


def test_max_tokens_caps_the_answer_with_finish_reason_length(client):
    reply = client.chat.completions.create(
        model=CHAT, messages=_messages("Tell me a long story."), temperature=0, max_tokens=7
    )
    assert reply.usage.completion_tokens == 7
    assert reply.choices[0].finish_reason == "length"


def test_streamed_chat_sends_one_chunk_per_token_and_the_same_text(client):
    messages = _messages("Stream this.")
    plain = client.chat.completions.create(model=CHAT, messages=messages, temperature=0)
    stream = client.chat.completions.create(
        model=CHAT,
        messages=messages,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    text = "".join(c.choices[0].delta.content for c in token_chunks)
    assert text == plain.choices[0].message.content
    assert len(token_chunks) == plain.usage.completion_tokens
    assert token_chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens


def test_text_completions_plain_and_streamed_agree(client):
    plain = client.completions.create(model=CHAT, prompt="Once upon a time", temperature=0)
    assert plain.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions
    assert plain.choices[0].finish_reason == "length"
    streamed = client.completions.create(
        model=CHAT, prompt="Once upon a time", temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text


def test_embeddings_are_unit_vectors_of_the_model_dimension(client):
    result = client.embeddings.create(model=EMBEDDING, input=["first text", "second text"])
    assert [item.index for item in result.data] == [0, 1]
    for item in result.data:
        assert len(item.embedding) == 1024
        assert math.isclose(sum(x * x for x in item.embedding), 1.0, rel_tol=1e-4)
    assert result.usage.prompt_tokens == count_tokens("first text") + count_tokens("second text")


def test_embeddings_as_floats_and_as_base64_are_the_same_vector(client):
    floats = client.embeddings.create(model=EMBEDDING, input="same", encoding_format="float")
    packed = client.embeddings.create(model=EMBEDDING, input="same")  # the client asks base64
    assert packed.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)


def test_models_lists_every_served_model(client):
    assert {model.id for model in client.models.list()} == {
        CHAT,
        "llama-3.1-70b-instruct",
        EMBEDDING,
    }
    assert client.models.retrieve(CHAT).id == CHAT


def test_unknown_model_gets_404_in_openai_error_shape(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-9", messages=_messages("hi"))
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "model_not_found"
    assert "gpt-9" in error["message"]


def test_a_model_the_device_does_not_serve_gets_404(cim):
    with openai.OpenAI(base_url=cim.base_url, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model=EMBEDDING, input="hi")
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="llama-3.1-70b-instruct", messages=_messages("x"))


def test_prompt_over_max_context_gets_400_context_length_exceeded(asic):
    with (
        openai.OpenAI(base_url=asic.base_url, api_key="unused", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client.chat.completions.create(model=CHAT, messages=_messages("word " * 9000))
    error = caught.value.body
    assert (error["code"], error["param"], error["type"]) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert "8192" in error["message"]


def test_prompt_plus_max_tokens_over_max_context_gets_400(asic):
    with (
        openai.OpenAI(base_url=asic.base_url, api_key="unused", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client.completions.create(model=CHAT, prompt="word " * 8000, max_tokens=500)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert caught.value.body["param"] == "prompt"


def test_json_mode_returns_a_json_object(client):
    reply = client.chat.completions.create(
        model=CHAT,
        messages=_messages("Reply in JSON."),
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_tool_call_arguments_are_valid_json_for_the_schema(client):
    reply = client.chat.completions.create(
        model=CHAT, messages=_messages("Weather in Paris?"), temperature=0, tools=[WEATHER_TOOL]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["unit"] in ("celsius", "fahrenheit")
    assert isinstance(arguments["city"], str)


def test_streamed_tool_call_assembles_into_the_same_arguments(client):
    kwargs = {"model": CHAT, "messages": _messages("Weather?"), "temperature": 0}
    plain = client.chat.completions.create(**kwargs, tools=[WEATHER_TOOL])
    stream = client.chat.completions.create(**kwargs, tools=[WEATHER_TOOL], stream=True)
    calls = [
        c.choices[0].delta.tool_calls for c in stream if c.choices and c.choices[0].delta.tool_calls
    ]
    assert calls[0][0].function.name == "get_weather"
    arguments = "".join(call[0].function.arguments or "" for call in calls)
    assert arguments == plain.choices[0].message.tool_calls[0].function.arguments


def test_health_answers_ok(gpu):
    response = httpx.get(f"{gpu.url}/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_answers_name_the_device_in_a_header(gpu):
    response = httpx.post(
        f"{gpu.base_url}/chat/completions",
        json={"model": CHAT, "messages": _messages("hi"), "max_tokens": 2},
    )
    assert response.headers["x-sim-device"] == "0"


def test_unknown_path_gets_404_wrong_method_405_and_malformed_json_400(gpu):
    missing = httpx.post(f"{gpu.base_url}/nothing", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_url"
    assert httpx.get(f"{gpu.base_url}/chat/completions").status_code == 405
    malformed = httpx.post(f"{gpu.base_url}/chat/completions", content=b"{not json")
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"


def test_a_chat_model_on_the_embeddings_endpoint_gets_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=CHAT, input="hi")
    assert caught.value.body["code"] == "model_not_supported"


def test_with_an_api_key_every_endpoint_but_the_fault_switch_wants_it():
    with start_simulator("gpu", speed=1000.0, api_key="sim-key") as sim:
        good = {"authorization": "Bearer sim-key"}
        body = {"model": CHAT, "messages": _messages("hi"), "max_tokens": 2}
        for headers in ({}, {"authorization": "Bearer other"}, {"authorization": "sim-key"}):
            chat = httpx.post(f"{sim.base_url}/chat/completions", json=body, headers=headers)
            assert chat.status_code == 401
            assert chat.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{sim.url}/health", headers=headers).status_code == 401
            assert httpx.get(f"{sim.url}/metrics", headers=headers).status_code == 401
        assert httpx.get(f"{sim.url}/admin/faults").status_code == 200
        assert httpx.get(f"{sim.url}/health", headers=good).status_code == 200
        answer = httpx.post(f"{sim.base_url}/chat/completions", json=body, headers=good)
        assert answer.status_code == 200, answer.text
        with openai.OpenAI(base_url=sim.base_url, api_key="sim-key", max_retries=0) as client:
            client.embeddings.create(model=EMBEDDING, input="hi")
        refused = sim.metrics()  # the test's own client sends the key
    assert (
        metric_value(refused, "sim_unauthorized_requests_total", path="/v1/chat/completions") == 3
    )
    assert metric_value(refused, "sim_unauthorized_requests_total", path="/metrics") == 3
