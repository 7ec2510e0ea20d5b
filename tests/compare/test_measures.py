"""Comparators: reading answers and measuring how two of them differ (pure, no servers)."""

from __future__ import annotations

import base64
import random
from array import array

import orjson
import pytest

from gateway.compare.answers import Answer, ToolCall, read_body, read_stream
from gateway.compare.measures import (
    COMPARATORS,
    comparator,
    compare,
    edit_distance,
    first_divergence,
    lcs_length,
    normalize,
    numbers,
    rouge_l,
    structural_diff,
    tokens,
)


def lcs_table(a: list[str], b: list[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def levenshtein_table(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def test_bit_parallel_lcs_and_edit_distance_agree_with_the_textbook_tables() -> None:
    rng = random.Random(5)
    for _ in range(300):
        a = [rng.choice("abcde") for _ in range(rng.randrange(0, 90))]
        b = [rng.choice("abcde") for _ in range(rng.randrange(0, 90))]
        assert lcs_length(a, b) == lcs_table(a, b)
        assert edit_distance(a, b) == levenshtein_table(a, b)


def test_rouge_l_is_one_for_equal_zero_for_disjoint_and_f1_between() -> None:
    assert rouge_l(["a", "b"], ["a", "b"]) == 1.0
    assert rouge_l(["a", "b"], ["c", "d"]) == 0.0
    # LCS 2 of 4 primary and 2 candidate tokens: precision 1, recall 0.5.
    assert rouge_l(list("abcd"), list("ad")) == pytest.approx(2 / 3)


def test_identical_answers_match_on_every_measure() -> None:
    answer = Answer(text="The array holds charge.")
    diff = compare(answer, Answer(text="The array holds charge."))
    assert diff.exact_match and diff.normalized_match
    assert (diff.similarity, diff.similarity_method) == (1.0, "rouge_l")
    assert diff.first_divergence is None and diff.length_ratio == 1.0
    assert diff.json_diff is None and diff.embedding_cosine is None
    # Matching answers put every word of the primary's at risk: the judge needs how many.
    assert diff.reference_words == 5  # four words and a full stop


def test_normalized_match_ignores_case_punctuation_and_whitespace() -> None:
    diff = compare(Answer(text="Hello,  world!"), Answer(text="hello world"))
    assert diff.exact_match is False and diff.normalized_match is True
    assert normalize("  A\tB… c. ") == "a b c"


def test_first_divergence_is_the_first_differing_word_token() -> None:
    primary = "the cell holds a charge of one unit"
    candidate = "the cell holds a signal of one unit and more"
    diff = compare(Answer(text=primary), Answer(text=candidate))
    assert diff.first_divergence == 4
    assert diff.reference_words == 8  # the primary's, whichever answer is longer
    assert diff.length_ratio == pytest.approx(10 / 8)
    assert first_divergence(["a", "b"], ["a", "b", "c"]) == 2  # a prefix diverges at its end
    assert tokens("it's 3.5 W.") == ["it", "'", "s", "3", ".", "5", "W", "."]


def test_numbers_are_read_by_value_and_a_lists_ordinals_are_not_numbers() -> None:
    assert numbers("4 kilograms is 4,000 grams.") == {"4": 1, "4000": 1}
    assert numbers("4000.0 g, or 4,000,000 mg at 1.50 each") == {"4000": 1, "4000000": 1, "1.5": 1}
    assert numbers("1. Mix\n2) Bake for 30 minutes\n  3. Serve 30") == {"30": 2}
    assert numbers("version 1.2.3, ratio 4,5") == {"1.2.3": 1, "4,5": 1}
    assert not numbers("four kilograms")  # numbers in words are not read


def test_a_candidate_stating_a_number_the_primary_does_not_is_marked() -> None:
    primary = Answer(text="4 kilograms is 4000 grams.")
    changed = compare(primary, Answer(text="4 kilograms is 4001 grams."))
    assert changed.new_number is True
    # A rewording that keeps the numbers, or leaves the question's out, states nothing new.
    for text in ("There are 4,000 grams in 4 kilograms.", "4000 grams."):
        assert compare(primary, Answer(text=text)).new_number is False
    assert compare(Answer(text="no number"), Answer(text="none either")).new_number is False
    # Deep in a long answer, one changed number is as plain as in a short one.
    steps = " ".join(f"Step {n}: stir the pot for a while." for n in range(1, 40))
    long = steps + " Bake at 180 degrees for 25 minutes."
    changed = long.replace("for 25 minutes", "for 35 minutes")  # 35 numbers a step too
    assert compare(Answer(text=long), Answer(text=changed)).new_number is True
    assert compare(primary, Answer(text=None)).new_number is None  # no text: not measured


def test_edit_ratio_can_replace_rouge_l() -> None:
    diff = compare(Answer(text="a b c d"), Answer(text="a x c d"), ["edit_ratio"])
    assert (diff.similarity, diff.similarity_method) == (0.75, "edit_ratio")
    assert diff.exact_match is None  # only the comparators asked for run


def test_structural_diff_names_missing_extra_and_changed_paths() -> None:
    primary = {"a": 1, "b": {"c": [1, 2, 3], "d": True}, "e": "x"}
    candidate = {"a": 1.0, "b": {"c": [1, 5], "d": 1}, "f": None}
    assert structural_diff(primary, candidate) == {
        "missing": ["$.b.c[2]", "$.e"],
        "extra": ["$.f"],
        "changed": ["$.b.c[1]", "$.b.d"],
    }


def test_json_answers_get_a_structural_diff_and_invalid_json_is_named() -> None:
    diff = compare(Answer(text='{"score": 0.5, "tags": []}'), Answer(text='{"score": 0.7}'))
    assert diff.json_diff == {"missing": ["$.tags"], "extra": [], "changed": ["$.score"]}
    broken = compare(Answer(text='{"score": 0.5}'), Answer(text='{"score": 0.'))
    assert broken.json_diff is not None and broken.json_diff["invalid"] == "candidate"
    assert compare(Answer(text="plain"), Answer(text="prose")).json_diff is None


def chat_body(message: dict, usage: tuple[int, int] = (5, 3)) -> bytes:
    return orjson.dumps(
        {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
        }
    )


def test_tool_calls_are_read_and_diffed_by_name_and_arguments() -> None:
    def call(name: str, arguments: dict) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}
        ]}  # fmt: skip

    primary = read_body(chat_body(call("lookup", {"city": "Oslo", "days": 3})))
    candidate = read_body(chat_body(call("lookup", {"city": "Bergen", "days": 3})))
    assert primary.tool_calls == (ToolCall("lookup", '{"city":"Oslo","days":3}'),)
    assert (primary.prompt_tokens, primary.completion_tokens) == (5, 3)
    diff = compare(primary, candidate)
    assert diff.json_diff == {"missing": [], "extra": [], "changed": ["$[0].arguments.city"]}
    assert diff.exact_match is False


def sse(*docs: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def test_a_stream_is_read_back_into_its_text_tool_calls_and_usage() -> None:
    data = sse(
        {"choices": [{"delta": {"role": "assistant", "content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
    )
    # Events split across network reads are still whole once joined.
    answer = read_stream(data[:10] + data[10:])
    assert (answer.text, answer.finish_reason, answer.completion_tokens) == ("Hello", "stop", 2)
    calls = read_stream(
        sse(
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}}]},
            {
                "choices": [
                    {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}
                ]
            },
        )
    )
    assert calls.tool_calls == (ToolCall("f", "{}"),)
    completions = read_stream(
        sse({"choices": [{"text": "Once"}]}, {"choices": [{"text": " more"}]})
    )
    assert completions.text == "Once more"


def test_embeddings_compare_by_cosine_including_base64_vectors() -> None:
    vector = [0.6, 0.8, 0.0]
    packed = base64.b64encode(array("f", [0.8, 0.6, 0.0]).tobytes()).decode()
    primary = read_body(orjson.dumps({"object": "list", "data": [{"embedding": vector}]}))
    candidate = read_body(orjson.dumps({"object": "list", "data": [{"embedding": packed}]}))
    diff = compare(primary, candidate)
    assert diff.embedding_cosine == pytest.approx(0.96, abs=1e-6)
    assert diff.exact_match is None and diff.similarity is None
    assert compare(primary, primary).embedding_cosine == pytest.approx(1.0)


def test_a_plugged_in_comparator_adds_its_own_measure() -> None:
    registry = dict(COMPARATORS)

    @comparator("shouting")
    def shouting(primary: Answer, candidate: Answer) -> dict:
        return {"candidate_shouts": (candidate.text or "").isupper()}

    registry["shouting"] = COMPARATORS.pop("shouting")
    diff = compare(Answer(text="hi"), Answer(text="HI"), ["exact", "shouting"], registry)
    assert diff.exact_match is False and diff.measures == {"candidate_shouts": True}
    assert "shouting" not in COMPARATORS
