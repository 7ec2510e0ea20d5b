"""A prompt's prefix blocks: the same prefix gives the same blocks, and a change breaks the chain
from its block on."""

from __future__ import annotations

from gateway.routing.prefix import BLOCK_CHARS, MAX_BLOCKS, blocks, rendered

SYSTEM = "You are a careful assistant for the routing team. " * 40  # about 500 tokens


def chat(*turns: str, tools: list | None = None) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)
    ]
    return {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}


def test_a_conversation_shares_its_earlier_turns_blocks_with_its_next_request() -> None:
    first = blocks(rendered("chat", chat("What is a slot?")))
    second = blocks(rendered("chat", chat("What is a slot?", "A slice.", "And a pool?")))
    assert len(first) >= 7 and second[: len(first)] == first
    assert len(second) >= len(first)


def test_a_different_system_prompt_shares_nothing_after_the_first_difference() -> None:
    base = rendered("chat", chat("hello"))
    other = base[:600] + "X" + base[601:]
    a, b = blocks(base), blocks(other)
    size = BLOCK_CHARS
    same = 600 // size
    assert a[:same] == b[:same]
    # Chained: every block from the changed one on differs, though their own text is equal.
    assert all(x != y for x, y in zip(a[same:], b[same:], strict=True))


def test_only_whole_blocks_count_and_tools_come_first() -> None:
    size = BLOCK_CHARS
    assert blocks("a" * (size - 1)) == ()
    assert len(blocks("a" * (2 * size + 5))) == 2
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    assert rendered("chat", chat("hi", tools=tools)).startswith('[{"type":"function"')


def test_prompts_with_nothing_to_cache_have_no_blocks() -> None:
    assert rendered("embeddings", {"model": "m", "input": "x" * 5000}) == ""
    assert rendered("completions", {"model": "m", "prompt": [1, 2, 3]}) == ""
    assert rendered("completions", {"model": "m", "prompt": "p" * 300}) == "p" * 300


def test_the_hashes_are_the_same_in_every_process() -> None:
    # Replicas share the index: the hash may not be Python's salted one.
    assert blocks("z" * BLOCK_CHARS) == (9072716403249153206,)


def test_a_prompt_past_the_longest_block_chain_is_hashed_as_far_as_it_goes() -> None:
    text = "x" * (BLOCK_CHARS * (MAX_BLOCKS + 50))
    assert len(blocks(text)) == MAX_BLOCKS
