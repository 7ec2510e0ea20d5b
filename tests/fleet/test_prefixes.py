"""The prefix index: hits, eviction by capacity, and the engines' reports correcting it."""

from __future__ import annotations

from gateway.fleet.prefixes import PrefixIndex, capacity_blocks

BLOCK = 64


def index(**capacities: int) -> PrefixIndex:
    found = PrefixIndex(BLOCK)
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


def test_an_engine_that_found_less_than_expected_shrinks_what_the_index_trusts() -> None:
    idx = index(gpu=100)
    idx.sent("gpu", list(range(100)))
    idx.reported("gpu", expected_blocks=50, cached_tokens=10 * BLOCK)
    assert idx.scale("gpu") == 0.8 and idx.held("gpu") == 80
    for _ in range(20):
        idx.reported("gpu", expected_blocks=5, cached_tokens=5 * BLOCK)
    assert idx.scale("gpu") == 1.0  # grown back, never past the declared capacity


def test_a_new_policy_sets_capacities_and_forgets_removed_backends() -> None:
    idx = index(gpu=10, cim=10)
    idx.sent("gpu", list(range(10)))
    idx.sent("cim", [1])
    idx.configure({"gpu": 4})
    assert idx.held("gpu") == 4 and idx.cached("gpu", [6, 7, 8, 9]) == 4
    assert idx.held("cim") == 0


def test_capacity_in_blocks_comes_from_kv_memory_and_bytes_per_token() -> None:
    # 40 GB of KV at 131,072 bytes a token (8B, bf16): 305k tokens, 4,768 blocks of 64.
    assert capacity_blocks(40e9, 131_072, BLOCK) == 4768
    assert capacity_blocks(float("inf"), 131_072, BLOCK) == 0
