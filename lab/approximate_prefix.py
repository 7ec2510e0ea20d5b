"""Approximate prefix: SGLang's cache-aware router, on the prompt's prefix blocks.

SGLang's router (sgl-router, `--policy cache_aware`; llm-d's approximate prefix scorer keeps the
same kind of index) never asks an engine what it caches. It keeps, per worker, an approximate
radix tree of the prompts it routed there, least recently used evicted past `max_tree_size`,
and routes each request in one of two ways:

- when the load is imbalanced, that is when the most loaded worker runs more than
  `BALANCE_ABS_THRESHOLD` requests beyond the least loaded and more than `BALANCE_REL_THRESHOLD`
  times as many, to the least loaded worker;
- otherwise, by the prompt's longest match in the trees: to the worker with the longest match if
  it covers more than `CACHE_THRESHOLD` of the prompt, else to the worker whose tree is smallest
  (the most room for new prefixes), whatever its load;

and inserts the prompt into the tree of the worker it chose. The parameters are sgl-router's
defaults. Its trees hold characters; here they hold the prompt's prefix blocks, in the same
index the gateway keeps (`gateway.fleet.prefixes.PrefixIndex`), never corrected by what the
engines report and bounded by `max_tree_size` instead of a backend's memory. A tie of longest
matches (every prompt of a conversation trace shares its system prompt) goes to the smallest
tree, and a tie of sizes (the Azure traces' prompts have no blocks) to the least loaded. Where
the worker chosen has no free slot, the request takes the next in the same order (the engine
behind SGLang's router would queue it: the replay never runs a backend past its slots), and the
prompt is inserted where it is placed.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.prefixes import PrefixIndex
from gateway.fleet.state import BackendState, PoolState
from gateway.policy.definition import Route
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking
from lab.balancing import by_backend, eligible

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
# sgl-router's `max_tree_size`, 2^26 characters, at 4 characters a token.
MAX_TREE_TOKENS = 2**26 // 4


def imbalanced(loads: Sequence[int]) -> bool:
    """Say whether the workers' loads are apart enough that SGLang's router balances them."""
    most, least = max(loads), min(loads)
    return most - least > BALANCE_ABS_THRESHOLD and most > least * BALANCE_REL_THRESHOLD


class ApproximatePrefix:
    """Rank eligible backends as SGLang's cache-aware router chooses among its workers."""

    def __init__(self) -> None:
        self.trees = PrefixIndex()
        self._capacities: dict[str, int] = {}

    def __call__(
        self,
        profile: RequestProfile,
        route: Route,
        pools: Sequence[PoolState],
        trace: list[tuple[str, str]],
    ) -> Ranking:
        backends = eligible(pools)
        if not backends:
            return Ranking(list(pools))
        self._know(backends, profile)
        blocks = profile.blocks
        size = {b.name: self.trees.held(b.name) for b in backends}
        if imbalanced([b.load for b in backends]):
            order = sorted(backends, key=lambda b: b.load)
        else:
            matched = {b.name: self.trees.cached(b.name, blocks) for b in backends}
            longest = max(matched.values())
            if blocks and longest / len(blocks) > CACHE_THRESHOLD:
                order = sorted(backends, key=lambda b: (-matched[b.name], size[b.name], b.load))
            else:
                order = sorted(backends, key=lambda b: (size[b.name], b.load))
        placed = next((b for b in order if b.free_slots > 0), order[0])
        self.trees.sent(placed.name, blocks)
        return by_backend(pools, order)

    def _know(self, backends: Sequence[BackendState], profile: RequestProfile) -> None:
        """Give a tree to each backend first seen, of `max_tree_size` in the prompt's blocks."""
        new = [b.name for b in backends if b.name not in self._capacities]
        if new and profile.block_tokens:
            capacity = int(MAX_TREE_TOKENS / profile.block_tokens)
            self._capacities.update(dict.fromkeys(new, capacity))
            self.trees.configure(self._capacities)
