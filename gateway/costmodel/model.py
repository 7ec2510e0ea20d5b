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

from gateway.costmodel.prior import Physics, physics
from gateway.policy import Policy, Pool

TARGETS = ("ttft", "tpot", "e2e", "energy")
FEATURES = ("bias", "log_prompt", "log_output", "log_concurrent", "load")
# Upper-bound factor before anything was measured: the prior is a vendor sheet, not a promise.
PRIOR_LOG_BOUND = math.log(1.5)


def features(prompt: int, output: int, concurrent: int, slots: int) -> tuple[float, ...]:
    """Return φ for a request on a backend that will have `concurrent` requests with it."""
    return (
        1.0,
        math.log1p(prompt),
        math.log1p(output),
        math.log(max(concurrent, 1)),
        concurrent / slots,
    )


@dataclass(frozen=True, slots=True)
class Residual:
    """A learned correction of one target: weights over φ and the log upper-bound margin."""

    weights: tuple[float, ...] = (0.0,) * len(FEATURES)
    log_bound: float = PRIOR_LOG_BOUND

    def factor(self, phi: tuple[float, ...]) -> float:
        w = self.weights
        return math.exp(
            w[0] * phi[0] + w[1] * phi[1] + w[2] * phi[2] + w[3] * phi[3] + w[4] * phi[4]
        )


@dataclass(frozen=True, slots=True)
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

    def describe(self) -> str:
        return (
            f"ttft {self.ttft_s * 1e3:.0f} ms (p90 {self.ttft_upper_s * 1e3:.0f}), "
            f"tpot {self.tpot_s * 1e3:.1f} ms (p90 {self.tpot_upper_s * 1e3:.1f}), "
            f"e2e {self.e2e_s * 1e3:.0f} ms, energy {self.energy_j:.2f} J "
            f"(marginal {self.marginal_energy_j:.2f} J), cost ${self.marginal_cost_usd:.2e}"
        )


@dataclass(frozen=True, slots=True)
class PoolModel:
    """The prior and the learned residuals of one model on one pool."""

    pool: Pool
    physics: Physics
    residuals: Mapping[str, Residual] = field(default_factory=dict)

    def predict(
        self, name: str, prompt: int, output: int, concurrent: int, queue_s: float = 0.0
    ) -> Prediction:
        """Predict a request of `prompt` and `output` tokens joining `concurrent - 1` others."""
        phys = self.physics
        phi = features(prompt, output, concurrent, phys.slots)
        r = self.residuals
        none = _PRIOR
        ttft_r, tpot_r = r.get("ttft", none), r.get("tpot", none)
        e2e_r, energy_r = r.get("e2e", none), r.get("energy", none)
        prefill = phys.ttft_s(prompt) * ttft_r.factor(phi)
        tpot = phys.tpot_s(concurrent) * tpot_r.factor(phi)
        service_prior = phys.ttft_s(prompt) + max(output - 1, 0) * phys.tpot_s(concurrent)
        service = service_prior * e2e_r.factor(phi)
        watts = phys.watts(concurrent)
        # What the meter will attribute: the device's draw shared with the others in flight.
        energy = service_prior * watts / concurrent * energy_r.factor(phi)
        dynamic_share = (watts - phys.idle_w) / watts if watts > 0 else 0.0
        marginal_energy = energy * dynamic_share
        price = self.pool.price
        slot_cost = service * price.usd_per_hour / 3600 / phys.slots
        return Prediction(
            pool=name,
            output_tokens=output,
            concurrent=concurrent,
            queue_s=queue_s,
            ttft_s=queue_s + prefill,
            ttft_upper_s=queue_s + prefill * math.exp(ttft_r.log_bound),
            tpot_s=tpot,
            tpot_upper_s=tpot * math.exp(tpot_r.log_bound),
            e2e_s=queue_s + service,
            e2e_upper_s=queue_s + service * math.exp(e2e_r.log_bound),
            energy_j=energy,
            marginal_energy_j=marginal_energy,
            cost_usd=energy * price.usd_per_kwh / 3.6e6
            + service * price.usd_per_hour / 3600 / concurrent,
            marginal_cost_usd=marginal_energy * price.usd_per_kwh / 3.6e6 + slot_cost,
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
    ) -> Prediction:
        """Predict one request on one pool."""
        return self.pool_model(pool, model).predict(pool, prompt, output, concurrent, queue_s)
