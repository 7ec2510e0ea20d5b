"""The route decision: a pure function of the request profile, the policy and the fleet state.

It reads no clock and does no I/O, so it can be unit-tested and driven by an offline simulation.
The rules, in order: take the first route that matches; among its pools, in preference order,
drop those that do not serve the model, whose context is too short for prompt plus output, or
that have no healthy backend; serve from the first that has a free slot; otherwise wait in the
first such pool's queue within the SLO budget; otherwise use the route's fallback.

`rank_pools` is the seam where a cost model replaces the preference order. A route that
`explore`s sends that share of its requests to the runner-up of the ranking, or to a pool the
ranking dropped as predicted to miss the SLO when no other pool is left, so a pool the model
stopped choosing keeps sending it evidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.costmodel.predict import Prediction
from gateway.errors import (
    ContextTooLong,
    GatewayError,
    ModelNotFound,
    NoCapacity,
    NoHealthyBackend,
    RouteDenied,
)
from gateway.fleet.state import BackendState, Fleet, PoolState
from gateway.policy.definition import Policy, Route
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking, preference_order

RankPools = Callable[[RequestProfile, Route, Sequence[PoolState], list[tuple[str, str]]], Ranking]
# The request's draw times this, modulo 1, decides whether it explores: uniform too, and apart
# from the draw's own low values, which decide a canary's share.
EXPLORE_SPREAD = 7919.0


@dataclass(slots=True)
class RouteDecision:
    """Where a request goes: a backend now, or a pool to wait in; with the reasons.

    `queue_budget_s` is how long the request may wait for a slot: in `queue_pool`, or in the
    chosen backend's pool if another replica takes that backend's last slot first.
    """

    route: Route
    backend: BackendState | None
    queue_pool: PoolState | None = None
    queue_budget_s: float = 0.0
    trace: list[tuple[str, str]] = field(default_factory=list)
    predictions: dict[str, Prediction] = field(default_factory=dict)
    slo_unmeetable: bool = False
    kv_bytes: float = 0.0

    def explain(self) -> list[str]:
        """Return the trace as sentences, one per pool considered."""
        lines = [f"{pool}: predicted {p.describe()}" for pool, p in self.predictions.items()]
        return lines + [f"{pool}: {reason}" for pool, reason in self.trace]


def match_route(profile: RequestProfile, policy: Policy) -> Route:
    """Return the first route that admits the request, or raise the error the client should see."""
    # A loop, not any() over a generator: 0.34 against 0.75 µs a decision (bench/decision_time.py).
    for pool in policy.pools.values():
        if pool.live and profile.model in pool.models:
            break
    else:
        raise ModelNotFound(
            f"model {profile.model!r} is not served here (models: "
            f"{', '.join(policy.served_models())})",
            param="model",
        )
    for route in policy.routes:
        m = route.match
        if (
            (not m.models or profile.model in m.models)
            and m.prompt_tokens.contains(profile.prompt_tokens)
            and (not m.slo_classes or profile.slo_class in m.slo_classes)
            and (not m.tenants or profile.tenant in m.tenants)
        ):
            return route
    raise RouteDenied(
        f"no route admits model {profile.model!r} with ~{profile.prompt_tokens} prompt tokens, "
        f"SLO class {profile.slo_class!r} and tenant {profile.tenant!r}"
    )


# The prompt's size is estimated from its characters (classify.py) and may read high: prompts
# the estimate put a tenth over the real fleet's context fitted it (bench.aiperf_fleet). Where
# no pool holds a request by the estimate, one it overflows by less than this share is left to
# the engine, which counts exactly and whose refusal the client then sees (a larger pool, where
# one exists, is preferred by the estimate: gateway/upstream/forward.py retries there).
ESTIMATE_HIGH_BY = 0.2


def tokens_needed(profile: RequestProfile, policy: Policy, prompt_tokens: int | None = None) -> int:
    """Return the context a request needs: its prompt plus the output it may generate.

    The prompt is the profile's estimate unless `prompt_tokens` (a backend's count) is given.
    """
    prompt = profile.prompt_tokens if prompt_tokens is None else prompt_tokens
    if profile.endpoint == "embeddings":
        return prompt
    return prompt + (profile.max_tokens or policy.assumed_max_tokens)


def context_needed(profile: RequestProfile, policy: Policy, route: Route, fleet: Fleet) -> int:
    """Return the context a pool must have to be sent the request: `tokens_needed`, unless no
    pool of the route (its fallback included) serving the model has that much; then the fewest
    tokens the estimate allows (`ESTIMATE_HIGH_BY`), for the engine to count."""
    need = tokens_needed(profile, policy)
    pools = _candidates(route, fleet, with_fallback=True)
    if any(p.spec.max_context >= need for p in pools if profile.model in p.spec.models):
        return need
    least = math.floor(profile.prompt_tokens * (1 - ESTIMATE_HIGH_BY))
    return tokens_needed(profile, policy, prompt_tokens=least)


@dataclass(frozen=True, slots=True)
class Unfit:
    """Why a pool cannot serve a request at all: the error it implies, and the reason in words."""

    error: type[GatewayError]
    reason: str


def tokens_at_most(profile: RequestProfile, policy: Policy) -> int:
    """Return the most tokens a request can hold: its prompt once, and every answer's output.

    What its KV cache is reserved for, and what its tenant's tokens a minute are charged.
    """
    if profile.endpoint == "embeddings":
        return profile.prompt_tokens
    output = profile.max_tokens or policy.assumed_max_tokens
    return profile.prompt_tokens + profile.sequences * output


def _unfit(
    pool: PoolState, profile: RequestProfile, need: int, kv: float, canary: bool = False
) -> Unfit | None:
    """Say why a pool cannot serve the request at all, or None when it can."""
    spec = pool.spec
    if not spec.live and not canary:
        return Unfit(RouteDenied, "shadow-only")
    if profile.model not in spec.models:
        return Unfit(RouteDenied, f"does not serve {profile.model}")
    if spec.max_context < need:
        return Unfit(ContextTooLong, f"context {spec.max_context} < {need} tokens needed")
    if kv > spec.kv_capacity_bytes():
        capacity = spec.kv_capacity_bytes()
        return Unfit(ContextTooLong, f"KV cache {kv / 1e9:.1f} GB > {capacity / 1e9:.1f} GB")
    if not pool.healthy():
        return Unfit(NoHealthyBackend, "no healthy backend")
    return None


def _canary_pool(
    route: Route,
    fleet: Fleet,
    profile: RequestProfile,
    need: int,
    kv: float,
    draw: float,
    trace: list[tuple[str, str]],
    refused: list[Unfit],
) -> PoolState | None:
    """Return the route's canary pool when this request falls in its share and it can serve."""
    canary = route.canary
    if canary is None or draw >= canary.weight or canary.pool not in fleet.pools:
        return None
    pool = fleet.pools[canary.pool]
    unfit = _unfit(pool, profile, need, kv, canary=True)
    if unfit is not None:
        refused.append(unfit)
        trace.append((pool.name, f"canary ({canary.weight:.0%}): {unfit.reason}"))
        return None
    trace.append((pool.name, f"canary ({canary.weight:.0%}): tried first"))
    return pool


def _full_reason(pool: PoolState) -> str:
    if any(b.free_slots > 0 for b in pool.healthy()):
        return "no KV-cache memory free"
    engines = [f"{b.name}: {b.engine_full}" for b in pool.healthy() if b.engine_full]
    return "no free slot" + (f" ({'; '.join(engines)})" if engines else "")


def _candidates(route: Route, fleet: Fleet, with_fallback: bool) -> list[PoolState]:
    names = list(route.pools)
    if with_fallback and route.fallback and route.fallback not in names:
        names.append(route.fallback)
    return [fleet.pools[n] for n in names]


def decide(
    profile: RequestProfile,
    policy: Policy,
    fleet: Fleet,
    rank_pools: RankPools = preference_order,
    draw: float = 1.0,
) -> RouteDecision:
    """Choose a backend for the request, or the pool whose queue it should wait in.

    `draw`, uniform in [0, 1), decides whether the request is in a canary's share: the caller
    supplies it so the decision stays a function of its inputs.
    """
    route = match_route(profile, policy)
    need = context_needed(profile, policy, route, fleet)
    kv = tokens_at_most(profile, policy) * policy.kv_bytes_per_token(profile.model)
    trace: list[tuple[str, str]] = []
    fit: list[PoolState] = []
    refused: list[Unfit] = []
    for name in route.pools:
        pool = fleet.pools[name]
        unfit = _unfit(pool, profile, need, kv)
        if unfit is None:
            fit.append(pool)
        else:
            refused.append(unfit)
            trace.append((pool.name, unfit.reason))
    ranking = rank_pools(profile, route, fit, trace)
    ranked = ranking.pools
    canary = _canary_pool(route, fleet, profile, need, kv, draw, trace, refused)
    if canary is not None:
        ranked = [canary, *(p for p in ranked if p is not canary)]
    elif (
        route.explore
        and len(ranked) + len(ranking.dropped) > 1
        and not ranking.slo_unmeetable
        and (draw * EXPLORE_SPREAD) % 1.0 > 1.0 - route.explore
    ):
        # The runner-up, or where every other pool is predicted to miss the SLO, the cheapest
        # of those: a pool that was slow is seen to recover only through what is sent to it.
        runner_up = ranked[1] if len(ranked) > 1 else ranking.dropped[0]
        ranked = [runner_up, *(p for p in ranked if p is not runner_up)]
        ranking.wait_for_first = False
        trace.append(
            (ranked[0].name, f"explored: {route.explore:.0%} of requests keep its figures fresh")
        )
    slo = policy.slo_classes[profile.slo_class]
    budget_ms = (
        slo.max_queue_ms if profile.ttft_ms is None else min(slo.max_queue_ms, profile.ttft_ms)
    )

    def decision(backend: BackendState | None, queue: PoolState | None = None) -> RouteDecision:
        return RouteDecision(
            route,
            backend,
            queue,
            budget_ms / 1000,
            trace,
            ranking.predictions,
            ranking.slo_unmeetable,
            kv,
        )

    waits = ranking.wait_for_first and canary is None and _queue_room(ranked[0], budget_ms)
    if waits and ranking.predictions[ranked[0].name].queue_s * 1000 <= budget_ms:
        trace.append((ranked[0].name, f"queued: waits up to {budget_ms:.0f} ms for a slot"))
        return decision(None, ranked[0])
    for pool in ranked:
        backend = _backend(pool, ranking, profile, kv)
        if backend is not None:
            trace.append((pool.name, _chosen(pool, backend, profile)))
            return decision(backend)
        trace.append((pool.name, _full_reason(pool)))
    for pool in ranked:
        if _queue_room(pool, budget_ms):
            trace.append((pool.name, f"queued: waits up to {budget_ms:.0f} ms for a slot"))
            return decision(None, pool)
        trace.append((pool.name, "queue full"))
    if route.fallback and route.fallback not in route.pools:
        pool = fleet.pools[route.fallback]
        unfit = _unfit(pool, profile, need, kv)
        if unfit is None:
            backend = pool.most_free(
                kv_bytes=kv, blocks=profile.blocks, block_tokens=profile.block_tokens
            )
            if backend is not None:
                trace.append((pool.name, f"fallback: {_chosen(pool, backend, profile)}"))
                return decision(backend)
            if _queue_room(pool, budget_ms):
                trace.append((pool.name, f"fallback queued: waits up to {budget_ms:.0f} ms"))
                return decision(None, pool)
            fit.append(pool)
            trace.append((pool.name, "fallback: no free slot and queue full"))
        else:
            refused.append(unfit)
            trace.append((pool.name, f"fallback: {unfit.reason}"))
    why = "; ".join(f"{p}: {r}" for p, r in trace)
    if fit:
        raise NoCapacity(
            f"every pool of route {route.name!r} is full and none can queue the request within "
            f"its SLO budget ({why}); retry later"
        )
    errors = {unfit.error for unfit in refused}
    if NoHealthyBackend in errors:
        raise NoHealthyBackend(f"no healthy backend can serve route {route.name!r} ({why})")
    if ContextTooLong in errors:
        output = tokens_needed(profile, policy) - profile.prompt_tokens
        raise ContextTooLong(
            f"~{profile.prompt_tokens} prompt tokens plus {output} output "
            f"tokens exceed the context or KV-cache memory of every pool of route "
            f"{route.name!r} ({why})",
            param="messages" if profile.endpoint == "chat" else "prompt",
        )
    raise RouteDenied(f"route {route.name!r} has no pool for model {profile.model!r} ({why})")


def _backend(
    pool: PoolState, ranking: Ranking, profile: RequestProfile, kv: float
) -> BackendState | None:
    """Return the backend to take in a pool: the first with room of those the ranking chose
    there (for this request's KV share), or else the pool's `most_free`."""
    chosen = ranking.backends.get(pool.name)
    if chosen is None or (ranking.kv_bytes is not None and ranking.kv_bytes != kv):
        return pool.most_free(
            kv_bytes=kv,
            blocks=profile.blocks,
            session=profile.session,
            block_tokens=profile.block_tokens,
        )
    for backend in chosen:
        if backend.takes(kv):
            return backend
    return None


def _queue_room(pool: PoolState, budget_ms: float) -> bool:
    return budget_ms > 0 and len(pool.waiters) < pool.spec.queue_depth


def pick_backend(
    profile: RequestProfile,
    route: Route,
    policy: Policy,
    fleet: Fleet,
    exclude: frozenset[str] = frozenset(),
) -> BackendState | None:
    """Return a backend with a free slot now, the route's fallback included, skipping `exclude`."""
    need = context_needed(profile, policy, route, fleet)
    kv = tokens_at_most(profile, policy) * policy.kv_bytes_per_token(profile.model)
    for pool in _candidates(route, fleet, with_fallback=True):
        if _unfit(pool, profile, need, kv) is None:
            backend = pool.most_free(
                exclude, kv, profile.blocks, profile.session, profile.block_tokens
            )
            if backend is not None:
                return backend
    return None


def _chosen(pool: PoolState, backend: BackendState, profile: RequestProfile) -> str:
    """Say why a backend was chosen: its free slots, and what it holds of the prompt."""
    said = f"chosen: {backend.name} has {backend.free_slots} free slots"
    if profile.blocks:
        held = pool.prefixes.cached(backend.name, profile.blocks)
        said += (
            f", holds {held} of the prompt's {len(profile.blocks)} prefix blocks"
            f" (~{profile.cached_tokens(held)} tokens cached)"
        )
        if profile.session is not None and pool.sessions.backend(profile.session) == backend.name:
            said += ", served the request's session last"
    return said
