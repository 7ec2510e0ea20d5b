"""The routing policy: typed models of the YAML an operator writes, and its loader.

A policy names the pools (backends and capability matrix), the SLO classes, the tenants and the
routes. Loading validates every field and every cross-reference; errors name the file, the line
and column, the field path and the bad value.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.compare.measures import COMPARATORS, DEFAULT_COMPARATORS, SIMILARITY
from gateway.errors import PolicyError, Problem

PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Strict(BaseModel):
    """Base for policy models: unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Backend(Strict):
    """One OpenAI-compatible server inside a pool."""

    name: str = ""
    url: str
    metrics_url: str | None = Field(
        default=None,
        description="Prometheus endpoint with the DCGM power series; default URL/metrics.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the key sent upstream as Authorization: "
        "Bearer; the policy names the variable, never the key.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            # Never quote the value: an operator who pasted the key itself must not see it logged.
            raise ValueError(
                "api_key_env names an environment variable (letters, digits and underscores, "
                "not starting with a digit) that holds the key, not the key itself"
            )
        return value


class PowerFigures(Strict):
    """Nominal power draw of one backend, as the vendor declares it."""

    idle_w: NonNegativeFloat
    max_w: PositiveFloat


class Price(Strict):
    """What one backend costs to run."""

    usd_per_hour: NonNegativeFloat = 0.0
    usd_per_kwh: NonNegativeFloat = 0.0


class PowerMetrics(Strict):
    """Where a pool's backends report energy: Prometheus metric names (DCGM's by default)."""

    energy_counter: str = Field(
        default="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        description="Cumulative energy in millijoules, one series per device.",
    )
    power_gauge: str = Field(
        default="DCGM_FI_DEV_POWER_USAGE", description="Instantaneous draw in watts."
    )


class Pool(Strict):
    """A set of backends of one hardware kind sharing one capability entry."""

    kind: str = Field(description="Hardware kind, e.g. gpu, asic, cim.")
    backends: list[Backend] = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    max_context: int = Field(gt=0, description="Longest prompt plus output, in tokens.")
    memory_gb: PositiveFloat
    slots_per_backend: int = Field(gt=0, description="Concurrent requests one backend takes.")
    precision: str = "bf16"
    compute_tflops: PositiveFloat
    bandwidth_gbs: PositiveFloat
    power: PowerFigures
    price: Price = Price()
    power_metrics: PowerMetrics | None = Field(
        default=PowerMetrics(),
        description="null: the backends expose no power; energy is estimated from `power`.",
    )
    live: bool = Field(
        default=True, description="False marks a shadow-only pool: never serves clients."
    )
    queue_depth: int = Field(default=256, ge=0, description="Requests that may wait for a slot.")
    kv_cache_gb: PositiveFloat | None = Field(
        default=None,
        description="Memory of one backend for KV cache, after weights; default half of memory.",
    )

    def kv_capacity_bytes(self) -> float:
        """Return the KV-cache memory of one backend, in bytes."""
        return (self.kv_cache_gb if self.kv_cache_gb is not None else self.memory_gb / 2) * 1e9


class SloClass(Strict):
    """Named latency targets, and how long a request of this class may wait or hang."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None
    max_queue_ms: NonNegativeFloat = Field(
        default=1000.0, description="Longest wait for a free slot before falling back."
    )
    timeout_s: PositiveFloat = Field(
        default=60.0, description="Upstream timeout for the first byte and between stream chunks."
    )


class TokenRange(Strict):
    """An inclusive range of prompt tokens."""

    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)

    def contains(self, tokens: int) -> bool:
        return tokens >= self.min and (self.max is None or tokens <= self.max)


class Match(Strict):
    """Which requests a route takes; an empty list matches anything."""

    models: list[str] = []
    prompt_tokens: TokenRange = TokenRange()
    slo_classes: list[str] = []
    tenants: list[str] = []


class ShadowMatch(Strict):
    """Which of a route's requests a shadow target copies; an empty list matches anything."""

    models: list[str] = []
    prompt_tokens: TokenRange = TokenRange()
    tenants: list[str] = []


class ShadowBudget(Strict):
    """The most load mirrored copies may put on a pool; past it a copy is dropped, never queued."""

    max_concurrent: int = Field(default=4, gt=0, description="Copies in flight at once.")
    max_per_second: PositiveFloat = Field(default=10.0, description="Copies sent per second.")
    max_slot_share: float = Field(
        default=0.25, gt=0, le=1, description="Share of the pool's slots copies may hold."
    )


class Comparison(Strict):
    """Which comparators measure a copy against the primary, and whether raw texts are kept."""

    comparators: list[str] = list(DEFAULT_COMPARATORS)
    store_text: bool = Field(
        default=False, description="Keep both raw answers on the shadow record."
    )
    text_retention_h: PositiveFloat = Field(
        default=72.0, description="Hours after which stored texts are erased."
    )


class ShadowTarget(Strict):
    """A candidate pool that receives a sampled copy of a route's requests, only to compare."""

    pool: str
    sample_rate: float = Field(ge=0, le=1, description="Share of matching requests copied.")
    match: ShadowMatch = ShadowMatch()
    compare: Comparison = Comparison()
    budget: ShadowBudget = ShadowBudget()


class NoiseFloor(Strict):
    """A same-pool (A/A) sample: how much two backends of the primary's own pool disagree."""

    share: float = Field(
        ge=0,
        le=1,
        description="Share of the route's shadow samples also sent to a second primary backend.",
    )
    compare: Comparison = Comparison()
    budget: ShadowBudget = ShadowBudget(max_concurrent=2, max_slot_share=0.1)


# A model whose size the policy does not give is assumed to be this big.
DEFAULT_PARAMS_B = 8.0
# KV-cache bytes per token per billion parameters: Llama-style grouped-query attention in bf16.
KV_BYTES_PER_TOKEN_PER_B = 16_384


class ModelSpec(Strict):
    """What routing needs to know about a model: its size and its KV cache per token."""

    params_b: PositiveFloat = Field(description="Parameters, in billions.")
    kind: Literal["chat", "embedding"] = "chat"
    kv_bytes_per_token: PositiveFloat | None = Field(
        default=None, description="KV-cache bytes one token holds; default from params_b."
    )


Objective = Literal["preference", "min_cost", "min_energy", "min_latency"]


class Canary(Strict):
    """A pool being rolled out on a route: it serves `weight` of the route's requests first."""

    pool: str
    weight: float = Field(ge=0, le=1)


class Route(Strict):
    """A rule: the requests it matches, the pools allowed in preference order, and the fallback.

    `shadow` lists the candidate pools that get a sampled copy; `noise_floor` measures the
    primary pool against itself so the candidates' diffs can be judged against it.
    """

    name: str = Field(min_length=1)
    match: Match = Match()
    pools: list[str] = Field(min_length=1)
    fallback: str | None = None
    objective: Objective = Field(
        default="preference",
        description="preference: the pools' order; min_cost / min_energy / min_latency: the "
        "learned cost model picks, among pools predicted to meet the SLO.",
    )
    shadow: list[ShadowTarget] = []
    noise_floor: NoiseFloor | None = None
    canary: Canary | None = Field(
        default=None,
        description="A candidate being rolled out: it serves this share of the route first.",
    )


class Promotion(Strict):
    """When shadow evidence promotes a candidate pool (see docs/promotion.md)."""

    quality_margin: float = Field(
        default=0.01, ge=0, le=1, description="Agreement may be this far below the noise floor."
    )
    latency_margin: float = Field(
        default=0.10, ge=0, description="Candidate p95 may exceed the primary's by this share."
    )
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    alpha: float = Field(default=0.05, gt=0, lt=1, description="Chance of a false promotion.")
    min_samples: int = Field(default=500, ge=1)
    min_window_days: float = Field(default=7.0, ge=0)
    rollout_steps: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default=[0.05, 0.25, 0.5, 1.0], min_length=1, description="Canary weights, in order."
    )
    step_minutes: PositiveFloat = Field(
        default=60.0, description="Time at each weight before its guards are checked."
    )
    guard_min_slo_attainment: float = Field(
        default=0.99, ge=0, le=1, description="Share of the canary's requests meeting the SLO."
    )
    guard_min_agreement: float = Field(
        default=0.95, ge=0, le=1, description="Agreement on the reverse shadow sample."
    )
    guard_min_requests: int = Field(
        default=20, ge=1, description="Canary requests a step needs before it can advance."
    )


class RateLimit(Strict):
    """How much a tenant may send, summed over every replica; each bursts to a minute's worth."""

    requests_per_minute: PositiveFloat | None = None
    tokens_per_minute: PositiveFloat | None = Field(
        default=None,
        description="Prompt tokens plus the output a request may generate (its max_tokens).",
    )

    def describe(self) -> str:
        parts = []
        if self.requests_per_minute is not None:
            parts.append(f"{self.requests_per_minute:g} requests a minute")
        if self.tokens_per_minute is not None:
            parts.append(f"{self.tokens_per_minute:g} tokens a minute")
        return ", ".join(parts) or "unlimited"


class Tenant(Strict):
    """A client identity, recognised by the SHA-256 of its API key (never the key itself)."""

    name: str = Field(min_length=1)
    api_key_sha256: list[str] = []
    default_slo_class: str | None = Field(
        default=None, description="The class of this tenant's requests without x-slo-class."
    )
    slo_classes: list[str] = Field(
        default=[], description="Classes this tenant may ask for with x-slo-class; empty: any."
    )
    slo_overrides: bool = Field(
        default=True, description="Whether x-slo-ttft-ms / x-slo-tpot-ms are honoured."
    )
    rate_limit: RateLimit | None = Field(
        default=None, description="Requests and tokens a minute; past them, 429 with Retry-After."
    )

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, values: list[str]) -> list[str]:
        for value in values:
            if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
                raise ValueError(
                    f"api_key_sha256 entries are 64 lowercase hex digits, got {value!r}"
                )
        return values


class Policy(Strict):
    """The whole routing policy."""

    pools: dict[str, Pool] = Field(min_length=1)
    slo_classes: dict[str, SloClass] = Field(min_length=1)
    default_slo_class: str
    routes: list[Route] = Field(min_length=1)
    models: dict[str, ModelSpec] = Field(
        default_factory=dict, description="Model sizes for the cost model's prior."
    )
    promotion: Promotion = Promotion()
    tenants: list[Tenant] = []
    require_tenant_key: bool = Field(
        default=False, description="Refuse requests whose key is not a known tenant's."
    )
    assumed_max_tokens: int = Field(
        default=256, gt=0, description="Output tokens reserved when a request names no max_tokens."
    )

    def tenant_for_key(self, api_key: str) -> Tenant | None:
        """Return the tenant whose key this is, or None."""
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        for tenant in self.tenants:
            if digest in tenant.api_key_sha256:
                return tenant
        return None

    def tenant_named(self, name: str) -> Tenant | None:
        """Return the tenant of this name, or None (e.g. for anonymous requests)."""
        for tenant in self.tenants:
            if tenant.name == name:
                return tenant
        return None

    def params_b(self, model: str) -> float:
        """Return a model's size in billions of parameters (DEFAULT_PARAMS_B when unlisted)."""
        spec = self.models.get(model)
        return spec.params_b if spec is not None else DEFAULT_PARAMS_B

    def kv_bytes_per_token(self, model: str) -> float:
        """Return the KV-cache bytes one token of this model holds."""
        spec = self.models.get(model)
        if spec is not None and spec.kv_bytes_per_token is not None:
            return spec.kv_bytes_per_token
        return KV_BYTES_PER_TOKEN_PER_B * self.params_b(model)

    def served_models(self) -> list[str]:
        """Return the models that live pools serve, in first-seen order."""
        seen: dict[str, None] = {}
        for pool in self.pools.values():
            if pool.live:
                seen.update(dict.fromkeys(pool.models))
        return list(seen)


def _reference_errors(policy: Policy) -> list[tuple[tuple[str | int, ...], str]]:
    """Find references to pools, classes and tenants that the policy does not define."""
    errors: list[tuple[tuple[str | int, ...], str]] = []
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


def _comparison_errors(
    where: tuple[str | int, ...], comparison: Comparison
) -> list[tuple[tuple[str | int, ...], str]]:
    errors: list[tuple[tuple[str | int, ...], str]] = []
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
) -> list[tuple[tuple[str | int, ...], str]]:
    """Check a route's shadow targets and noise floor against the pools and tenants defined."""
    errors: list[tuple[tuple[str | int, ...], str]] = []
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
        errors.extend(_comparison_errors(at, target.compare))
    noise = route.noise_floor
    if noise is None:
        return errors
    at = (*where, "noise_floor")
    if not route.shadow:
        errors.append(
            (
                at,
                f"route {route.name!r} keeps a noise floor but shadows no pool; the noise floor "
                "is a share of its shadow samples",
            )
        )
    serving = [*route.pools, *([route.fallback] if route.fallback else [])]
    if not any(len(policy.pools[p].backends) > 1 for p in serving if p in policy.pools):
        errors.append(
            (
                at,
                f"route {route.name!r} keeps a noise floor, but none of its pools "
                f"({', '.join(serving)}) has a second backend to compare against",
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
    errors.extend(_comparison_errors(at, noise.compare))
    return errors


def _name_backends(data: Any) -> Any:
    """Give unnamed backends the name POOL-INDEX, so headers and metrics have a stable label."""
    if isinstance(data, dict) and isinstance(data.get("pools"), dict):
        for pool_name, pool in data["pools"].items():
            if isinstance(pool, dict) and isinstance(pool.get("backends"), list):
                for i, backend in enumerate(pool["backends"]):
                    if isinstance(backend, dict) and not backend.get("name"):
                        backend["name"] = f"{pool_name}-{i}"
    return data


def _positions(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], yaml.Mark]:
    """Map each field path in a composed YAML document to where its value starts."""
    marks = {path: node.start_mark}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            marks.update(_positions(value, (*path, key.value)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.update(_positions(item, (*path, i)))
    return marks


def _locate(source: str, marks: dict[tuple[Any, ...], yaml.Mark], path: tuple[Any, ...]) -> str:
    """Return 'file:line:col' for the deepest part of the path found in the document."""
    for end in range(len(path), -1, -1):
        mark = marks.get(tuple(path[:end]))
        if mark is not None:
            return f"{source}:{mark.line + 1}:{mark.column + 1}"
    return source


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


Locator = Callable[[tuple[Any, ...], str], Problem]


def locator(text: str, source: str) -> Locator:
    """Return a function that turns (field path, message) into a Problem placed in the text."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        node = None
    marks = _positions(node) if node is not None else {}

    def problem(path: tuple[Any, ...], message: str) -> Problem:
        return Problem(_locate(source, marks, path), _dotted(path), message)

    return problem


def _invalid(problems: list[Problem]) -> PolicyError:
    return PolicyError("invalid policy:\n  " + "\n  ".join(map(str, problems)), problems)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML into a Policy, or raise PolicyError naming every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = Problem(where, "(document)", f"not valid YAML: {exc}")
        raise PolicyError(f"{source}: not valid YAML: {exc}", [problem]) from exc
    if not isinstance(data, dict):
        message = "a policy is a YAML mapping with pools, slo_classes and routes"
        raise PolicyError(f"{source}: {message}", [Problem(source, "(top level)", message)])
    at = locator(text, source)
    try:
        policy = Policy.model_validate(_name_backends(data))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            quiet = err["type"] == "missing" or loc[-1:] == ("api_key_env",)
            value = "" if quiet else f" (got {err['input']!r})"
            problems.append(at(loc, f"{err['msg']}{value}"))
        raise _invalid(problems) from exc
    problems = [at(path, message) for path, message in _reference_errors(policy)]
    if problems:
        raise _invalid(problems)
    return policy


def render_policy(policy: Policy) -> str:
    """Write a policy as YAML that parses back to an equal policy (defaults left out)."""
    return yaml.safe_dump(
        policy.model_dump(mode="json", exclude_defaults=True), sort_keys=False, width=100
    )


def json_schema() -> dict[str, Any]:
    """Return the JSON Schema of a policy file, generated from the typed model."""
    schema = Policy.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "shadow-gateway routing policy",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def content_hash(text: str) -> str:
    """Return the SHA-256 of a policy's text, the identity of a stored version."""
    return hashlib.sha256(text.encode()).hexdigest()


def load_policy(path: str | Path) -> Policy:
    """Read and validate the policy file at path."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from exc
    return parse_policy(text, str(path))
