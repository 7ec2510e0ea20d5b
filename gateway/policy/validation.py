"""Check a policy before it is applied: the loader's errors, plus warnings an operator should read.

Errors make a policy invalid: it is never applied. They are the loader's, the memory check (a
pool whose models, KV cache and headroom do not fit a backend's memory,
gateway/policy/consistency.py), and a retired key the loader still reads (a pool's `runtime`).
Warnings name things that load but are probably not what the operator meant: a route that can
never match because an earlier one takes all of its requests, a model a route matches but none
of its pools serves, a prompt range longer than every pool's context, an SLO target that no
allowed pool can meet even by the capability matrix's own figures, a route without a fallback
or whose fallback is not a GPU pool, a fallback missing some of a route's models, a pool no
route uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from gateway.errors import PolicyError, Problem
from gateway.policy.consistency import Finding, memory_errors, retired
from gateway.policy.credentials import Access
from gateway.policy.definition import Match, Policy, Route
from gateway.policy.load import PolicyLoader, locator, parse_policy
from gateway.policy.physics import physics


@dataclass(frozen=True)
class Validation:
    """The verdict on a policy text: the policy if it loads, its errors and its warnings."""

    policy: Policy | None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.policy is not None and not self.errors

    def accepted(self) -> Policy:
        """Return the policy, or raise PolicyError naming every error."""
        if self.policy is None or self.errors:
            raise PolicyError(
                "invalid policy:\n  " + "\n  ".join(map(str, self.errors)), self.errors
            )
        return self.policy


def validate(
    text: str,
    source: str = "<policy>",
    access: Access | None = None,
    *,
    serving: bool = True,
) -> Validation:
    """Load a policy text and report its errors, or its warnings when it loads.

    Given the upstream access of the gateway that is to serve it (`serving`), a key variable
    unset there, or a key or backend off its hosts, is an error too: that gateway would refuse
    the policy. Given another's (the CLI's, where no secret need be kept), it is a warning.
    """
    try:
        policy = parse_policy(text, source)
    except PolicyError as exc:
        problems = exc.problems or [Problem(source, "(top level)", str(exc))]
        return Validation(None, problems)
    at = locator(text, source)
    old = retired(yaml.load(text, Loader=PolicyLoader))
    refused = [at(path, message) for path, message in [*old, *memory_errors(policy)]]
    found = [at(path, message) for path, message in warnings(policy)]
    if access is None:
        return Validation(policy, refused, found)
    if serving:
        refused += [at(p, m) for p, m in access.findings(policy)]
        return Validation(policy, refused, found)
    where = "here; every gateway that serves this policy needs it"
    doubtful = [at(p, m) for p, m in access.findings(policy, where)]
    return Validation(policy, refused, found + doubtful)


def warnings(policy: Policy) -> list[Finding]:
    """Find what loads but probably does not do what the operator meant."""
    found: list[Finding] = []
    for i, route in enumerate(policy.routes):
        where = ("routes", i)
        for earlier in policy.routes[:i]:
            if _covers(earlier.match, route.match):
                found.append(
                    (
                        (*where, "match"),
                        f"route {route.name!r} can never match: route {earlier.name!r} before "
                        "it takes every request it would match",
                    )
                )
                break
        found.extend(_serving_warnings(policy, where, route))
        found.extend(_slo_warnings(policy, where, route))
    used = {p for r in policy.routes for p in (*r.pools, r.fallback, *(t.pool for t in r.shadow))}
    for name in policy.pools:
        if name not in used:
            found.append((("pools", name), f"pool {name!r} is not used by any route"))
    return found


def _covers(first: Match, then: Match) -> bool:
    """Return whether every request `then` matches is also matched by `first`."""

    def within(outer: list[str], inner: list[str]) -> bool:
        return not outer or (bool(inner) and set(inner) <= set(outer))

    a, b = first.prompt_tokens, then.prompt_tokens
    in_range = b.min >= a.min and (a.max is None or (b.max is not None and b.max <= a.max))
    return (
        within(first.models, then.models)
        and within(first.slo_classes, then.slo_classes)
        and within(first.tenants, then.tenants)
        and in_range
    )


def _serving_warnings(policy: Policy, where: tuple[str | int, ...], route: Route) -> list[Finding]:
    found: list[Finding] = []
    pools = [policy.pools[p] for p in route.pools if p in policy.pools]
    for k, model in enumerate(route.match.models):
        if not any(model in pool.models for pool in pools):
            found.append(
                (
                    (*where, "match", "models", k),
                    f"route {route.name!r} matches model {model!r}, which none of its pools "
                    f"({', '.join(route.pools)}) serves",
                )
            )
    longest = max((pool.max_context for pool in pools), default=0)
    if route.match.prompt_tokens.min >= longest > 0:
        found.append(
            (
                (*where, "match", "prompt_tokens", "min"),
                f"route {route.name!r} takes prompts of at least {route.match.prompt_tokens.min} "
                f"tokens, but the longest context of its pools is {longest}",
            )
        )
    fallback = policy.pools.get(route.fallback) if route.fallback else None
    if route.fallback is None:
        found.append(
            (
                (*where, "fallback"),
                f"route {route.name!r} has no fallback: when its pools "
                f"({', '.join(route.pools)}) are full past the queue budget, its requests are "
                "refused (429 no_capacity)",
            )
        )
    elif fallback is not None and fallback.kind != "gpu":
        found.append(
            (
                (*where, "fallback"),
                f"route {route.name!r} falls back to pool {route.fallback!r}, of kind "
                f"{fallback.kind!r}, not gpu: the fallback serves what the route's pools cannot, "
                "and GPUs serve any model at reference precision",
            )
        )
    if fallback is not None and not route.match.models:
        served = {m for pool in pools for m in pool.models}
        missing = sorted(served - set(fallback.models))
        if missing:
            found.append(
                (
                    (*where, "fallback"),
                    f"route {route.name!r} falls back to pool {route.fallback!r}, which does not "
                    f"serve {missing}: those requests have no fallback",
                )
            )
    return found


def _slo_warnings(policy: Policy, where: tuple[str | int, ...], route: Route) -> list[Finding]:
    """Warn when no pool of the route meets a class's target, even idle, by its nominal figures.

    A warning, not an error: the figures are the vendor's, and the cost model learns the truth.
    """
    found: list[Finding] = []
    pools = {p: policy.pools[p] for p in route.pools if p in policy.pools}
    models = route.match.models or sorted({m for pool in pools.values() for m in pool.models})
    prompt = max(route.match.prompt_tokens.min, 1)
    for cls in route.match.slo_classes or list(policy.slo_classes):
        slo = policy.slo_classes.get(cls)
        if slo is None:
            continue
        for model in models:
            serving = {n: p for n, p in pools.items() if model in p.models}
            if not serving:
                continue
            phys = {
                n: physics(p, policy.params_b(model), policy.kv_bytes_per_token(model))
                for n, p in serving.items()
            }
            for target, limit, predicted in (
                ("ttft_ms", slo.ttft_ms, {n: f.ttft_s(prompt) * 1e3 for n, f in phys.items()}),
                ("tpot_ms", slo.tpot_ms, {n: f.tpot_s(1) * 1e3 for n, f in phys.items()}),
            ):
                best = min(predicted, key=predicted.__getitem__)
                if limit is not None and predicted[best] > limit:
                    found.append(
                        (
                            ("slo_classes", cls, target),
                            f"no pool of route {route.name!r} can meet {cls} {target} {limit:g} "
                            f"for {model!r}: the fastest by its nominal figures, {best!r}, takes "
                            f"{predicted[best]:.0f} ms idle",
                        )
                    )
    return found
