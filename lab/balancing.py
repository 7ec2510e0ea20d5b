"""Load balancing by backend, blind to prompts: the round-robin and least-loaded baselines.

Routers in front of inference engines balance over the engines themselves, whatever hardware
each runs on: vLLM's production-stack router's `roundrobin` takes its endpoints in turn, and
least-request balancing (Envoy's, SGLang's router when loads are imbalanced) takes the one
running the fewest requests. These rank every backend of the eligible pools together and name
them to `decide()` through `Ranking.backends`, so the backend is theirs, not `most_free`'s, which
would read the prefix index; their strategies route profiles without prefix blocks, so nothing
else on the way reads it either.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.fleet.state import BackendState, PoolState
from gateway.policy.definition import Route
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking


def by_backend(pools: Sequence[PoolState], order: Sequence[BackendState]) -> Ranking:
    """Rank pools by where their backends first come in `order`, each pool's backends in that
    order; `decide()` takes the first with room, and a full fleet queues in the first pool."""
    backends: dict[str, list[BackendState]] = {pool.name: [] for pool in pools}
    ranked: list[PoolState] = []
    named = {pool.name: pool for pool in pools}
    for backend in order:
        if not backends[backend.pool]:
            ranked.append(named[backend.pool])
        backends[backend.pool].append(backend)
    ranked += [pool for pool in pools if pool not in ranked]
    return Ranking(ranked, backends=backends)


def eligible(pools: Sequence[PoolState]) -> list[BackendState]:
    """Return the healthy backends of the eligible pools, in the route's order of its pools."""
    return [backend for pool in pools for backend in pool.healthy()]


class RoundRobin:
    """Take the eligible backends in turn: each request starts one backend further along."""

    def __init__(self, start: int = 0):
        self._turn = start

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
        first = self._turn % len(backends)
        self._turn += 1
        return by_backend(pools, [*backends[first:], *backends[:first]])


def least_loaded(
    profile: RequestProfile,
    route: Route,
    pools: Sequence[PoolState],
    trace: list[tuple[str, str]],
) -> Ranking:
    """Rank eligible backends by the requests they run per slot (a GPU's 32 slots take twice an
    ASIC's 16), then by their pool's waiters per slot, so a full fleet queues where fewest wait."""
    waiting = {pool.name: len(pool.waiters) / max(pool_slots(pool), 1) for pool in pools}
    order = sorted(eligible(pools), key=lambda b: (b.load / b.slots, waiting[b.pool]))
    return by_backend(pools, order)


def pool_slots(pool: PoolState) -> int:
    """Return the slots of a pool's healthy backends."""
    return sum(backend.slots for backend in pool.healthy())
