"""Where each prompt prefix is cached: per backend, the prefix blocks the gateway sent it.

A backend that served a prompt holds its KV blocks (gateway/routing/prefix.py) until it
evicts them for others. The gateway cannot see an engine's cache, so it keeps, per backend,
the blocks it sent there in least-recently-used order, bounded by what the backend keeps
(`capacity`, in blocks: the pool's `prefix_cache_tokens`, else its KV memory over the model's
bytes per token, `gateway/fleet/state.py`): an engine evicts the least recently used blocks it
does not need, so the index forgets what the engine would have forgotten first.

What the engines report corrects it. An answer's `usage.prompt_tokens_details.cached_tokens`
(vLLM, SGLang, llama.cpp and OpenAI report it) says how many of the prompt's tokens the engine
found cached; where the index expected more, by more than `SLACK_BLOCKS` (an engine never
counts a prompt's last token as cached, and counts in blocks of its own size), the engine holds
less than the index thinks (other clients' prompts, a smaller cache than declared, a restart),
so the backend's `scale` shrinks the capacity the index keeps; where the engine found about as
much or more, it grows back towards the declared capacity. An engine that says how much of past
prompts it keeps bounds it too (`bound`: llama.cpp's slots, one prompt each, read with the
metering scrape), together with the blocks sent to it since it said so, which a scrape taken
before they arrived cannot count. What the index expects is what it knew before the request was
sent, so a request sent while another with its prefix was still
in prefill expects nothing of it and corrects nothing. A restarted engine, an eviction the
index did not see, a block another replica sent while Redis was out: each costs one
mispredicted request, which the report then corrects. With Redis, replicas tell each other
what they send (gateway/fleet/shared_prefixes.py).

Where a backend's engine publishes its KV-cache events, the index holds exactly what the engine
holds (`engines`, gateway/fleet/engine_blocks.py, kept by gateway/fleet/kv_events.py), and
`cached` answers from it while it serves (events arriving, none lost); the estimate is still
kept beside it, and answers whenever it does not.

Memory: about 112 bytes per block held (an int key in an ordered dict, tracemalloc in
`bench.decision_time`), so a backend that keeps 1M tokens costs 16k blocks, about 1.8 MB of
index, at most.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.fleet.engine_blocks import BLOCK_TOKENS, EngineBlocks

MIN_SCALE = 0.05  # the index keeps at least this share of the declared capacity
SHRINK, GROW = 0.8, 1.05  # per mispredicted answer, per answer that found what was expected
SLACK_BLOCKS = 1  # an answer this many blocks short of what was expected found it all


@dataclass(slots=True)
class BackendBlocks:
    """One backend's cached blocks, least recently used first, and how much to trust them."""

    capacity: int
    scale: float = 1.0
    held: OrderedDict[int, None] = field(default_factory=OrderedDict)
    kept: int | None = None  # what the engine said it kept at its last scrape, if it says
    # Blocks sent since that scrape: the engine keeps them too, whatever it said before them.
    since: int = 0

    @property
    def limit(self) -> int:
        """The blocks the index keeps for this backend now."""
        if self.capacity <= 0:
            return 0
        trusted = max(1, int(self.capacity * self.scale))
        return trusted if self.kept is None else min(trusted, self.kept + self.since)


class PrefixIndex:
    """The prefix blocks each backend holds, as the gateway last saw them."""

    def __init__(self) -> None:
        self._backends: dict[str, BackendBlocks] = {}
        # What the engines that publish their KV-cache events hold, by backend.
        self.engines: dict[str, EngineBlocks] = {}
        # Told of every prompt this replica sends, so that other replicas hear of it.
        self.on_sent: Callable[[str, Sequence[int]], None] | None = None

    def configure(self, capacities: dict[str, int]) -> None:
        """Set each backend's capacity in blocks (a policy version's); forget removed ones."""
        for name in list(self._backends):
            if name not in capacities:
                del self._backends[name]
        for name, capacity in capacities.items():
            known = self._backends.get(name)
            if known is None:
                self._backends[name] = BackendBlocks(capacity)
            else:
                known.capacity = capacity
                self._evict(known)

    def cached(self, backend: str, blocks: Sequence[int]) -> int:
        """Return how many of a prompt's leading blocks the backend holds.

        What a backend holds of one prompt is always a prefix of it (`sent`), so the count is
        found by bisection: a few lookups for a prompt of thousands of blocks. The engine's own
        word where it serves (`exact`), else the estimate.
        """
        engine = self.engines.get(backend)
        if engine is not None and engine.serving:
            return engine.cached(blocks)
        known = self._backends.get(backend)
        if known is None or not blocks or blocks[0] not in known.held:
            return 0
        held, low, high = known.held, 1, len(blocks)
        while low < high:  # blocks[:low] are held; blocks[high:] are not known to be
            mid = (low + high + 1) // 2
            if blocks[mid - 1] in held:
                low = mid
            else:
                high = mid - 1
        return low

    def sent(self, backend: str, blocks: Sequence[int]) -> None:
        """Record that this replica sent the backend a prompt's blocks: it now holds them."""
        engine = self.engines.get(backend)
        if engine is not None and blocks and engine.cached(blocks) < len(blocks):
            engine.unconfirmed += 1  # its engine should publish the blocks it stores
        self.heard(backend, blocks)
        if self.on_sent is not None and blocks:
            self.on_sent(backend, blocks)

    def heard(self, backend: str, blocks: Sequence[int]) -> None:
        """Record that the backend now holds a prompt's blocks (it computed or reused them)."""
        known = self._backends.get(backend)
        if known is None or not blocks:
            return
        held = known.held
        # Last block first, so a prompt's first block is its most recently used and its tail
        # goes first, as engines free a request's blocks (vLLM frees them in reverse): a block
        # is never more recent than the one before it, so what is held of a prompt is a prefix.
        for block in reversed(blocks):
            if block in held:
                held.move_to_end(block)
            else:
                held[block] = None
                known.since += 1
        self._evict(known)

    def reported(self, backend: str, expected: int, found: int) -> None:
        """Correct the backend's trust from an answer: the engine found `found` blocks of the
        prompt cached where the index expected `expected`."""
        known = self._backends.get(backend)
        if known is None:
            return
        if found < expected - SLACK_BLOCKS:
            known.scale = max(MIN_SCALE, known.scale * SHRINK)
            self._evict(known)
        else:
            known.scale = min(1.0, known.scale * GROW)

    def bound(self, backend: str, blocks: int | None) -> None:
        """Keep at most `blocks` for the backend, what its engine says it keeps of past prompts
        now, and what is sent to it from now on (None: it says nothing, and the declared
        capacity bounds the index)."""
        known = self._backends.get(backend)
        if known is not None:
            known.kept, known.since = blocks, 0
            self._evict(known)

    def forget(self, backend: str) -> None:
        """Record that the backend holds no block any more (its engine was put to sleep or
        restarted, which drops its KV cache)."""
        known = self._backends.get(backend)
        if known is not None:
            known.held.clear()

    def exact(self, backend: str) -> bool:
        """Say whether `cached` answers for the backend from its engine's events."""
        engine = self.engines.get(backend)
        return engine is not None and engine.serving

    def held(self, backend: str) -> int:
        """Return how many blocks the index holds for the backend."""
        known = self._backends.get(backend)
        return 0 if known is None else len(known.held)

    def capacity(self, backend: str) -> int:
        """Return how many blocks the index keeps for the backend at most now."""
        known = self._backends.get(backend)
        return 0 if known is None else known.limit

    def scale(self, backend: str) -> float:
        """Return the share of its declared capacity the index trusts the backend to hold."""
        known = self._backends.get(backend)
        return 1.0 if known is None else known.scale

    @staticmethod
    def _evict(known: BackendBlocks) -> None:
        held, limit = known.held, known.limit
        while len(held) > limit:
            held.popitem(last=False)


def capacity_blocks(
    kv_capacity_bytes: float, kv_bytes_per_token: float, block_tokens: int = BLOCK_TOKENS
) -> int:
    """Return the prefix blocks of `block_tokens` tokens a backend's KV memory holds."""
    if kv_capacity_bytes == float("inf") or kv_bytes_per_token <= 0:
        return 0
    return int(kv_capacity_bytes / (kv_bytes_per_token * block_tokens))
