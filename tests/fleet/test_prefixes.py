"""The prefix index: hits, eviction by capacity, and the engines' reports correcting it."""

from __future__ import annotations

from random import Random

from gateway.fleet.prefixes import PrefixIndex, capacity_blocks

BLOCK = 64


def index(**capacities: int) -> PrefixIndex:
    found = PrefixIndex()
    found.configure(capacities)
    return found


def test_a_backend_holds_the_blocks_it_was_sent_as_far_as_they_are_a_prefix() -> None:
    idx = index(gpu=100, asic=100)
    idx.sent("gpu", [1, 2, 3, 4])
    assert idx.cached("gpu", [1, 2, 3, 4, 5]) == 4
    assert idx.cached("gpu", [1, 2, 9, 4]) == 2  # a prefix: the chain breaks at the third
    assert idx.cached("asic", [1, 2, 3]) == 0
    assert idx.cached("unknown", [1]) == 0


def test_the_least_recently_used_blocks_go_first_when_the_backend_is_full() -> None:
    idx = index(asic=6)
    idx.sent("asic", [1, 2, 3])
    idx.sent("asic", [10, 11, 12])
    idx.sent("asic", [1, 2, 3])  # used again: now the most recent
    idx.sent("asic", [20, 21, 22])
    assert idx.held("asic") == 6
    assert idx.cached("asic", [1, 2, 3]) == 3 and idx.cached("asic", [10]) == 0
    # A prompt's tail goes before its head: what is left of it is still a prefix.
    idx.sent("asic", [30, 31])
    assert idx.cached("asic", [1, 2, 3]) == 1 and idx.cached("asic", [20, 21, 22]) == 3


def test_what_an_engine_says_it_keeps_bounds_the_index_until_more_is_sent() -> None:
    idx = index(gpu=100)
    idx.sent("gpu", [1, 2, 3])
    idx.sent("gpu", [10, 11, 12])
    idx.bound("gpu", 2)  # its slots keep two blocks now: the least recent go
    assert idx.held("gpu") == 2 and idx.cached("gpu", [10, 11]) == 2
    # Sent after the engine spoke: kept, whatever it said before.
    idx.sent("gpu", [20, 21, 22])
    assert idx.cached("gpu", [20, 21, 22]) == 3 and idx.cached("gpu", [10, 11]) == 2
    idx.bound("gpu", 0)  # an engine whose slots have served nothing keeps nothing
    idx.sent("gpu", [30, 31])
    assert idx.cached("gpu", [30, 31]) == 2 and idx.held("gpu") == 2
    idx.bound("gpu", None)  # says nothing: the declared capacity alone bounds it
    idx.sent("gpu", [40, 41])
    assert idx.held("gpu") == 4


def test_an_engine_that_found_less_than_expected_shrinks_what_the_index_trusts() -> None:
    idx = index(gpu=100)
    idx.sent("gpu", list(range(100)))
    idx.reported("gpu", expected=50, found=10)
    assert idx.scale("gpu") == 0.8 and idx.held("gpu") == 80
    for _ in range(20):
        idx.reported("gpu", expected=5, found=5)
    assert idx.scale("gpu") == 1.0  # grown back, never past the declared capacity


def test_an_answer_one_block_short_found_what_was_expected() -> None:
    # An engine never counts the prompt's last token as cached, and counts in blocks of its own.
    idx = index(gpu=100)
    idx.sent("gpu", list(range(100)))
    for _ in range(20):
        idx.reported("gpu", expected=8, found=7)
    assert idx.scale("gpu") == 1.0 and idx.held("gpu") == 100
    idx.reported("gpu", expected=8, found=6)
    assert idx.scale("gpu") == 0.8


def test_a_backend_that_keeps_nothing_is_never_expected_to_hold_anything() -> None:
    idx = index(cim=0)
    idx.sent("cim", [1, 2])
    assert idx.held("cim") == 0 and idx.cached("cim", [1, 2]) == 0


def test_a_new_policy_sets_capacities_and_forgets_removed_backends() -> None:
    idx = index(gpu=10, cim=10)
    idx.sent("gpu", list(range(10)))
    idx.sent("cim", [1])
    idx.configure({"gpu": 4})
    assert idx.held("gpu") == 4 and idx.cached("gpu", [0, 1, 2, 3, 4]) == 4
    assert idx.held("cim") == 0


def test_capacity_in_blocks_comes_from_kv_memory_and_bytes_per_token() -> None:
    # 40 GB of KV at 131,072 bytes a token (8B, bf16): 305k tokens, 4,768 blocks of 64.
    assert capacity_blocks(40e9, 131_072, BLOCK) == 4768
    assert capacity_blocks(float("inf"), 131_072, BLOCK) == 0


def test_what_is_held_of_a_prompt_is_always_a_prefix_so_bisection_counts_it() -> None:
    rng = Random(7)
    idx = index(gpu=40)
    # Conversations that grow turn by turn and share a system prompt's first blocks.
    prompts = [[0, 1, *range(100 * c, 100 * c + rng.randint(1, 30))] for c in range(1, 12)]
    for _ in range(400):
        prompt = rng.choice(prompts)
        idx.sent("gpu", prompt[: rng.randint(1, len(prompt))])
        for other in prompts:
            linear = next((i for i, b in enumerate(other) if idx.cached("gpu", [b]) == 0), None)
            assert idx.cached("gpu", other) == (len(other) if linear is None else linear)


def test_a_backend_put_to_sleep_holds_nothing_and_others_keep_theirs() -> None:
    idx = index(gpu=100, asic=100)
    idx.sent("gpu", [1, 2, 3])
    idx.sent("asic", [1, 2, 3])
    idx.forget("gpu")
    assert idx.cached("gpu", [1, 2, 3]) == 0 and idx.held("gpu") == 0
    assert idx.cached("asic", [1, 2, 3]) == 3
    idx.sent("gpu", [1])  # woken, it fills again
    assert idx.cached("gpu", [1, 2]) == 1
