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

Pure: ids in, counts out. The device turns them into time (simulator/device.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


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

    def insert(self, blocks: Sequence[int]) -> None:
        """Keep a computed prompt's blocks in device memory as the most recently used."""
        device, host = self._device, self._host
        for block in reversed(blocks):
            host.pop(block, None)
            device[block] = None
            device.move_to_end(block)
        while len(device) > self.capacity_blocks:
            block, _ = device.popitem(last=False)
            if self.host_blocks:
                host[block] = None
        while len(host) > self.host_blocks:
            host.popitem(last=False)


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
