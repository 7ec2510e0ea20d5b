"""Explain a routing decision: what the gateway would do with a request, without sending it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gateway.errors import GatewayError
from gateway.fleet.state import BackendState, Fleet
from gateway.policy.definition import Policy, Pool
from gateway.policy.tariffs import Rate, own_rate
from gateway.routing.classify import RequestProfile, TokenEstimator, classify, tenant_of
from gateway.routing.ranking import CostRanker
from gateway.routing.router import decide


def explain(
    endpoint: str,
    body: Any,
    headers: dict[str, str],
    policy: Policy,
    fleet: Fleet,
    ranker: CostRanker,
    estimator: TokenEstimator,
) -> dict[str, Any]:
    """Classify and route a request as the gateway would; return the decision and its reasons.

    `pools` says what each pool the route may use runs on (its kind, precision, versions and
    serving engine), the price and carbon of its electricity now (its tariff's window), and the
    load of each of its backends now.
    """
    headers = {k.lower(): v for k, v in headers.items()}
    try:
        profile = classify(endpoint, body, headers, tenant_of(policy, headers), policy, estimator)
        decision = decide(profile, policy, fleet, ranker)
    except GatewayError as exc:
        return {"decision": None, "status": exc.status, **exc.document()}
    backend = decision.backend
    route = decision.route
    considered = [*route.pools, route.fallback, route.canary.pool if route.canary else None]
    return {
        "decision": {
            "route": decision.route.name,
            "objective": decision.route.objective,
            "pool": backend.pool if backend else decision.queue_pool.name,  # type: ignore[union-attr]
            "backend": backend.name if backend else None,
            "queued_ms": None if backend else round(decision.queue_budget_s * 1000, 1),
            "slo_unmeetable": decision.slo_unmeetable,
        },
        "status": 200,
        # The prompt's prefix blocks by their count: their hashes say nothing to a reader.
        "profile": asdict(profile) | {"blocks": len(profile.blocks)},
        "predictions": {
            pool: {k: v for k, v in asdict(p).items() if k != "pool"}
            for pool, p in decision.predictions.items()
        },
        "trace": decision.explain(),
        "pools": {
            name: hardware(policy.pools[name])
            | {"tariff": policy.pools[name].tariff, "rate": asdict(rate(ranker, policy, name))}
            | {"backends": load(fleet, name, profile)}
            for name in dict.fromkeys(considered)
            if name is not None and name in policy.pools
        },
        "cost_model_version": ranker.model_version(),
    }


def hardware(pool: Pool) -> dict[str, Any]:
    """Return what a pool runs on: kind, precision, serving engine and the versions given."""
    return {
        "kind": pool.kind,
        "precision": pool.precision,
        "engine": pool.engine,
        **pool.versions(),
    }


def rate(ranker: CostRanker, policy: Policy, pool: str) -> Rate:
    """Return the rate the ranker prices a pool's energy at now."""
    return ranker.rates(pool) if ranker.rates is not None else own_rate(policy.pools[pool])


def parking(backend: BackendState) -> dict[str, Any] | None:
    """Return why parking took a backend out of service (draining, parked or waking), and since
    when (Unix seconds); None while it serves."""
    if not backend.parking:
        return None
    return {
        "state": backend.parking,
        "reason": backend.parking_reason,
        "since": backend.parking_since,
    }


def load(fleet: Fleet, pool: str, profile: RequestProfile) -> list[dict[str, Any]]:
    """Return each backend's load now: the gateway's requests, other clients', free slots, the
    request's prefix blocks it holds and the prompt tokens it is expected to find cached, and
    what its engine says of its prompt cache and generation speed (None: it says nothing), and
    why parking took it out of service, if it did."""
    state = fleet.pools.get(pool)
    held = {
        b.name: fleet.prefixes.cached(b.name, profile.blocks) if profile.blocks else 0
        for b in (state.backends if state is not None else [])
    }
    return [
        {
            "backend": b.name,
            "slots": b.slots,
            "in_flight": b.in_flight,
            "other_replicas": b.elsewhere,
            "external": b.external,
            "free_slots": max(b.free_slots, 0),
            "prefix_blocks_held": held[b.name],
            "prefix_index": "engine events" if fleet.prefixes.exact(b.name) else "estimate",
            "cached_tokens_expected": profile.cached_tokens(held[b.name]),
            "engine_full": b.engine_full or None,
            "engine_cached_share": b.engine_cached_share,
            "engine_tokens_per_s": b.engine_tokens_per_s,
            "ejected": b.ejected,
            "parking": parking(b),
        }
        for b in (state.backends if state is not None else [])
    ]
