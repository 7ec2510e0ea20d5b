"""Sample: which shadow copies a routed request gets. Pure: the draw is a hash of the request's id.

Each shadow target of the request's route is considered on its own: the target's filters must
admit the request, its pool must serve the model with enough context, and a hash of the
decision id and the pool must fall below its `sample_rate`, so a request's fate is
reproducible in every process and independent per target. A noise (A/A) copy, to the
primary's own pool (another backend, else the same one again), is added to the share of the
sampled requests that the route's noise floor (`Route.noise`) gives: every route with shadow
targets has one unless its policy turns it off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from gateway.policy.definition import Comparison, Policy, Route, ShadowBudget, ShadowMatch
from gateway.routing.classify import RequestProfile
from gateway.routing.router import tokens_needed

# The kinds of copy drawn here, defined apart (gateway/shadow/kinds.py).
from gateway.shadow.kinds import CANDIDATE as CANDIDATE
from gateway.shadow.kinds import NOISE as NOISE

Sampler = Callable[[str, str], float]


def stable_fraction(key: str, salt: str) -> float:
    """Map (key, salt) to a number in [0, 1) that is the same in every process."""
    digest = hashlib.blake2b(f"{key}\x00{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class ShadowPlan:
    """One copy a request should get: to a candidate pool, or (noise) to its own pool."""

    kind: str
    pool: str | None  # None for noise: the primary's pool, known once the request is served
    budget: ShadowBudget
    compare: Comparison


def _admits(match: ShadowMatch, profile: RequestProfile) -> bool:
    return (
        (not match.models or profile.model in match.models)
        and match.prompt_tokens.contains(profile.prompt_tokens)
        and (not match.tenants or profile.tenant in match.tenants)
    )


def sample(
    profile: RequestProfile,
    route: Route,
    policy: Policy,
    key: str,
    draw: Sampler = stable_fraction,
) -> tuple[ShadowPlan, ...]:
    """Decide which copies a routed request gets; `key` (the decision id) makes it reproducible.

    A target is considered only when its filters admit the request and its pool serves the
    model with enough context. A noise (A/A) copy is added to the noise floor's `share` of the
    sampled requests.
    """
    need = tokens_needed(profile, policy)
    plans = []
    for target in route.shadow:
        pool = policy.pools.get(target.pool)
        if (
            pool is None
            or profile.model not in pool.models
            or pool.max_context < need
            or not _admits(target.match, profile)
        ):
            continue
        if target.sample_rate > 0 and draw(key, target.pool) < target.sample_rate:
            plans.append(ShadowPlan(CANDIDATE, target.pool, target.budget, target.compare))
    noise = route.noise if plans else None
    if noise is not None and draw(key, NOISE) < noise.share:
        plans.append(ShadowPlan(NOISE, None, noise.budget, noise.compare))
    return tuple(plans)
