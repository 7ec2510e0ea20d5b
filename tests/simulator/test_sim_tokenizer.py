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


ENGLISH = (
    "The gateway classifies each request by model, prompt length and service level, routes it "
    "to a GPU, ASIC or compute-in-memory pool using a cost and energy model learned from what it "
    "measures, and mirrors a sample of the traffic to candidate pools to compare their answers. "
    "Operators change the routing policies while traffic flows, and every decision is recorded."
)
CHINESE = (
    "能源效率的硬件路由网关根据成本和能耗模型把每个请求发送到图形处理器、专用芯片或存内计算后端。"
)


def test_scripts_are_counted_within_15_percent_of_llama_3():
    # Llama 3: 3.94 characters a token on English, 1.26 on modern Chinese (docs/simulator.md).
    assert len(ENGLISH) / count_tokens(ENGLISH) == pytest.approx(3.94, rel=0.15)
    chinese = CHINESE * 40
    assert len(chinese) / count_tokens(chinese) == pytest.approx(1.26, rel=0.15)


def test_mixed_scripts_split_into_pieces_that_spell_the_text():
    for text in ("你好，世界 hello", "  日本語のテキスト。", "한국어 text 中文", CHINESE):
        pieces = split_tokens(text)
        assert "".join(pieces) == text
        assert len(pieces) == count_tokens(text)
