"""Session hash: each conversation on the backend a consistent hash of its session names, as
vLLM's production-stack router routes (`--routing-logic session`).

That router puts its endpoints on a hash ring (`uhashring`: 160 points an endpoint) and sends a
request naming a session to the endpoint the session's hash falls on, and one naming none to the
endpoint with the lowest request rate. It never looks at the prompt, the cache or the load: a
conversation stays where it started while the ring holds, so its turns find their prefix there,
and a hot conversation stays hot on one backend. Here the ring holds every eligible backend, GPU
and ASIC alike; where the session's backend has no free slot, the request takes the next backend
clockwise on the ring (the engine behind vLLM's router would queue it instead: the replay never
runs a backend past its slots), and a request naming no session goes to the least loaded.
"""

from __future__ import annotations

import hashlib
from bisect import bisect
from collections.abc import Sequence

from gateway.fleet.state import PoolState
from gateway.policy.definition import Route
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking
from lab.balancing import by_backend, eligible, least_loaded

POINTS = 160  # points each backend has on the ring, as uhashring places them


def point(key: str) -> int:
    """Return where a key falls on the ring: a stable 64-bit hash, the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class SessionHash:
    """Rank eligible backends from where the request's session falls on their hash ring."""

    def __init__(self) -> None:
        # One ring per set of eligible backends (long prompts leave out a short-context pool).
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def ring(self, names: tuple[str, ...]) -> tuple[list[int], list[str]]:
        """Return the ring of a set of backends: its points in order, and whose each one is."""
        found = self._rings.get(names)
        if found is None:
            placed = sorted((point(f"{name}-{i}"), name) for name in names for i in range(POINTS))
            found = ([at for at, _ in placed], [name for _, name in placed])
            self._rings[names] = found
        return found

    def __call__(
        self,
        profile: RequestProfile,
        route: Route,
        pools: Sequence[PoolState],
        trace: list[tuple[str, str]],
    ) -> Ranking:
        if profile.session is None:
            return least_loaded(profile, route, pools, trace)
        backends = {backend.name: backend for backend in eligible(pools)}
        if not backends:
            return Ranking(list(pools))
        points, owners = self.ring(tuple(sorted(backends)))
        start = bisect(points, point(profile.session))
        order: dict[str, None] = {}  # each backend once, clockwise from the session's point
        for i in range(len(owners)):
            order.setdefault(owners[(start + i) % len(owners)])
            if len(order) == len(backends):
                break
        return by_backend(pools, [backends[name] for name in order])
