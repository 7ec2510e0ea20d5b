"""Tolerance from logprobs: reading the model's tokens, near ties and top-k KL (pure)."""

from __future__ import annotations

import math

import orjson
import pytest
from llamacpp import captured

from gateway.compare.answers import Answer, TokenChoice, read_body, read_stream
from gateway.compare.measures import (
    DEFAULT_COMPARATORS,
    compare,
    mean_top_k_kl,
    near_tie,
    text_near_tie,
    token_divergence,
    top_k_kl,
)

ln = math.log


def entry(token: str, logprob: float, *top: tuple[str, float]) -> dict:
    """A chat `logprobs.content` entry as OpenAI and vLLM write it."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top],
    }


def chat_body(text: str, logprobs: object) -> bytes:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    return orjson.dumps({"object": "chat.completion", "choices": [choice | {"logprobs": logprobs}]})


def sse(*docs: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def choice(token: str, logprob: float, *top: tuple[str, float]) -> TokenChoice:
    return TokenChoice(token, logprob, tuple(top))


# Reading -----------------------------------------------------------------------------------


def test_a_chat_body_reads_each_token_its_logprob_and_its_top_alternatives() -> None:
    content = [
        entry("Hi", -0.1, ("Hi", -0.1), ("Hello", -2.5)),
        entry("!", -0.7, ("!", -0.7), (".", -0.9), (",", -3.0)),
    ]
    answer = read_body(chat_body("Hi!", {"content": content, "refusal": None}))
    assert answer.text == "Hi!"
    assert answer.tokens == (
        TokenChoice("Hi", -0.1, (("Hi", -0.1), ("Hello", -2.5))),
        TokenChoice("!", -0.7, (("!", -0.7), (".", -0.9), (",", -3.0))),
    )
    # Without top_logprobs in the request, each token comes without alternatives.
    bare = read_body(chat_body("Hi", {"content": [{"token": "Hi", "logprob": 0}]}))
    assert bare.tokens == (TokenChoice("Hi", 0.0, ()),)


def test_a_stream_appends_each_chunks_logprobs_in_order() -> None:
    data = sse(
        {"choices": [{"delta": {"role": "assistant"}, "logprobs": None}]},
        {
            "choices": [
                {
                    "delta": {"content": "The sky"},
                    "logprobs": {"content": [entry("The", -0.2, ("The", -0.2), ("A", -1.8))]}
                    | {"refusal": None},
                }
            ]
        },
        {
            "choices": [
                {
                    "delta": {"content": " is"},
                    "logprobs": {
                        "content": [
                            entry(" sky", -0.05, (" sky", -0.05)),
                            entry(" is", -0.01, (" is", -0.01), (" was", -4.6)),
                        ]
                    },
                }
            ]
        },
        {"choices": [{"delta": {}, "logprobs": {"content": []}, "finish_reason": "stop"}]},
    )
    answer = read_stream(data)
    assert [(c.token, c.logprob) for c in answer.tokens] == [
        ("The", -0.2),
        (" sky", -0.05),
        (" is", -0.01),
    ]
    assert answer.tokens[0].top == (("The", -0.2), ("A", -1.8))
    assert answer.tokens[2].top == ((" is", -0.01), (" was", -4.6))
    assert (answer.text, answer.finish_reason) == ("The sky is", "stop")


def test_a_legacy_completion_reads_parallel_token_lists_in_a_body_and_a_stream() -> None:
    logprobs = {
        "tokens": ["Once", " upon"],
        "token_logprobs": [-0.3, -0.02],
        "top_logprobs": [{"Once": -0.3, "There": -1.5}, {" upon": -0.02}],
        "text_offset": [0, 4],
    }
    body = orjson.dumps(
        {"object": "text_completion", "choices": [{"text": "Once upon", "logprobs": logprobs}]}
    )
    expected = (
        TokenChoice("Once", -0.3, (("Once", -0.3), ("There", -1.5))),
        TokenChoice(" upon", -0.02, ((" upon", -0.02),)),
    )
    assert read_body(body).tokens == expected
    stream = sse(
        {
            "choices": [
                {
                    "text": "Once",
                    "logprobs": {
                        "tokens": ["Once"],
                        "token_logprobs": [-0.3],
                        "top_logprobs": [{"Once": -0.3, "There": -1.5}],
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "text": " upon",
                    "logprobs": {
                        "tokens": [" upon"],
                        "token_logprobs": [-0.02],
                        "top_logprobs": [{" upon": -0.02}],
                    },
                }
            ]
        },
    )
    assert read_stream(stream).tokens == expected
    # An echoed prompt's first token has no logprob and is left out; no top lists at all is fine.
    echoed = {"tokens": ["<s>", "Once"], "token_logprobs": [None, -0.3], "top_logprobs": None}
    answer = read_body(orjson.dumps({"choices": [{"text": "Once", "logprobs": echoed}]}))
    assert answer.tokens == (TokenChoice("Once", -0.3, ()),)


@pytest.mark.parametrize(
    "logprobs",
    [
        "not an object",
        ["a", "list"],
        {"content": "text"},
        {"content": [1, None, "x", {"token": 5, "logprob": -1}, {"token": "a"}]},
        {"content": [{"token": "a", "logprob": "-1"}, {"token": "b", "logprob": True}]},
        {"tokens": "ab", "token_logprobs": [-1, -2]},
        {"tokens": ["a", "b"], "token_logprobs": {"a": -1}},
        {"tokens": [1, None], "token_logprobs": [-1, -2]},
    ],
)
def test_a_malformed_logprobs_block_reads_as_no_tokens(logprobs: object) -> None:
    answer = read_body(chat_body("Hi", logprobs))
    assert answer.text == "Hi" and answer.tokens == ()
    chunk = {"choices": [{"delta": {"content": "Hi"}, "logprobs": logprobs}]}
    assert read_stream(sse(chunk)).tokens == ()


def test_malformed_entries_and_alternatives_are_skipped_and_the_rest_is_kept() -> None:
    alternatives = [{"token": "b"}, "x", {"token": "c", "logprob": -2}]
    content = [
        {"token": "a", "logprob": None},
        {"token": "b", "logprob": -1.0, "top_logprobs": alternatives},
        {"token": "d", "logprob": -0.5, "top_logprobs": {"d": -0.5}},
    ]
    answer = read_body(chat_body("abd", {"content": content}))
    assert answer.tokens == (TokenChoice("b", -1.0, (("c", -2.0),)), TokenChoice("d", -0.5, ()))


# Near ties ---------------------------------------------------------------------------------


PRIMARY = (
    choice("The", ln(0.9), ("The", ln(0.9)), ("A", ln(0.05))),
    choice(" cat", ln(0.55), (" cat", ln(0.55)), (" dog", ln(0.4))),
    choice(" sat", ln(0.8), (" sat", ln(0.8))),
)


def test_a_divergence_to_one_of_the_primarys_top_alternatives_is_a_near_tie() -> None:
    candidate = (
        choice("The", ln(0.85), ("The", ln(0.85)), ("A", ln(0.1))),
        choice(" dog", ln(0.5), (" dog", ln(0.5)), (" cat", ln(0.45))),
        choice(" ran", ln(0.7), (" ran", ln(0.7))),
    )
    diff = compare(Answer(tokens=PRIMARY), Answer(tokens=candidate), ["near_tie"])
    assert (diff.token_divergence, diff.near_tie) == (1, True)
    assert diff.measures == {}


def test_a_divergence_outside_the_primarys_top_alternatives_is_not_a_near_tie() -> None:
    candidate = (PRIMARY[0], choice(" bird", ln(0.6), (" bird", ln(0.6)), (" cat", ln(0.3))))
    diff = compare(Answer(tokens=PRIMARY), Answer(tokens=candidate), ["near_tie"])
    assert (diff.token_divergence, diff.near_tie) == (1, False)
    # The candidate listing the primary's token does not make it a near tie: the primary's
    # own alternatives decide.
    assert near_tie(PRIMARY, candidate, 1) is False


def test_near_tie_is_none_without_a_divergence_or_without_top_alternatives() -> None:
    same = compare(Answer(tokens=PRIMARY), Answer(tokens=PRIMARY), ["near_tie"])
    assert (same.token_divergence, same.near_tie) == (None, None)
    bare = tuple(TokenChoice(c.token, c.logprob) for c in PRIMARY)
    other = (*bare[:1], TokenChoice(" dog", ln(0.5)), *bare[2:])
    no_top = compare(Answer(tokens=bare), Answer(tokens=other), ["near_tie"])
    assert (no_top.token_divergence, no_top.near_tie) == (1, None)
    # A candidate that stops early diverges where it stops, with no token there to judge.
    short = compare(Answer(tokens=PRIMARY), Answer(tokens=PRIMARY[:2]), ["near_tie"])
    assert (short.token_divergence, short.near_tie) == (2, None)
    assert token_divergence(PRIMARY, PRIMARY[:2]) == 2
    # Answers without logprobs are not measured at all.
    plain = compare(Answer(text="The cat"), Answer(text="The dog"), ["near_tie"])
    assert (plain.token_divergence, plain.near_tie) == (None, None)
    one_side = compare(Answer(tokens=PRIMARY), Answer(text="x"), ["near_tie"])
    assert (one_side.token_divergence, one_side.near_tie) == (None, None)


# KL ----------------------------------------------------------------------------------------


def test_kl_is_zero_for_identical_distributions() -> None:
    diff = compare(Answer(tokens=PRIMARY), Answer(tokens=PRIMARY), ["kl"])
    assert diff.kl_divergence == 0.0
    assert top_k_kl(PRIMARY[1], PRIMARY[1]) == 0.0


def test_kl_matches_a_hand_computed_value_over_the_union_and_the_rest_bucket() -> None:
    primary = choice("a", ln(0.6), ("a", ln(0.6)), ("b", ln(0.3)))
    candidate = choice("a", ln(0.5), ("a", ln(0.5)), ("c", ln(0.4)))
    # Primary: a .6, b .3; its unknown .1 is shared by c (which only the candidate lists) and
    # the rest bucket: .05 each. Candidate: a .5, c .4; b and rest get .05 each.
    # Over (a, b, c, rest): P = (.6, .3, .05, .05), Q = (.5, .05, .4, .05).
    expected = 0.6 * ln(0.6 / 0.5) + 0.3 * ln(0.3 / 0.05) + 0.05 * ln(0.05 / 0.4)
    assert expected == pytest.approx(0.542949, abs=1e-6)
    assert top_k_kl(primary, candidate) == pytest.approx(expected, rel=1e-9)
    diff = compare(Answer(tokens=(primary,)), Answer(tokens=(candidate,)), ["kl"])
    assert diff.kl_divergence == round(expected, 6)
    # KL is not symmetric: the other way round weighs by the candidate's probabilities.
    reverse = 0.5 * ln(0.5 / 0.6) + 0.05 * ln(0.05 / 0.3) + 0.4 * ln(0.4 / 0.05)
    assert top_k_kl(candidate, primary) == pytest.approx(reverse, rel=1e-9)


def test_a_token_a_side_did_not_list_is_no_likelier_than_its_last_listed_one() -> None:
    primary = choice("a", ln(0.2), ("a", ln(0.2)))
    candidate = choice("a", ln(0.2), ("a", ln(0.2)), ("b", ln(0.15)))
    # The primary's unknown .8 split evenly would give b .4, above a's .2: b gets .2, rest .6.
    # P = (.2, .2, .6), Q = (.2, .15, .65) over (a, b, rest).
    expected = 0.2 * ln(0.2 / 0.15) + 0.6 * ln(0.6 / 0.65)
    assert top_k_kl(primary, candidate) == pytest.approx(expected, rel=1e-9)


def test_a_chosen_token_outside_its_top_list_counts_as_known() -> None:
    primary = TokenChoice("z", ln(0.02), (("a", ln(0.6)), ("b", ln(0.3))))
    candidate = choice("a", ln(0.5), ("a", ln(0.5)), ("c", ln(0.4)))
    # Primary: a .6, b .3 and its own z .02; its unknown .08 goes half to c, half to the rest.
    # Candidate: a .5, c .4; its unknown .1 goes a third each to b, z and the rest.
    # Over (a, b, z, c, rest): P = (.6, .3, .02, .04, .04), Q = (.5, t, t, .4, t), t = .1 / 3.
    t = 0.1 / 3
    expected = (
        0.6 * ln(0.6 / 0.5)
        + 0.3 * ln(0.3 / t)
        + 0.02 * ln(0.02 / t)
        + 0.04 * ln(0.04 / 0.4)
        + 0.04 * ln(0.04 / t)
    )
    assert top_k_kl(primary, candidate) == pytest.approx(expected, rel=1e-9)


def test_kl_averages_positions_up_to_and_including_the_first_divergence() -> None:
    p0, q0 = (
        choice("a", ln(0.6), ("a", ln(0.6)), ("b", ln(0.3))),
        choice("a", ln(0.5), ("a", ln(0.5)), ("c", ln(0.4))),
    )
    p1, q1 = (
        choice("x", ln(0.7), ("x", ln(0.7)), ("y", ln(0.2))),
        choice("y", ln(0.45), ("y", ln(0.45)), ("x", ln(0.4))),
    )
    # After the divergence the contexts differ: whatever follows is not compared.
    after_p = choice("m", ln(0.99), ("m", ln(0.99)))
    after_q = choice("n", ln(0.99), ("n", ln(0.99)))
    expected = (top_k_kl(p0, q0) + top_k_kl(p1, q1)) / 2
    assert top_k_kl(p1, q1) > 0 and top_k_kl(after_p, after_q) > 1
    diff = compare(Answer(tokens=(p0, p1, after_p)), Answer(tokens=(q0, q1, after_q)), ["kl"])
    assert diff.kl_divergence == round(expected, 6)
    assert mean_top_k_kl((p0, p1, after_p), (q0, q1, after_q)) == pytest.approx(expected)
    # A position without alternatives on one side is left out of the mean.
    bare = TokenChoice("a", ln(0.6))
    assert mean_top_k_kl((bare, p1), (q0, q1)) == pytest.approx(top_k_kl(p1, q1))


def test_kl_is_none_without_logprobs_or_without_top_alternatives() -> None:
    assert compare(Answer(text="a"), Answer(text="a"), ["kl"]).kl_divergence is None
    assert compare(Answer(tokens=PRIMARY), Answer(text="x"), ["kl"]).kl_divergence is None
    bare = tuple(TokenChoice(c.token, c.logprob) for c in PRIMARY)
    assert compare(Answer(tokens=bare), Answer(tokens=bare), ["kl"]).kl_divergence is None
    assert compare(Answer(tokens=PRIMARY), Answer(tokens=bare), ["kl"]).kl_divergence is None


def test_kl_stays_finite_when_a_listed_probability_is_zero_or_a_list_sums_past_one() -> None:
    # OpenAI writes -9999.0 for a token outside its top 20; rounding can push a sum past 1.
    primary = choice("a", 0.0, ("a", 0.0), ("b", -9999.0))
    candidate = choice("a", ln(0.5), ("a", ln(0.5)), ("b", ln(0.49)), ("c", ln(0.02)))
    score = top_k_kl(primary, candidate)
    assert math.isfinite(score) and score > 0
    assert math.isfinite(top_k_kl(candidate, primary))


def test_the_default_comparators_measure_near_ties_and_kl_from_read_answers() -> None:
    assert {"near_tie", "kl"} <= set(DEFAULT_COMPARATORS)
    first = entry("A", -0.1, ("A", -0.1))
    cat = entry(" cat", -0.6, (" cat", -0.6), (" dog", -0.9))
    dog = entry(" dog", -0.7, (" dog", -0.7), (" cat", -0.8))
    primary = read_body(chat_body("A cat", {"content": [first, cat]}))
    candidate = read_body(chat_body("A dog", {"content": [first, dog]}))
    diff = compare(primary, candidate)
    assert (diff.token_divergence, diff.near_tie) == (1, True)
    assert diff.kl_divergence is not None and diff.kl_divergence > 0
    assert diff.exact_match is False and diff.first_divergence == 1


def test_a_primary_without_logprobs_is_aligned_on_its_text_for_the_near_tie() -> None:
    candidate = (
        TokenChoice("The", -0.01, (("The", -0.01),)),
        TokenChoice(" big", -0.4, ((" big", -0.4), (" large", -1.1), (" small", -6.0))),
        TokenChoice(" city", -0.02, ((" city", -0.02),)),
    )
    flipped = compare(Answer(text="The large city"), Answer(text="The big city", tokens=candidate))
    assert (flipped.token_divergence, flipped.near_tie) == (1, True)
    wrong = compare(Answer(text="The old city"), Answer(text="The big city", tokens=candidate))
    assert (wrong.token_divergence, wrong.near_tie) == (1, False)
    same = compare(Answer(text="The big city"), Answer(text="The big city", tokens=candidate))
    assert (same.token_divergence, same.near_tie) == (None, None)
    longer = compare(
        Answer(text="The big city hall"), Answer(text="The big city", tokens=candidate)
    )
    assert (longer.token_divergence, longer.near_tie) == (3, None)


# llama.cpp: tokens known by their bytes, characters split over tokens --------------------------


def piece_of(*raw: int) -> str:
    """A token as the answers read one from its bytes."""
    return bytes(raw).decode("utf-8", "surrogateescape")


def test_pieces_llamacpp_writes_alike_are_told_apart_by_their_bytes() -> None:
    # Its first entry is the byte 8A, written U+FFFD, and its first alternative FC, written alike.
    (first, *_) = read_body(captured("completions-n2-logprobs.json")).tokens
    assert (first.token, first.shown) == (piece_of(0x8A), "\ufffd")
    assert first.top[0][0] == piece_of(0xFC)
    # An alternative that is a lead byte has its text cut to nothing, and keeps its byte.
    tops = [t for c in read_body(captured("chat-n2-logprobs.json")).tokens for t, _ in c.top]
    assert piece_of(0xC4) in tops and "" not in tops
    # Two answers whose first pieces are written alike but are different bytes part there.
    primary = Answer(tokens=(TokenChoice(piece_of(0x8A), -1.0, ((piece_of(0xFC), -0.5),)),))
    candidate = Answer(tokens=(TokenChoice(piece_of(0xFC), -0.5),))
    diff = compare(primary, candidate, ["near_tie"])
    assert (diff.token_divergence, diff.near_tie) == (0, True)


@pytest.mark.parametrize(
    ("name", "spelled_to"),
    [
        ("chat-n2-logprobs.json", None),
        ("chat-split-utf8-1.json", None),
        # Its last tokens were cut inside characters: they have no entries.
        ("completions-n2-logprobs.json", 7),
    ],
)
def test_a_llamacpp_answer_with_fewer_entries_than_tokens_agrees_with_itself_and_its_text(
    name: str, spelled_to: int | None
) -> None:
    answer = read_body(captured(name))
    assert answer.tokens and answer.text is not None and "\ufffd" in answer.text
    itself = compare(answer, answer)
    assert (itself.token_divergence, itself.near_tie, itself.kl_divergence) == (None, None, 0.0)
    # Aligned on its own text, where U+FFFD stands for its bytes of no character.
    assert text_near_tie(answer.text, answer.tokens) == (spelled_to, None)
    # The same text is no divergence, however far its entries go.
    spelled = compare(Answer(text=answer.text), answer, ["near_tie"])
    assert (spelled.token_divergence, spelled.near_tie) == (None, None)


def test_a_streamed_answer_of_two_choices_reads_the_first_as_its_whole_answer_does() -> None:
    streamed = read_stream(captured("chat-n2-logprobs-stream.txt"))
    whole = read_body(captured("chat-n2-logprobs.json"))
    assert streamed.text == whole.text
    assert streamed.tokens == whole.tokens


def test_two_llamacpp_answers_that_part_inside_a_split_character_part_at_that_entry() -> None:
    # Both wrote `\ufffdã\ufffdéééé` and then C3 C3 A3 or C3 C3 A9: one entry each.
    one, two = (read_body(captured(f"chat-split-utf8-{seed}.json")) for seed in (1, 2))
    assert one.tokens[3].token == "é" and len(one.tokens) == len(two.tokens) == 8
    diff = compare(one, two)
    # Neither A3 nor A9 is among the alternatives llama.cpp listed there (`.`, `D`, `0`).
    assert (diff.token_divergence, diff.near_tie) == (7, False)
    assert diff.kl_divergence is not None and diff.kl_divergence >= 0


# One entry holding the two pieces of é (C3 A9), its alternatives those of its last piece.
E_ACUTE = TokenChoice(
    "é", ln(0.6), ((piece_of(0xA9), ln(0.6)), (piece_of(0xA3), ln(0.3))), shown="é"
)


def test_a_divergence_inside_a_split_character_to_its_last_pieces_alternative_is_a_near_tie() -> (
    None
):
    a_tilde = TokenChoice("ã", ln(0.3), ((piece_of(0xA3), ln(0.3)), (piece_of(0xA9), ln(0.6))))
    o_tilde = TokenChoice("õ", ln(0.2), ((piece_of(0xB5), ln(0.2)),))  # C3 B5
    assert near_tie((E_ACUTE,), (a_tilde,), 0) is True
    assert near_tie((E_ACUTE,), (o_tilde,), 0) is False
    # Their contexts agree (C3): KL compares the last piece's two distributions, which agree.
    assert mean_top_k_kl((E_ACUTE,), (a_tilde,)) == pytest.approx(0.0, abs=1e-9)
    # Against a text: "ã" is the text going on with one of the entry's own alternatives.
    assert compare(Answer(text="ã"), Answer(tokens=(E_ACUTE,)), ["near_tie"]).near_tie is True


def test_pieces_of_a_character_written_apart_spell_the_text_that_holds_it() -> None:
    # vLLM and OpenAI give each piece its own entry, with its bytes and the text U+FFFD.
    pieces = (TokenChoice(piece_of(0xC3), -0.1, shown="\ufffd"), TokenChoice(piece_of(0xA9), -0.1))
    assert compare(Answer(text="é"), Answer(tokens=pieces), ["near_tie"]).token_divergence is None
    # And the pieces never equal the character written whole.
    assert token_divergence((E_ACUTE,), pieces) == 0
