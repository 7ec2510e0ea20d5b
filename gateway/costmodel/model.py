"""Evaluate the cost model on the request path: prior × learned residual, with upper bounds.

For each target (time to first token, time per output token, end to end, energy) the prediction is
`prior(x) · exp(w · φ(x))`, where φ are a few physically meaningful features of the request and
the pool's load, and w was learned from measurements (all zero before any: the prior alone). The
upper bound multiplies by exp(q), q a conformal quantile of the log residuals on held-out records,
so the router can check an SLO at a percentile rather than at the mean.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.policy.model import Policy, Pool
from gateway.policy.physics import Physics, physics
from gateway.policy.tariffs import Rate, own_rate

TARGETS = ("ttft", "tpot", "e2e", "energy")
FEATURES = (
    "bias",
    "log_prompt",
    "log_output",
    "log_concurrent",
    "load",
    "log_context",
    "context_past_4k",
    "context_past_16k",
)
# Where a decode step's KV reads may turn dearer: past what fast memory holds (an ASIC's SRAM,
# a cache), which the policy's figures do not say. Hinges at two sizes let the fit find a knee.
CONTEXT_KNEES = (4096, 16384)
# Upper-bound factor before anything was measured: the prior is a vendor sheet, not a promise.
PRIOR_LOG_BOUND = math.log(1.5)


def features(
    prompt: int, output: int, concurrent: int, slots: int, context: int
) -> tuple[float, ...]:
    """Return φ for a request on a backend that will have `concurrent` requests with it, whose
    KV cache will hold `context` tokens (every request's on it, this one's included)."""
    # Conditionals, not max(): this runs for every pool of every request.
    low, high = CONTEXT_KNEES
    return (
        1.0,
        math.log1p(prompt),
        math.log1p(output),
        math.log(concurrent) if concurrent > 1 else 0.0,
        concurrent / slots,
        math.log1p(context / 1000),
        math.log1p((context - low) / 1000) if context > low else 0.0,
        math.log1p((context - high) / 1000) if context > high else 0.0,
    )


@dataclass(frozen=True, slots=True)
class Residual:
    """A learned correction of one target: weights over φ and the log upper-bound margin."""

    weights: tuple[float, ...] = (0.0,) * len(FEATURES)
    log_bound: float = PRIOR_LOG_BOUND
    upper: float = field(init=False)  # exp(log_bound), the bound's factor, computed once

    def __post_init__(self) -> None:
        object.__setattr__(self, "upper", math.exp(self.log_bound))

    def factor(self, phi: tuple[float, ...]) -> float:
        w = self.weights  # unrolled: this runs for every target of every pool of every request
        return math.exp(
            w[0] * phi[0]
            + w[1] * phi[1]
            + w[2] * phi[2]
            + w[3] * phi[3]
            + w[4] * phi[4]
            + w[5] * phi[5]
            + w[6] * phi[6]
            + w[7] * phi[7]
        )


@dataclass(slots=True)
class Prediction:
    """What one request is expected to take and cost on one pool."""

    pool: str
    output_tokens: int
    concurrent: int
    queue_s: float
    ttft_s: float
    ttft_upper_s: float
    tpot_s: float
    tpot_upper_s: float
    e2e_s: float
    e2e_upper_s: float
    energy_j: float
    marginal_energy_j: float
    cost_usd: float
    marginal_cost_usd: float
    carbon_g: float
    marginal_carbon_g: float
    rate: Rate

    def describe(self) -> str:
        return (
            f"ttft {self.ttft_s * 1e3:.0f} ms (p90 {self.ttft_upper_s * 1e3:.0f}), "
            f"tpot {self.tpot_s * 1e3:.1f} ms (p90 {self.tpot_upper_s * 1e3:.1f}), "
            f"e2e {self.e2e_s * 1e3:.0f} ms, energy {self.energy_j:.2f} J "
            f"(marginal {self.marginal_energy_j:.2f} J), cost ${self.marginal_cost_usd:.2e}, "
            f"carbon {self.marginal_carbon_g:.3f} g at ${self.rate.usd_per_kwh:g}/kWh and "
            f"{self.rate.g_co2_per_kwh:g} g/kWh"
        )


class PoolModel:
    """The prior and the learned residuals of one model on one pool, ready to evaluate fast."""

    __slots__ = ("_e2e", "_energy", "_own", "_per_hour", "_tpot", "_ttft", "physics", "pool")

    def __init__(self, pool: Pool, physics: Physics, residuals: Mapping[str, Residual]):
        self.pool = pool
        self.physics = physics
        self._ttft = residuals.get("ttft", _PRIOR)
        self._tpot = residuals.get("tpot", _PRIOR)
        self._e2e = residuals.get("e2e", _PRIOR)
        self._energy = residuals.get("energy", _PRIOR)
        self._own = own_rate(pool)
        self._per_hour = pool.price.usd_per_hour / 3600

    def predict(
        self,
        name: str,
        prompt: int,
        output: int,
        concurrent: int,
        queue_s: float = 0.0,
        rate: Rate | None = None,
        context: int | None = None,
    ) -> Prediction:
        """Predict a request of `prompt` and `output` tokens joining `concurrent - 1` others on a
        backend whose KV cache will hold `context` tokens (its own alone when None), its energy
        priced at `rate` (the pool's own price when None)."""
        phys = self.physics
        own = prompt + output
        context = own if context is None else context
        phi = features(prompt, output, concurrent, phys.slots, context)
        prefill_prior = phys.ttft_s(prompt)
        step_prior = phys.tpot_s(concurrent)
        prefill = prefill_prior * self._ttft.factor(phi)
        tpot = step_prior * self._tpot.factor(phi)
        # The batch it joins: the others' steps as they are now, and the slot time the request
        # adds to them by making each step longer (a price a lone request's view would miss).
        others = concurrent - 1
        slowed = 0.0
        if others > 0 and output > 1:
            rest = context - own if context > own else 0  # the others' KV cache alone
            before = features(prompt, output, others, phys.slots, rest)
            step_before = phys.tpot_s(others) * self._tpot.factor(before)
            if tpot > step_before:
                slowed = others * (output - 1) * (tpot - step_before)
        service_prior = prefill_prior + (output - 1 if output > 1 else 0) * step_prior
        service = service_prior * self._e2e.factor(phi)
        watts = phys.watts(concurrent)
        # What the meter will attribute: the device's draw shared with the others in flight.
        energy = service_prior * watts / concurrent * self._energy.factor(phi)
        marginal_energy = energy * (watts - phys.idle_w) / watts if watts > 0 else 0.0
        rate = rate or self._own
        per_j = rate.usd_per_j
        return Prediction(
            name,
            output,
            concurrent,
            queue_s,
            queue_s + prefill,
            queue_s + prefill * self._ttft.upper,
            tpot,
            tpot * self._tpot.upper,
            queue_s + service,
            queue_s + service * self._e2e.upper,
            energy,
            marginal_energy,
            energy * per_j + service * self._per_hour / concurrent,
            marginal_energy * per_j + (service + slowed) * self._per_hour / phys.slots,
            energy * rate.g_co2_per_j,
            marginal_energy * rate.g_co2_per_j,
            rate,
        )


_PRIOR = Residual()


class OutputLengths:
    """Expect output lengths from what each route has produced lately, capped by max_tokens."""

    def __init__(self, default: int = 256, window: int = 500):
        self.default = default
        self._window = window
        self._seen: dict[str, deque[int]] = {}
        self._sum: dict[str, int] = {}

    def expect(self, route: str, max_tokens: int | None) -> int:
        seen = self._seen.get(route)
        guess = round(self._sum[route] / len(seen)) if seen else self.default
        return max(1, min(guess, max_tokens) if max_tokens else guess)

    def observe(self, route: str, completion_tokens: int) -> None:
        seen = self._seen.get(route)
        if seen is None:
            seen = self._seen[route] = deque(maxlen=self._window)
            self._sum[route] = 0
        if len(seen) == seen.maxlen:
            self._sum[route] -= seen[0]  # a running sum: the window's mean costs nothing to keep
        seen.append(completion_tokens)
        self._sum[route] += completion_tokens


@dataclass
class CostModel:
    """Every pool's model for every model name it serves; the prior until trained."""

    policy: Policy
    version: int = 0
    trained: Mapping[tuple[str, str], Mapping[str, Residual]] = field(default_factory=dict)
    _cache: dict[tuple[str, str], PoolModel] = field(default_factory=dict, repr=False)

    def pool_model(self, pool: str, model: str) -> PoolModel:
        key = (pool, model)
        cached = self._cache.get(key)
        if cached is None:
            spec = self.policy.pools[pool]
            phys = physics(spec, self.policy.params_b(model), self.policy.kv_bytes_per_token(model))
            cached = PoolModel(spec, phys, self.trained.get(key, {}))
            self._cache[key] = cached
        return cached

    def predict(
        self,
        pool: str,
        model: str,
        prompt: int,
        output: int,
        concurrent: int,
        queue_s: float = 0.0,
        rate: Rate | None = None,
        context: int | None = None,
    ) -> Prediction:
        """Predict one request on one pool, its energy priced at `rate` (else the pool's own)."""
        return self.pool_model(pool, model).predict(
            pool, prompt, output, concurrent, queue_s, rate, context
        )
