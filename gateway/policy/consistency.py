"""The policy's consistency: what every field may be alone, checked against the rest.

A route must name pools, SLO classes and tenants that the policy defines, a shadow target must
serve the route's models with comparators that exist, a noise floor a policy gives needs shadow
samples to be a share of. Each rule gives the field path it concerns and a sentence that names
the bad value and what was expected; the loader places them in the file.

`memory_errors` checks physics rather than references: a pool whose models, KV cache and headroom
do not fit one backend's memory describes hardware that cannot exist. It is checked when
a policy is validated or applied (gateway/policy/validation.py), not when a stored version is
loaded, so replicas upgraded over a version stored before the check keep serving it. So is
`retired`, a key the policy no longer takes that the loader still reads (a pool's `runtime`).
"""

from __future__ import annotations

import itertools
from typing import Any

from gateway.compare.measures import COMPARATORS, SIMILARITY
from gateway.policy.definition import (
    DEFAULT_PARAMS_B,
    Comparison,
    Policy,
    Route,
    retired_runtime,
)
from gateway.policy.physics import HEADROOM, footprint

# A field path and what is wrong (or doubtful) there.
Finding = tuple[tuple[str | int, ...], str]


def reference_errors(policy: Policy) -> list[Finding]:
    """Find references to pools, classes and tenants that the policy does not define."""
    errors: list[Finding] = []
    pools = ", ".join(policy.pools)
    if policy.default_slo_class not in policy.slo_classes:
        errors.append(
            (
                ("default_slo_class",),
                f"names SLO class {policy.default_slo_class!r}, which is not defined "
                f"(classes: {', '.join(policy.slo_classes)})",
            )
        )
    for name, pool in policy.pools.items():
        names = [b.name for b in pool.backends]
        if len(set(names)) != len(names):
            errors.append((("pools", name, "backends"), f"backend names repeat: {names}"))
        if any(b.kv_events for b in pool.backends):
            blind = [
                m for m in pool.models if m not in policy.models or not policy.models[m].tokenizer
            ]
            if blind:
                errors.append(
                    (
                        ("pools", name, "models"),
                        f"pool {name!r} has backends publishing KV events, but models "
                        f"{', '.join(map(repr, blind))} give no `tokenizer`: the gateway could "
                        "not key their prompts as the events do",
                    )
                )
        if pool.tariff is not None and pool.tariff not in policy.tariffs:
            known = ", ".join(policy.tariffs) or "none"
            errors.append(
                (
                    ("pools", name, "tariff"),
                    f"pool {name!r} names tariff {pool.tariff!r}, which is not defined "
                    f"(tariffs: {known})",
                )
            )
        reference = pool.go_live.reference
        if reference is not None and (reference == name or reference not in policy.pools):
            errors.append(
                (
                    ("pools", name, "go_live", "reference"),
                    f"pool {name!r} names reference {reference!r} for its precision check, which"
                    + (" is itself" if reference == name else f" is not a pool (pools: {pools})"),
                )
            )
    for name, windows in policy.tariffs.items():
        spans = sorted((w.seconds(), i) for i, w in enumerate(windows))
        for (start, end), i in spans:
            if end <= start:
                errors.append(
                    (
                        ("tariffs", name, i, "end"),
                        f"tariff {name!r} has a window ending at {windows[i].end}, not after its "
                        f"start {windows[i].start}",
                    )
                )
        for ((_, end), _), ((start, _), j) in itertools.pairwise(spans):
            if start < end:
                errors.append(
                    (
                        ("tariffs", name, j, "start"),
                        f"tariff {name!r} has windows that overlap at {windows[j].start}: "
                        "a time of day has one price",
                    )
                )
    for i, entry in enumerate(policy.tenants):
        named = [("default_slo_class", entry.default_slo_class)] if entry.default_slo_class else []
        named += [(f"slo_classes.{j}", c) for j, c in enumerate(entry.slo_classes)]
        for field, cls in named:
            if cls not in policy.slo_classes:
                errors.append(
                    (
                        ("tenants", i, *field.split(".")),
                        f"tenant {entry.name!r} names SLO class {cls!r}, which is not defined "
                        f"(classes: {', '.join(policy.slo_classes)})",
                    )
                )
    seen_routes: set[str] = set()
    tenants = {t.name for t in policy.tenants}
    for i, route in enumerate(policy.routes):
        where: tuple[str | int, ...] = ("routes", i)
        if route.name in seen_routes:
            errors.append(((*where, "name"), f"route name {route.name!r} is used twice"))
        seen_routes.add(route.name)
        for j, pool_name in enumerate(route.pools):
            listed = policy.pools.get(pool_name)
            if listed is None:
                errors.append(
                    (
                        (*where, "pools", j),
                        f"route {route.name!r} names pool {pool_name!r}, which is not defined "
                        f"(pools: {pools})",
                    )
                )
            elif not listed.live:
                errors.append(
                    (
                        (*where, "pools", j),
                        f"route {route.name!r} names pool {pool_name!r}, which is shadow-only "
                        "(live: false) and cannot serve clients",
                    )
                )
        if route.canary is not None:
            canary = policy.pools.get(route.canary.pool)
            if canary is None:
                errors.append(
                    (
                        (*where, "canary", "pool"),
                        f"route {route.name!r} rolls out pool {route.canary.pool!r}, which is not "
                        f"defined (pools: {pools})",
                    )
                )
            elif route.match.models and not set(route.match.models) & set(canary.models):
                errors.append(
                    (
                        (*where, "canary", "pool"),
                        f"route {route.name!r} rolls out pool {route.canary.pool!r}, which serves "
                        f"none of its models",
                    )
                )
        if route.fallback is not None:
            fallback = policy.pools.get(route.fallback)
            if fallback is None:
                errors.append(
                    (
                        (*where, "fallback"),
                        f"route {route.name!r} falls back to pool {route.fallback!r}, which is not "
                        f"defined (pools: {pools})",
                    )
                )
            elif not fallback.live:
                errors.append(
                    (
                        (*where, "fallback"),
                        f"route {route.name!r} falls back to shadow-only pool {route.fallback!r}",
                    )
                )
            elif route.match.models and not set(route.match.models) <= set(fallback.models):
                missing = sorted(set(route.match.models) - set(fallback.models))
                errors.append(
                    (
                        (*where, "fallback"),
                        f"route {route.name!r} falls back to pool {route.fallback!r}, which does "
                        f"not serve {missing}",
                    )
                )
        for j, cls in enumerate(route.match.slo_classes):
            if cls not in policy.slo_classes:
                errors.append(
                    (
                        (*where, "match", "slo_classes", j),
                        f"route {route.name!r} matches SLO class {cls!r}, which is not defined "
                        f"(classes: {', '.join(policy.slo_classes)})",
                    )
                )
        for j, tenant in enumerate(route.match.tenants):
            if tenant not in tenants:
                errors.append(
                    (
                        (*where, "match", "tenants", j),
                        f"route {route.name!r} matches tenant {tenant!r}, which is not defined",
                    )
                )
        r = route.match.prompt_tokens
        if r.max is not None and r.max < r.min:
            errors.append(((*where, "match", "prompt_tokens"), f"max {r.max} is below min {r.min}"))
        errors.extend(_shadow_errors(policy, where, route, tenants))
    return errors


def memory_errors(policy: Policy) -> list[Finding]:
    """Find pools whose models' weights, KV cache and headroom exceed a backend's memory."""
    errors: list[Finding] = []
    for name, pool in policy.pools.items():
        need = footprint(pool, policy)
        if need.fits():
            continue
        held = []
        for i, (model, weights) in enumerate(need.weights.items()):
            figures = [f"{weights / 1e9:.1f} GB" + (f" in {pool.precision}" if i == 0 else "")]
            if model not in policy.models:
                figures.append(f"{DEFAULT_PARAMS_B:g}B assumed, not in models")
            held.append(f"{model} ({', '.join(figures)})")
        kv = f"{need.kv_cache / 1e9:.1f} GB of KV cache"
        if pool.kv_cache_gb is None:
            kv += " (half its memory: kv_cache_gb is not given)"
        errors.append(
            (
                ("pools", name, "memory_gb"),
                f"pool {name!r} holds {', '.join(held)} and {kv} plus "
                f"{need.headroom / 1e9:.1f} GB of headroom ({HEADROOM:.0%} of memory): "
                f"{need.total / 1e9:.1f} GB, more than its {pool.memory_gb:g} GB; serve fewer "
                "or smaller models there, at a lower precision, with less KV cache, or on "
                "backends with more memory",
            )
        )
    return errors


def _comparison_errors(
    where: tuple[str | int, ...], comparison: Comparison, policy: Policy
) -> list[Finding]:
    errors: list[Finding] = []
    semantic = comparison.semantic_similarity
    if semantic is not None and not any(
        pool.live and semantic.model in pool.models for pool in policy.pools.values()
    ):
        errors.append(
            (
                (*where, "compare", "semantic_similarity", "model"),
                f"semantic similarity needs embedding model {semantic.model!r}, which no live"
                " pool serves",
            )
        )
    for k, name in enumerate(comparison.comparators):
        if name not in COMPARATORS:
            errors.append(
                (
                    (*where, "compare", "comparators", k),
                    f"comparator {name!r} is not known (comparators: {', '.join(COMPARATORS)})",
                )
            )
    similarity = [c for c in comparison.comparators if c in SIMILARITY]
    if len(similarity) > 1:
        errors.append(
            (
                (*where, "compare", "comparators"),
                f"lists {len(similarity)} similarity measures {similarity}; pick one",
            )
        )
    return errors


def _similarity_of(comparison: Comparison) -> str | None:
    return next((c for c in comparison.comparators if c in SIMILARITY), None)


def _shadow_errors(
    policy: Policy, where: tuple[str | int, ...], route: Route, tenants: set[str]
) -> list[Finding]:
    """Check a route's shadow targets and noise floor against the pools and tenants defined."""
    errors: list[Finding] = []
    seen: set[str] = set()
    for j, target in enumerate(route.shadow):
        at = (*where, "shadow", j)
        pool = policy.pools.get(target.pool)
        if target.pool in seen:
            errors.append(
                ((*at, "pool"), f"route {route.name!r} shadows pool {target.pool!r} twice")
            )
        seen.add(target.pool)
        if pool is None:
            errors.append(
                (
                    (*at, "pool"),
                    f"route {route.name!r} shadows pool {target.pool!r}, which is not defined "
                    f"(pools: {', '.join(policy.pools)})",
                )
            )
            continue
        # During a rollout the former primary shadows the canary: the reverse sample.
        if target.pool == route.pools[0] and route.canary is None:
            errors.append(
                (
                    (*at, "pool"),
                    f"route {route.name!r} shadows pool {target.pool!r}, which is its primary "
                    "pool; a same-pool sample is what noise_floor is for",
                )
            )
        models = target.match.models or route.match.models
        if models and not set(models) & set(pool.models):
            errors.append(
                (
                    (*at, "pool"),
                    f"route {route.name!r} shadows pool {target.pool!r}, which serves none of "
                    f"{sorted(models)}",
                )
            )
        for k, model in enumerate(target.match.models):
            if route.match.models and model not in route.match.models:
                errors.append(
                    (
                        (*at, "match", "models", k),
                        f"shadow target {target.pool!r} filters on model {model!r}, which route "
                        f"{route.name!r} never matches (models: {', '.join(route.match.models)})",
                    )
                )
        for k, tenant in enumerate(target.match.tenants):
            if tenant not in tenants:
                errors.append(
                    (
                        (*at, "match", "tenants", k),
                        f"shadow target {target.pool!r} filters on tenant {tenant!r}, which is "
                        "not defined",
                    )
                )
        r = target.match.prompt_tokens
        if r.max is not None and r.max < r.min:
            errors.append(((*at, "match", "prompt_tokens"), f"max {r.max} is below min {r.min}"))
        slots = pool.slots_per_backend * len(pool.backends)
        if int(target.budget.max_slot_share * slots) < 1:
            errors.append(
                (
                    (*at, "budget", "max_slot_share"),
                    f"{target.budget.max_slot_share} of pool {target.pool!r} ({slots} slots) is "
                    f"less than one slot; use at least {1 / slots:.3g}",
                )
            )
        errors.extend(_comparison_errors(at, target.compare, policy))
    # A route without one gets the default floor (Route.noise), measured as its first target.
    # A pool with a single backend needs no second one: that backend is asked again.
    noise = route.noise_floor
    if noise is None:
        return errors
    at = (*where, "noise_floor")
    errors.extend(_comparison_errors(at, noise.compare, policy))
    if noise.share == 0:
        return errors  # turned off: nothing is sampled, nothing to relate to the targets
    if not route.shadow:
        errors.append(
            (
                at,
                f"route {route.name!r} keeps a noise floor but shadows no pool; the noise floor "
                "is a share of its shadow samples",
            )
        )
    method = _similarity_of(noise.compare)
    for j, target in enumerate(route.shadow):
        if _similarity_of(target.compare) != method:
            errors.append(
                (
                    (*at, "compare", "comparators"),
                    f"the noise floor measures similarity with {method!r} but shadow target "
                    f"{target.pool!r} (shadow.{j}) with {_similarity_of(target.compare)!r}; use "
                    "one method so candidates are judged against a comparable floor",
                )
            )
    return errors


def retired(doc: Any) -> list[Finding]:
    """Find the retired keys a policy document still has: a pool's `runtime` (its engine and
    version in one string, now `engine` and `engine_version`). The loader reads it as 0022
    rewrites it, so a gateway serving a file that has it starts (and logs this); validation
    and apply refuse it, so no new version is stored with it."""
    pools = doc.get("pools") if isinstance(doc, dict) else None
    return [
        (("pools", name, "runtime"), retired_runtime(pool["runtime"], pool.get("engine")))
        for name, pool in (pools.items() if isinstance(pools, dict) else ())
        if isinstance(pool, dict) and "runtime" in pool
    ]
