"""The routing strategies a replay compares: the learned router and the baselines.

Every strategy routes through the real `decide()`; they differ only in how the eligible pools
are ranked (the `rank_pools` seam) and, for `gpu-only`, in a policy cut down to the GPU pool.
The oracle is not here: it is computed, not routed (`gateway.replay.oracle`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.costmodel.model import OutputLengths
from gateway.costmodel.train import RetrainSchedule
from gateway.fleet.state import PoolState
from gateway.policy.model import Policy, Route
from gateway.replay.learner import OnlineLearner
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import CostRanker, Ranking, preference_order
from gateway.routing.router import RankPools

ROUTED = ("learned", "gpu-only", "round-robin", "least-loaded", "static")
STRATEGIES = (*ROUTED, "oracle")


class RoundRobin:
    """Rank eligible pools in turn: each request starts one pool further along."""

    def __init__(self, start: int = 0):
        self._turn = start

    def __call__(
        self,
        profile: RequestProfile,
        route: Route,
        pools: Sequence[PoolState],
        trace: list[tuple[str, str]],
    ) -> Ranking:
        if not pools:
            return Ranking([])
        first = self._turn % len(pools)
        self._turn += 1
        return Ranking([*pools[first:], *pools[:first]])


def least_loaded(
    profile: RequestProfile,
    route: Route,
    pools: Sequence[PoolState],
    trace: list[tuple[str, str]],
) -> Ranking:
    """Rank eligible pools by requests in flight and waiting, relative to their slots."""

    def load(pool: PoolState) -> float:
        slots = sum(b.slots for b in pool.backends)
        return (sum(b.in_flight for b in pool.backends) + len(pool.waiters)) / slots

    return Ranking(sorted(pools, key=load))


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


@dataclass(slots=True)
class Strategy:
    """How one strategy routes: its policy, its ranking and, if it learns, its learner."""

    name: str
    policy: Policy
    rank: RankPools
    learner: OnlineLearner | None = None
    outputs: OutputLengths | None = None


def strategy_for(name: str, policy: Policy, *, seed: int = 0, retrain_every: int = 200) -> Strategy:
    """Build the router of a named strategy over a policy."""
    if name == "learned":
        learner = OnlineLearner(policy, schedule=RetrainSchedule(every=retrain_every))
        outputs = OutputLengths(default=policy.assumed_max_tokens)
        ranker = CostRanker(lambda: learner.model, outputs)
        return Strategy(name, policy, ranker, learner, outputs)
    if name == "gpu-only":
        return Strategy(name, gpu_only_policy(policy), preference_order)
    if name == "round-robin":
        return Strategy(name, policy, RoundRobin(start=seed))
    if name == "least-loaded":
        return Strategy(name, policy, least_loaded)
    if name == "static":
        return Strategy(name, policy, preference_order)
    raise ValueError(f"strategy {name!r} is not routed (routed strategies: {', '.join(ROUTED)})")
