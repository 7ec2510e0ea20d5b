"""A device's prefix cache: the KV blocks of prompts it computed, kept for prompts that start alike.

Engines keep a prompt's KV cache in blocks of `block_tokens` tokens, each keyed by a hash of its
tokens chained to the block before it (vLLM's automatic prefix caching), so a block's id names its
whole prefix and two prompts share cached blocks exactly as far as they share a prefix. A prompt
looks its blocks up in order and stops at the first miss (`lookup`); its prefill skips what was
found; once computed, its blocks are kept (`insert`).

Device memory holds `capacity_tokens` of blocks. Past that the least recently used block drops to
host memory (`host_tokens`, in the same order), whence a later hit loads it back at a transfer
cost instead of computing it again; past that it is gone. A prompt's blocks are touched last
first, so its first block is its most recent and eviction takes a prefix's tail before its head,
as vLLM frees a request's blocks in reverse order: what stays cached is still a prefix.

With `events` set, the cache says what it stores and drops, as vLLM's KV-cache events do
(`BlockStored` with each new block's tokens and its parent, `BlockRemoved`, `AllBlocksCleared`;
the medium is `GPU` for device memory and `CPU` for host memory): simulator/kv_events.py
publishes them.

Pure: ids in, counts and events out. The device turns counts into time (simulator/device.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEVICE_MEDIUM, HOST_MEDIUM = "GPU", "CPU"  # vLLM's names for device and CPU-offloaded blocks


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive blocks kept in a medium: each block's tokens, and the block before the first."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks dropped from a medium."""

    block_hashes: tuple[int, ...]
    medium: str


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block dropped at once (the engine slept or restarted)."""


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class PrefixCache:
    """The blocks one device holds in its memory and, optionally, in its host's."""

    def __init__(self, capacity_tokens: int, block_tokens: int, host_tokens: int = 0):
        if block_tokens < 1:
            raise ValueError(f"a block holds at least one token, got block_tokens={block_tokens}")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self.host_blocks = host_tokens // block_tokens
        # Least recently used first.
        self._device: OrderedDict[int, None] = OrderedDict()
        self._host: OrderedDict[int, None] = OrderedDict()
        # Told what the cache stores and drops, once per insert or clear; None: nobody listens.
        self.events: Callable[[list[CacheEvent]], None] | None = None
        self._origin: dict[int, tuple[int | None, tuple[int, ...]]] = {}  # parent, tokens

    def lookup(self, blocks: Sequence[int]) -> tuple[int, int]:
        """Return how many of a prompt's leading blocks are in device memory and how many in host
        memory, up to the first block in neither (changing nothing)."""
        on_device = on_host = 0
        for block in blocks:
            if block in self._device:
                on_device += 1
            elif block in self._host:
                on_host += 1
            else:
                break
        return on_device, on_host

    def clear(self) -> None:
        """Forget every block: the engine was put to sleep or restarted, and its cache with it."""
        self._device.clear()
        self._host.clear()
        self._origin.clear()
        if self.events is not None:
            self.events([AllBlocksCleared()])

    def insert(self, blocks: Sequence[int], token_ids: Sequence[int] = ()) -> None:
        """Keep a computed prompt's blocks in device memory as the most recently used;
        `token_ids`, the prompt's, say what its new blocks hold to whoever listens."""
        device, host = self._device, self._host
        listening = self.events is not None
        found: list[CacheEvent] = []
        new = [block not in device for block in blocks] if listening else []
        if listening:
            loaded = [block for block in blocks if block in host]
            if loaded:
                found.append(BlockRemoved(tuple(loaded), HOST_MEDIUM))
        for block in reversed(blocks):
            host.pop(block, None)
            device[block] = None
            device.move_to_end(block)
        if listening:
            found += self._stored(blocks, new, token_ids)
        evicted, dropped = [], []
        while len(device) > self.capacity_blocks:
            block, _ = device.popitem(last=False)
            evicted.append(block)
            if self.host_blocks:
                host[block] = None
        while len(host) > self.host_blocks:
            dropped.append(host.popitem(last=False)[0])
        if not listening:
            return
        if evicted:
            found.append(BlockRemoved(tuple(evicted), DEVICE_MEDIUM))
            offloaded = [block for block in evicted if block in host]
            found += [self._restored(block, HOST_MEDIUM) for block in offloaded]
        if dropped:
            found.append(BlockRemoved(tuple(dropped), HOST_MEDIUM))
        for block in dropped:
            self._origin.pop(block, None)
        for block in evicted:
            if block not in host:
                self._origin.pop(block, None)
        assert self.events is not None
        if found:
            self.events(found)

    def _stored(
        self, blocks: Sequence[int], new: list[bool], token_ids: Sequence[int]
    ) -> list[CacheEvent]:
        """Return a BlockStored for each run of blocks new to device memory."""
        size = self.block_tokens
        found: list[CacheEvent] = []
        i = 0
        while i < len(blocks):
            if not new[i]:
                i += 1
                continue
            start = i
            while i < len(blocks) and new[i]:
                parent = blocks[i - 1] if i else None
                self._origin[blocks[i]] = (parent, tuple(token_ids[i * size : (i + 1) * size]))
                i += 1
            run = tuple(blocks[start:i])
            found.append(
                BlockStored(
                    run,
                    blocks[start - 1] if start else None,
                    tuple(token_ids[start * size : i * size]),
                    size,
                    DEVICE_MEDIUM,
                )
            )
        return found

    def _restored(self, block: int, medium: str) -> BlockStored:
        parent, tokens = self._origin.get(block, (None, ()))
        return BlockStored((block,), parent, tokens, self.block_tokens, medium)


def prompt_blocks(tokens: Sequence[str], block_tokens: int) -> tuple[int, ...]:
    """Return the chained ids of a prompt's whole blocks: each hashes its tokens and, through the
    block before it, every token before them."""
    running = hashlib.blake2b(digest_size=8)
    ids = []
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        # Separated, so where the tokens split is hashed too.
        running.update("\x1f".join(tokens[start : start + block_tokens]).encode() + b"\x1e")
        ids.append(int.from_bytes(running.copy().digest(), "big"))
    return tuple(ids)
