"""The routing policy: typed models of the YAML an operator writes, and its loader.

A policy names the pools (backends and capability matrix), the SLO classes, the tenants and the
routes. Loading validates every field and every cross-reference; errors name the file, the line
and column, the field path and the bad value.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import PolicyError

PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


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

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


class PowerFigures(Strict):
    """Nominal power draw of one backend, as the vendor declares it."""

    idle_w: NonNegativeFloat
    max_w: PositiveFloat


class Price(Strict):
    """What one backend costs to run."""

    usd_per_hour: NonNegativeFloat = 0.0
    usd_per_kwh: NonNegativeFloat = 0.0


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
    live: bool = Field(
        default=True, description="False marks a shadow-only pool: never serves clients."
    )
    queue_depth: int = Field(default=256, ge=0, description="Requests that may wait for a slot.")


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


class Route(Strict):
    """A rule: the requests it matches, the pools allowed in preference order, and the fallback."""

    name: str = Field(min_length=1)
    match: Match = Match()
    pools: list[str] = Field(min_length=1)
    fallback: str | None = None


class Tenant(Strict):
    """A client identity, recognised by the SHA-256 of its API key (never the key itself)."""

    name: str = Field(min_length=1)
    api_key_sha256: list[str] = []

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
    tenants: list[Tenant] = []
    require_tenant_key: bool = Field(
        default=False, description="Refuse requests whose key is not a known tenant's."
    )
    assumed_max_tokens: int = Field(
        default=256, gt=0, description="Output tokens reserved when a request names no max_tokens."
    )

    def tenant_for_key(self, api_key: str) -> str | None:
        """Return the tenant whose key this is, or None."""
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        for tenant in self.tenants:
            if digest in tenant.api_key_sha256:
                return tenant.name
        return None

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


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML into a Policy, or raise PolicyError naming every problem."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or node is None:
        raise PolicyError(
            f"{source}: a policy is a YAML mapping with pools, slo_classes and routes"
        )
    marks = _positions(node)
    try:
        policy = Policy.model_validate(_name_backends(data))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            value = "" if err["type"] == "missing" else f" (got {err['input']!r})"
            lines.append(f"{_locate(source, marks, loc)}: {_dotted(loc)}: {err['msg']}{value}")
        raise PolicyError("invalid policy:\n  " + "\n  ".join(lines)) from exc
    problems = _reference_errors(policy)
    if problems:
        lines = [f"{_locate(source, marks, p)}: {_dotted(p)}: {msg}" for p, msg in problems]
        raise PolicyError("invalid policy:\n  " + "\n  ".join(lines))
    return policy


def load_policy(path: str | Path) -> Policy:
    """Read and validate the policy file at path."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc.strerror}") from exc
    return parse_policy(text, str(path))
