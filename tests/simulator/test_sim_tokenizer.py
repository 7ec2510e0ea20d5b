"""The tokenizer counts prompts and splits answers the same way."""

import pytest

from simulator.tokenizer import count_tokens, split_tokens


@pytest.mark.parametrize(
    "text",
    ["Hello, world", "internationally", "  leading and trailing  ", '{"a": [1, 2]}\n', "x" * 100],
)
def test_pieces_join_back_into_the_text_and_match_the_count(text):
    pieces = split_tokens(text)
    assert "".join(pieces) == text
    assert len(pieces) == count_tokens(text)


def test_punctuation_is_a_token_of_its_own():
    assert split_tokens("Hello, world.") == ["Hello", ",", " world", "."]


def test_long_words_split_into_several_tokens():
    assert count_tokens("internationalization") > count_tokens("nation")


def test_english_prose_is_near_one_and_a_third_tokens_per_word():
    prose = (
        "The quick brown fox jumps over the lazy dog while the energy efficient accelerator"
        " serves requests from many applications, batching them to amortise memory traffic."
    )
    ratio = count_tokens(prose) / len(prose.split())
    assert 1.0 < ratio < 1.6
