"""The routing strategies a replay compares: the learned router, the baselines and the oracle.

Every strategy routes through the real `decide()`; they differ only in how the eligible pools
are ranked (the `rank_pools` seam), for `gpu-only` in a policy cut down to the GPU pool, and in
what their router reads of a request. `learned` is the what-if's (`gateway.whatif.strategy`);
`learned-parked` is `learned` that also parks the backends its forecast does not need
(`gateway.parking.plan`). The gateway's own (`learned`, `learned-parked`, `static`,
`best-static`, `gpu-only`) read its prompt's prefix blocks and the fleet's prefix index, as the
live gateway does. The baselines rank backends themselves, as the routers others deploy in front
of engines do: `round-robin` and `least-loaded` (`lab.balancing`) and `session-hash`
(`lab.session_hash`, which alone is told the conversation) route profiles without blocks, blind
to the cache; `approximate-prefix` (`lab.approximate_prefix`) reads the blocks into trees of its
own. `best-static` is `static` under each order of the routes' pools, the cheapest in hindsight
(`lab.bench`); the oracle knows the truth, every backend's cache and load among it
(`lab.oracle`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from dataclasses import replace

from gateway.parking.plan import Parking
from gateway.policy.definition import Policy, Route
from gateway.policy.tariffs import Rates, own_rate
from gateway.routing.ranking import preference_order
from gateway.whatif.strategy import Strategy, learned
from lab.approximate_prefix import ApproximatePrefix
from lab.balancing import RoundRobin, least_loaded
from lab.oracle import OracleRanker
from lab.session_hash import SessionHash

MAX_ORDERS = 120  # fixed orders best-static replays at most

STRATEGIES = (
    "learned",
    "learned-parked",
    "static",
    "best-static",
    "gpu-only",
    "round-robin",
    "least-loaded",
    "session-hash",
    "approximate-prefix",
    "oracle",
)


def gpu_only_policy(policy: Policy) -> Policy:
    """Cut every route down to the policy's GPU pools, which serve as their own fallback."""
    gpus = [name for name, pool in policy.pools.items() if pool.kind == "gpu" and pool.live]
    if not gpus:
        raise ValueError(f"the policy has no live gpu pool (pools: {', '.join(policy.pools)})")
    routes = [
        route.model_copy(
            update={
                "pools": [p for p in route.pools if p in gpus] or gpus[:1],
                "fallback": route.fallback if route.fallback in gpus else gpus[0],
            }
        )
        for route in policy.routes
    ]
    return policy.model_copy(update={"routes": routes})


def serves(route: Route, models: Collection[str]) -> bool:
    """Say whether a route may serve one of `models`."""
    return not route.match.models or bool(set(models) & set(route.match.models))


def orders(policy: Policy, models: Collection[str]) -> list[Policy]:
    """Return the policy under every order of the pools of each route that may serve `models`."""
    serving = [i for i, route in enumerate(policy.routes) if serves(route, models)]
    choices = [list(itertools.permutations(policy.routes[i].pools)) for i in serving]
    if math.prod(len(c) for c in choices) > MAX_ORDERS:
        raise ValueError(
            f"the routes serving {', '.join(models)} have more than {MAX_ORDERS} orders of their "
            "pools: "
            "best-static would replay each"
        )
    found = []
    for picked in itertools.product(*choices):
        routes = list(policy.routes)
        for i, pools in zip(serving, picked, strict=True):
            routes[i] = routes[i].model_copy(update={"pools": list(pools)})
        found.append(policy.model_copy(update={"routes": routes}))
    return found


def describe_order(policy: Policy, models: Collection[str]) -> dict[str, list[str]]:
    """Return each serving route's pools in order, as a result names an order."""
    return {r.name: list(r.pools) for r in policy.routes if serves(r, models)}


def strategy_for(
    name: str,
    policy: Policy,
    *,
    seed: int = 0,
    retrain_every: int = 200,
    rates: Rates | None = None,
) -> Strategy:
    """Build the router of a named strategy over a policy; `rates` are the prices it reads."""
    if name == "learned":
        return learned(policy, retrain_every=retrain_every, rates=rates)
    if name == "learned-parked":
        parked = learned(policy, retrain_every=retrain_every, rates=rates)
        return replace(parked, name=name, parking=Parking.of(policy))
    if name == "oracle":
        oracle = OracleRanker(policy, rates or (lambda pool: own_rate(policy.pools[pool])))
        return Strategy(name, policy, oracle, oracle=oracle)
    if name == "gpu-only":
        return Strategy(name, gpu_only_policy(policy), preference_order)
    if name == "round-robin":
        return Strategy(name, policy, RoundRobin(start=seed), prefixes=False)
    if name == "least-loaded":
        return Strategy(name, policy, least_loaded, prefixes=False)
    if name == "session-hash":
        return Strategy(name, policy, SessionHash(), prefixes=False, sessions=True)
    if name == "approximate-prefix":
        return Strategy(name, policy, ApproximatePrefix())
    if name in ("static", "best-static"):
        return Strategy(name, policy, preference_order)
    raise ValueError(f"unknown strategy {name!r} (strategies: {', '.join(STRATEGIES)})")
