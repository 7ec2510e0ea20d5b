"""Answers: the reference at temperature 0 without noise, flipped at near ties by noise, sampled
above temperature 0, and now and then wrong at the profile's harmful rate."""

import json
from random import Random

import pytest

from simulator.answers import BENIGN, EXACT, HARMFUL, SAMPLED, Question, compose
from simulator.tokenizer import count_tokens
from simulator.words import concept, synonym

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


def _answer(question: Question, *, noise: float = 0.0, harmful: float = 0.0, seed: int = 0):
    return compose(question, noise=noise, harmful_rate=harmful, rng=Random(seed))


def _concepts(pieces) -> list:
    return [concept(piece.strip()) or piece.strip() for piece in pieces]


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


def _long_sample(seed: int | None = None) -> Question:
    """A 400-token answer sampled at 1.0: about 200 content words, enough that the model, as
    sure of its words as the real fleet's, samples another word somewhere."""
    return Question(
        model=MODEL, prompt_key="hi", limit=400, ignore_eos=True, temperature=1.0, seed=seed
    )


def test_sampling_is_reproducible_with_a_request_seed():
    sampled = _long_sample(seed=7)
    assert _answer(sampled, seed=1).text == _answer(sampled, seed=2).text
    greedy = _greedy("hi", limit=400, ignore_eos=True)
    assert _answer(sampled).text != _answer(greedy).text


def test_a_vanishing_temperature_samples_the_reference_text_instead_of_failing():
    tiny = Question(model=MODEL, prompt_key="hi", limit=1000, temperature=1.86e-54, seed=3)
    # As good as greedy decoding of the same noisy logits.
    assert _answer(tiny, noise=0.3).text == _answer(_greedy("hi"), noise=0.3).text


def test_sampling_without_a_seed_varies_between_requests():
    sampled = _long_sample()
    rng = Random(0)
    texts = {compose(sampled, noise=0.0, harmful_rate=0.0, rng=rng).text for _ in range(5)}
    assert len(texts) == 5


def test_a_sampled_answer_follows_the_reference_until_it_samples_another_word():
    sampled = Question(model=MODEL, prompt_key="story", limit=1000, temperature=0.7, seed=1)
    answer, reference = _answer(sampled), _answer(_greedy("story"))
    assert answer.precision == SAMPLED and answer.text != reference.text
    pairs = zip(reference.pieces, answer.pieces, strict=True)
    first = next(k for k, (a, b) in enumerate(pairs) if a != b)
    assert answer.pieces[:first] == reference.pieces[:first]
    # From its first other word it goes its own way (a real model's context differs from there).
    assert _strays(reference.pieces, answer.pieces, first)


def test_noise_flips_near_ties_at_about_a_fifth_of_its_level_per_content_word():
    rng = Random(3)
    flips = content = 0
    for i in range(400):
        answer = compose(_greedy(f"p{i}"), noise=0.1, harmful_rate=0.0, rng=rng)
        flips += answer.flips
        content += sum(concept(piece.strip()) is not None for piece in answer.pieces)
    assert 0.012 < flips / content < 0.028


def _strays(reference: tuple[str, ...], answer: tuple[str, ...], at: int) -> bool:
    """Whether `answer` leaves `reference` at `at` as the precision model says: every later
    content word of another concept, up to the end of a sentence in which one was redrawn."""
    redrawn = False
    for a, b in zip(reference[at + 1 :], answer[at + 1 :], strict=True):
        if concept(a.strip()) is not None:
            if concept(b.strip()) == concept(a.strip()):
                return False
            redrawn = True
        elif a != b:
            return False
        elif a == "." and redrawn:
            return True
    return True


def test_a_flip_puts_the_synonym_in_place_and_the_rest_of_its_sentence_strays():
    rng = Random(0)
    flipped = 0
    for i in range(100):
        reference = _answer(_greedy(f"p{i}"))
        noisy = compose(_greedy(f"p{i}"), noise=0.3, harmful_rate=0.0, rng=rng)
        pairs = list(zip(reference.pieces, noisy.pieces, strict=True))
        changed = [k for k, (a, b) in enumerate(pairs) if a != b]
        assert noisy.precision == (BENIGN if changed else EXACT)
        if not changed:
            continue
        flipped += 1
        first = changed[0]
        a, b = pairs[first]
        assert synonym(a.strip()).lower() == b.strip().lower()
        assert _strays(reference.pieces, noisy.pieces, first)
    assert 50 < flipped < 100


def test_agreement_falls_with_answer_length():
    def exact_share(length: int) -> float:
        rng = Random(5)
        answers = [
            compose(
                _greedy(f"q{i}", limit=length, ignore_eos=True), noise=0.03, harmful_rate=0, rng=rng
            )
            for i in range(400)
        ]
        return sum(answer.precision == EXACT for answer in answers) / len(answers)

    short, long = exact_share(20), exact_share(400)
    assert short > 0.9 > long + 0.2


def test_a_harmful_error_changes_the_concepts_of_one_sentence():
    rng = Random(0)
    for i in range(50):
        reference = _answer(_greedy(f"p{i}"))
        wrong = compose(_greedy(f"p{i}"), noise=0.0, harmful_rate=1.0, rng=rng)
        assert wrong.precision == HARMFUL
        assert wrong.completion_tokens == reference.completion_tokens
        differ = [
            k
            for k, (a, b) in enumerate(
                zip(_concepts(reference.pieces), _concepts(wrong.pieces), strict=True)
            )
            if a != b
        ]
        assert differ
        assert "." not in reference.pieces[differ[0] : differ[-1]]  # one sentence


def test_harmful_errors_happen_at_the_given_rate():
    rng = Random(3)
    answers = [
        compose(_greedy(f"p{i}", limit=32), noise=0.0, harmful_rate=0.05, rng=rng)
        for i in range(2000)
    ]
    share = sum(answer.precision == HARMFUL for answer in answers) / len(answers)
    assert share == pytest.approx(0.05, abs=0.015)


def test_logprobs_match_the_text_and_do_not_depend_on_how_many_alternatives_are_asked():
    few = _answer(_greedy("hi", top_logprobs=2), noise=0.3, seed=4)
    many = _answer(_greedy("hi", top_logprobs=20), noise=0.3, seed=4)
    assert few.text == many.text
    assert [entry.token for entry in few.logprobs] == list(few.pieces)
    for a, b in zip(few.logprobs, many.logprobs, strict=True):
        assert a.logprob == b.logprob <= 0
        assert len(a.top) == 2 and len(b.top) == 20 and a.top == b.top[:2]
        assert a.top[0] == (a.token, a.logprob)  # greedy: the emitted token ranks first
        values = [value for _, value in b.top]
        assert values == sorted(values, reverse=True)


def test_a_flipped_token_is_a_near_tie_in_the_references_logprobs():
    flips = 0
    for i in range(20):
        reference = _answer(_greedy(f"near {i}", top_logprobs=5))
        noisy = _answer(_greedy(f"near {i}", top_logprobs=5), noise=0.5, seed=i)
        pairs = zip(reference.pieces, noisy.pieces, strict=True)
        # Where it first leaves the reference: after that its context differs.
        at = next((k for k, (a, b) in enumerate(pairs) if a != b), None)
        if at is not None:
            assert noisy.pieces[at] == reference.logprobs[at].top[1][0]
            assert noisy.logprobs[at].top[0][0] == noisy.pieces[at]
            flips += 1
    assert flips > 10


def test_no_logprobs_unless_asked_and_none_for_tool_calls():
    assert _answer(_greedy("hi")).logprobs is None
    assert _answer(_greedy("w", tools=[WEATHER_TOOL], top_logprobs=3)).logprobs is None
    json_answer = _answer(_greedy("j", response_format={"type": "json_object"}, top_logprobs=1))
    assert [entry.token for entry in json_answer.logprobs] == list(json_answer.pieces)


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


def test_a_harmful_tool_call_changes_a_value_but_not_the_fields():
    rng = Random(0)
    changed = 0
    for i in range(30):
        question = _greedy(f"weather {i}", tools=[WEATHER_TOOL])
        reference = json.loads(_answer(question, noise=0.3).text)
        wrong = json.loads(compose(question, noise=0.3, harmful_rate=1.0, rng=rng).text)
        assert set(wrong) == set(reference)
        changed += wrong != reference
    assert changed == 30


def test_noise_never_flips_a_structured_answer():
    question = _greedy("j", response_format={"type": "json_object"})
    assert _answer(question, noise=2.0).text == _answer(question).text
