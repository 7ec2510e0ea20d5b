"""What an engine's KV cache holds, exactly, from the events it publishes.

vLLM, SGLang and TensorRT-LLM publish each block their KV cache stores (`BlockStored`: the
blocks' hashes, the block before the first, their token ids, the block size and the medium,
device or host memory), each block they drop (`BlockRemoved`) and a reset (`AllBlocksCleared`).
`EngineBlocks` keeps one backend's blocks from those events, keyed as the gateway keys a
prompt's prefix: a chain over the token ids (`advance`, in units of `UNIT_TOKENS`), a key every
`BLOCK_TOKENS` (gateway/routing/tokens.py computes a request's), so the engine's own hash
function never matters. A block's place in the chain comes from its parent's, so a block whose
parent the index never heard of (stored before the gateway subscribed) is not placed: the index
then holds less than the engine, never more.

A key is held while any medium holds the block that ends at it. Engines free a prompt's blocks
tail first, so what one holds of a prompt is a prefix, found by bisection as in
gateway/fleet/prefixes.py.

Whether the router may trust it (`serving`) is the subscriber's word (gateway/fleet/kv_events.py):
it is `live` while events arrive as expected, and not `trusted` after a gap the engine's replay
buffer could not fill (a removal may be missing) until the engine clears its cache or
restarts. `unconfirmed` counts the prompts sent to the backend since its last batch that should
have stored blocks: a subscriber that sees them pile up with no batch knows events stopped.

Memory: about 250 bytes a block (a dict entry and its record), so a GPU keeping 2.5M tokens in
16-token blocks costs about 40 MB; pure, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

# Tokens of a block of the live gateway's prompts (gateway/routing/prefix.py, tokens.py), the
# prefix index's unit (gateway/fleet/prefixes.py). Engines use 16 (vLLM) to 512 (Mooncake's
# traces); 64 keeps a prompt of 128k tokens at 2,000 hashes while a repeated system prompt of a
# few hundred tokens still spans several blocks.
BLOCK_TOKENS = 64
UNIT_TOKENS = 16  # tokens of a unit of the chain: vLLM's block on CUDA
UNITS_PER_KEY = BLOCK_TOKENS // UNIT_TOKENS
ROOT = 0  # the chain's state before a prompt's first unit


def advance(state: int, ids: Sequence[int]) -> int:
    """Return the chain's state after a unit of token ids (a 63-bit BLAKE2b digest)."""
    digest = hashlib.blake2b(state.to_bytes(8, "big"), digest_size=8)
    digest.update(b"".join(i.to_bytes(4, "big", signed=True) for i in ids))
    return int.from_bytes(digest.digest(), "big") >> 1


def supported(block_size: int) -> bool:
    """Say whether an engine's blocks of `block_size` tokens can be keyed: whole units that
    divide a key's span, so each key ends where a block does."""
    return block_size % UNIT_TOKENS == 0 and UNITS_PER_KEY % (block_size // UNIT_TOKENS) == 0


@dataclass(frozen=True, slots=True)
class Stored:
    """An engine stored consecutive blocks in a medium (vLLM's `BlockStored`)."""

    block_hashes: Sequence[Hashable]
    parent_block_hash: Hashable | None
    token_ids: Sequence[int]
    block_size: int
    medium: str | None


@dataclass(frozen=True, slots=True)
class Removed:
    """An engine dropped blocks from a medium (vLLM's `BlockRemoved`)."""

    block_hashes: Sequence[Hashable]
    medium: str | None


@dataclass(frozen=True, slots=True)
class Cleared:
    """An engine dropped every block (vLLM's `AllBlocksCleared`)."""


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class _Block:
    state: int  # the chain's state after the block
    units: int  # units from the prompt's start to the block's end
    media: list[str | None]


@dataclass(slots=True)
class EngineBlocks:
    """One backend's KV blocks as its engine published them, and whether they are to be used."""

    blocks: dict[Hashable, _Block] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # key -> media holding its block
    live: bool = False
    trusted: bool = True
    unconfirmed: int = 0
    unplaced: int = 0  # blocks stored under a parent the index never heard of
    unsupported: int = 0  # blocks of a size the chain cannot key

    @property
    def serving(self) -> bool:
        """Say whether the router reads this index rather than the gateway's estimate."""
        return self.live and self.trusted

    def apply(self, events: Sequence[Event]) -> None:
        """Apply one batch of the engine's events, in order."""
        self.unconfirmed = 0
        for event in events:
            if isinstance(event, Stored):
                self._store(event)
            elif isinstance(event, Removed):
                self._remove(event)
            else:
                self.clear()

    def clear(self) -> None:
        """Forget every block: the engine cleared its cache or restarted."""
        self.blocks.clear()
        self.held.clear()
        self.trusted = True

    def cached(self, keys: Sequence[int]) -> int:
        """Return how many of a prompt's leading keys the engine holds."""
        held = self.held
        if not keys or keys[0] not in held:
            return 0
        low, high = 1, len(keys)
        while low < high:  # keys[:low] are held; keys[high:] are not known to be
            mid = (low + high + 1) // 2
            if keys[mid - 1] in held:
                low = mid
            else:
                high = mid - 1
        return low

    def _store(self, event: Stored) -> None:
        size = event.block_size
        if not supported(size):
            self.unsupported += len(event.block_hashes)
            return
        if event.parent_block_hash is None:
            state, units = ROOT, 0
        else:
            parent = self.blocks.get(event.parent_block_hash)
            if parent is None:
                self.unplaced += len(event.block_hashes)
                return
            state, units = parent.state, parent.units
        ids, per = event.token_ids, size // UNIT_TOKENS
        for i, engine_hash in enumerate(event.block_hashes):
            for unit in range(per):
                start = (i * per + unit) * UNIT_TOKENS
                state = advance(state, ids[start : start + UNIT_TOKENS])
            units += per
            known = self.blocks.get(engine_hash)
            if known is None:
                known = self.blocks[engine_hash] = _Block(state, units, [])
            if event.medium in known.media:
                continue
            known.media.append(event.medium)
            if units % UNITS_PER_KEY == 0:
                self.held[state] = self.held.get(state, 0) + 1

    def _remove(self, event: Removed) -> None:
        for engine_hash in event.block_hashes:
            known = self.blocks.get(engine_hash)
            if known is None or event.medium not in known.media:
                continue
            known.media.remove(event.medium)
            if known.units % UNITS_PER_KEY == 0:
                left = self.held.get(known.state, 0) - 1
                if left > 0:
                    self.held[known.state] = left
                else:
                    self.held.pop(known.state, None)
            if not known.media:
                del self.blocks[engine_hash]
