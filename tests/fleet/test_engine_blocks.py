"""The exact index of an engine's KV blocks, from the events it publishes."""

from __future__ import annotations

from gateway.fleet.engine_blocks import Cleared, EngineBlocks, Removed, Stored, supported
from gateway.routing.tokens import token_blocks

IDS = list(range(1000, 1256))  # a prompt of 256 tokens: 16 engine blocks, 4 keys


def _stored(first: int, count: int, *, parent: int | None = None, medium: str = "GPU") -> Stored:
    """Blocks `first` to `first + count - 1` of IDS, each hashed as its number by the engine."""
    return Stored(
        list(range(first, first + count)),
        parent,
        IDS[first * 16 : (first + count) * 16],
        16,
        medium,
    )


def test_a_prompt_the_engine_stored_is_held_under_the_keys_the_gateway_computes() -> None:
    engine = EngineBlocks()
    engine.apply([_stored(0, 16)])
    keys = token_blocks(IDS)
    assert len(keys) == 4
    assert engine.cached(keys) == 4
    assert engine.cached(token_blocks([*IDS[:64], *range(64)])) == 1  # shares the first key


def test_blocks_stored_in_several_batches_chain_through_their_parents() -> None:
    engine = EngineBlocks()
    engine.apply([_stored(0, 6)])
    engine.apply([_stored(6, 10, parent=5)])
    assert engine.cached(token_blocks(IDS)) == 4


def test_a_block_whose_parent_was_never_heard_of_is_not_placed() -> None:
    engine = EngineBlocks()
    engine.apply([_stored(8, 8, parent=7)])
    assert engine.cached(token_blocks(IDS)) == 0
    assert engine.unplaced == 8


def test_a_removed_tail_is_no_longer_held_and_the_head_still_is() -> None:
    engine = EngineBlocks()
    engine.apply([_stored(0, 16)])
    engine.apply([Removed([15, 14, 13, 12, 11], "GPU")])
    assert engine.cached(token_blocks(IDS)) == 2  # keys end at blocks 3, 7 (held), 11, 15


def test_a_block_offloaded_to_host_memory_is_still_held_until_both_media_drop_it() -> None:
    engine = EngineBlocks()
    engine.apply([_stored(0, 16)])
    engine.apply([Removed([15], "GPU"), _stored(15, 1, parent=14, medium="CPU")])
    assert engine.cached(token_blocks(IDS)) == 4
    engine.apply([Removed([15], "CPU")])
    assert engine.cached(token_blocks(IDS)) == 3


def test_all_blocks_cleared_empties_the_index_and_trusts_it_again() -> None:
    engine = EngineBlocks(trusted=False)
    engine.apply([_stored(0, 16)])
    engine.apply([Cleared()])
    assert engine.cached(token_blocks(IDS)) == 0
    assert engine.trusted and not engine.held


def test_blocks_of_32_tokens_key_the_same_and_odd_sizes_are_refused() -> None:
    engine = EngineBlocks()
    engine.apply([Stored(list(range(8)), None, IDS, 32, "GPU")])
    assert engine.cached(token_blocks(IDS)) == 4
    assert not supported(48) and not supported(8) and supported(64)
    odd = EngineBlocks()
    odd.apply([Stored([1], None, IDS[:48], 48, "GPU")])
    assert odd.unsupported == 1 and not odd.held


def test_a_batch_confirms_what_was_sent() -> None:
    engine = EngineBlocks(unconfirmed=3)
    engine.apply([])
    assert engine.unconfirmed == 0
