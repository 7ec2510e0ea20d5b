"""A prompt's prefix blocks keyed by its tokens, where the gateway has the model's tokenizer.

An engine that publishes its KV cache's changes (vLLM's `--kv-events-config`) names each block
it stores by a hash of its own and lists the block's token ids. The gateway keys blocks by a
chain of its own over those token ids, so it needs neither the engine's hash function nor its
seed: a request's keys come from its prompt's token ids (the model's tokenizer, rendering the
prompt as the engine does), an engine's from the token ids its events carry, and the two meet
exactly where the engine holds the prompt's prefix (gateway/fleet/engine_blocks.py).

The chain (gateway/fleet/engine_blocks.py) runs over units of 16 tokens, and a key is taken
every `BLOCK_TOKENS` (64, as the text blocks of gateway/routing/prefix.py), so a prompt of
131,072 tokens has 2,048 keys, hashed in about 1 ms.

A tokenizer is a plug-in: a class with `prompt_ids(endpoint, payload)`, which a model's
`tokenizer` in the policy names by its import path (`module:Class`). The simulator's is
`simulator.schema:EngineTokenizer`; a Hugging Face model's would render its chat template and
run its tokenizer. gateway/routing/tokenizers.py loads one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gateway.fleet.engine_blocks import ROOT, UNIT_TOKENS, UNITS_PER_KEY, advance
from gateway.fleet.prefixes import BLOCK_TOKENS

MAX_BLOCKS = 2048  # as many keys as a text prompt's blocks (gateway/routing/prefix.py)


class Tokenizer(Protocol):
    """Renders a request's prompt as the engine does and returns its token ids."""

    def prompt_ids(self, endpoint: str, payload: dict[str, Any]) -> Sequence[int] | None:
        """Return the prompt's token ids, or None where it has none to cache (embeddings)."""
        ...


def token_blocks(ids: Sequence[int]) -> tuple[int, ...]:
    """Return a prompt's keys: the chain's state after each whole `BLOCK_TOKENS` of its ids."""
    state, keys = ROOT, []
    whole = min(len(ids) // BLOCK_TOKENS, MAX_BLOCKS) * UNITS_PER_KEY
    for unit in range(whole):
        state = advance(state, ids[unit * UNIT_TOKENS : (unit + 1) * UNIT_TOKENS])
        if (unit + 1) % UNITS_PER_KEY == 0:
            keys.append(state)
    return tuple(keys)
