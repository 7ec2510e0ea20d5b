"""Answers: deterministic at temperature 0, sampled above it, deviating at the profile's rate."""

import json
from random import Random

import pytest

from simulator.answers import Question, compose
from simulator.tokenizer import count_tokens

MODEL = "llama-3.1-8b-instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
            },
            "required": ["city"],
        },
    },
}


def _greedy(prompt: str, **fields) -> Question:
    return Question(
        model=MODEL, prompt_key=prompt, limit=fields.pop("limit", 1000), temperature=0, **fields
    )


def _answer(question: Question, *, rate: float = 0.0, seed: int = 0):
    return compose(question, deviation_rate=rate, rng=Random(seed))


def test_temperature_zero_gives_the_same_text_whatever_the_process_seed():
    assert _answer(_greedy("hi"), seed=1).text == _answer(_greedy("hi"), seed=2).text


def test_different_prompts_and_models_get_different_text():
    assert _answer(_greedy("hi")).text != _answer(_greedy("hello")).text
    other = Question(model="llama-3.1-70b-instruct", prompt_key="hi", limit=1000, temperature=0)
    assert _answer(other).text != _answer(_greedy("hi")).text


def test_natural_lengths_vary_between_twenty_and_four_hundred_tokens():
    lengths = [_answer(_greedy(f"prompt {i}")).completion_tokens for i in range(300)]
    assert min(lengths) >= 20 and max(lengths) <= 400
    assert len(set(lengths)) > 50


def test_max_tokens_cuts_the_answer_with_finish_reason_length():
    full = _answer(_greedy("hi"))
    cut = _answer(_greedy("hi", limit=5))
    assert cut.completion_tokens == 5 and cut.finish_reason == "length"
    assert full.finish_reason == "stop"
    assert full.text.startswith(cut.text)


def test_ignore_eos_and_min_tokens_set_the_length():
    assert _answer(_greedy("hi", limit=700, ignore_eos=True)).completion_tokens == 700
    assert _answer(_greedy("hi", min_tokens=450)).completion_tokens == 450


def test_token_count_of_the_text_equals_completion_tokens():
    answer = _answer(_greedy("count me"))
    assert count_tokens(answer.text) == answer.completion_tokens


def test_sampling_is_reproducible_with_a_request_seed():
    sampled = Question(model=MODEL, prompt_key="hi", limit=200, temperature=1.0, seed=7)
    assert _answer(sampled, seed=1).text == _answer(sampled, seed=2).text
    assert _answer(sampled).text != _answer(_greedy("hi", limit=200)).text


def test_a_vanishing_temperature_samples_the_reference_text_instead_of_failing():
    tiny = Question(model=MODEL, prompt_key="hi", limit=1000, temperature=1.86e-54, seed=3)
    sampled, greedy = _answer(tiny).pieces, _answer(_greedy("hi")).pieces
    common = min(len(sampled), len(greedy))
    assert common > 0 and sampled[:common] == greedy[:common]


def test_sampling_without_a_seed_varies_between_requests():
    sampled = Question(model=MODEL, prompt_key="hi", limit=200, temperature=1.0)
    rng = Random(0)
    texts = {compose(sampled, deviation_rate=0, rng=rng).text for _ in range(5)}
    assert len(texts) == 5


def test_deviations_happen_at_the_given_rate():
    rng = Random(3)
    deviated = [
        compose(_greedy(f"p{i}", limit=32), deviation_rate=0.15, rng=rng).deviated
        for i in range(2000)
    ]
    assert sum(deviated) / len(deviated) == pytest.approx(0.15, abs=0.03)


def test_a_deviating_answer_keeps_its_length_and_differs_from_some_token_on():
    rng = Random(0)
    for i in range(50):
        reference = _answer(_greedy(f"p{i}", limit=64))
        deviating = compose(_greedy(f"p{i}", limit=64), deviation_rate=1.0, rng=rng)
        assert deviating.completion_tokens == reference.completion_tokens
        pairs = zip(reference.pieces, deviating.pieces, strict=True)
        split = next(k for k, (a, b) in enumerate(pairs) if a != b)
        assert reference.pieces[:split] == deviating.pieces[:split]


def test_json_mode_returns_a_json_object():
    answer = _answer(_greedy("give json", response_format={"type": "json_object"}))
    assert isinstance(json.loads(answer.text), dict)
    assert count_tokens(answer.text) == answer.completion_tokens


def test_json_schema_mode_follows_the_schema():
    schema = WEATHER_TOOL["function"]["parameters"]
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    value = json.loads(_answer(_greedy("weather", response_format=response_format)).text)
    assert set(value) == {"city", "unit", "days", "hourly"}
    assert value["unit"] in ("celsius", "fahrenheit")
    assert 1 <= value["days"] <= 7


def test_tool_call_arguments_are_valid_json_built_from_the_schema():
    answer = _answer(_greedy("weather in Paris", tools=[WEATHER_TOOL]))
    assert answer.tool_call.name == "get_weather"
    assert answer.finish_reason == "tool_calls"
    arguments = json.loads(answer.text)
    assert isinstance(arguments["city"], str)
    assert isinstance(arguments["hourly"], bool)


def test_tool_choice_none_answers_in_prose():
    answer = _answer(_greedy("weather", tools=[WEATHER_TOOL], tool_choice="none"))
    assert answer.tool_call is None


def test_a_deviating_tool_call_changes_a_value_but_not_the_fields():
    rng = Random(0)
    changed = 0
    for i in range(30):
        question = _greedy(f"weather {i}", tools=[WEATHER_TOOL])
        reference = json.loads(_answer(question).text)
        deviating = json.loads(compose(question, deviation_rate=1.0, rng=rng).text)
        assert set(deviating) == set(reference)
        changed += deviating != reference
    assert changed == 30
