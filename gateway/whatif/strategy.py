"""How a replay routes: one strategy's policy, ranking and, if it learns, its learner.

Every strategy routes through the real `decide()`; strategies differ in how the eligible pools
are ranked (the `rank_pools` seam) and in what their router reads of a request. The what-if
replays the gateway's own, `learned`; the routing benchmark's baselines and its oracle
(`lab.strategies`) are strategies too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.costmodel.predict import OutputLengths
from gateway.costmodel.train import RetrainSchedule
from gateway.parking.plan import Parking
from gateway.policy.definition import Policy
from gateway.policy.tariffs import Rates
from gateway.routing.ranking import CostRanker
from gateway.routing.router import RankPools
from gateway.whatif.replay_learner import OnlineLearner
from gateway.whatif.trace import TraceRequest
from gateway.whatif.world import SimulatedBackend


class Oracle(Protocol):
    """A ranking that reads the truth the others measure: the replay gives it its world once
    built, and each request as it arrives, prefix blocks and true output length included."""

    world: dict[str, SimulatedBackend]
    request: TraceRequest | None


@dataclass(slots=True)
class Strategy:
    """How one strategy routes: its policy, its ranking and, if it learns, its learner.

    `oracle` is its ranking when that reads the replay's truth. `prefixes` says whether its
    router reads a prompt's prefix blocks, `sessions` whether it is told the conversation a
    request continues (`gateway.whatif.trace.conversation`), `parking` how it switches backends
    off and on (the others keep every one on).
    """

    name: str
    policy: Policy
    rank: RankPools
    learner: OnlineLearner | None = None
    outputs: OutputLengths | None = None
    oracle: Oracle | None = None
    prefixes: bool = True
    sessions: bool = False
    parking: Parking | None = None


def learned(policy: Policy, *, retrain_every: int = 200, rates: Rates | None = None) -> Strategy:
    """Build the gateway's own router over a policy: the cost ranking of a model it learns from
    what the replay measures, reading prompts' prefix blocks and the fleet's prefix index as the
    live gateway does; `rates` are the prices it reads."""
    learner = OnlineLearner(policy, schedule=RetrainSchedule(every=retrain_every))
    outputs = OutputLengths(default=policy.assumed_max_tokens)
    ranker = CostRanker(lambda: learner.model, outputs, rates)
    return Strategy("learned", policy, ranker, learner, outputs)
