"""Evaluate the cost model on the request path: prior × learned residual, with upper bounds.

For each target (time to first token, time per output token, end to end, energy) the prediction is
`prior(x) · exp(w · φ(x))`, where φ are a few physically meaningful features of the request and
the pool's load, with their squares and products, and w was learned from measurements (all zero
before any: the prior alone). The upper bound multiplies by exp(q), q a conformal quantile of the
log residuals on held-out records, so the router can check an SLO at a percentile rather than at
the mean.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import exp, log1p  # the request path's calls, without the module lookup
from typing import NamedTuple

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
    # The curvature a line in logs misses (bench/cost_model_fit.py: the ASIC's energy error
    # 9.0 -> 7.5 %), read within the span training saw.
    "log_prompt_squared",
    "log_output_squared",
    "log_prompt_x_log_output",
    "log_concurrent_squared",
    "log_prompt_x_log_concurrent",
    "log_output_x_log_concurrent",
    "log_context_x_log_concurrent",
)
# Where a decode step's KV reads may turn dearer: past what fast memory holds (an ASIC's SRAM,
# a cache), which the policy's figures do not say. Hinges at two sizes let the fit find a knee.
CONTEXT_KNEES = (4096, 16384)
# Upper-bound factor before anything was measured: the prior is a vendor sheet, not a promise.
PRIOR_LOG_BOUND = math.log(1.5)
_UNBOUNDED = (-math.inf, math.inf)


class Span(NamedTuple):
    """The lowest and highest log prompt, log output and log concurrency training saw.

    The squares and the prompt-output product read their inputs clamped to it, and the products
    with log concurrency read it clamped (prompt, output and context as they are): a fit's
    curvature holds only where it was measured, and beyond it the prior's physics and the
    linear terms carry the prediction. It is the span of the whole group of observations, each
    target's fit included.
    """

    log_prompt: tuple[float, float] = _UNBOUNDED
    log_output: tuple[float, float] = _UNBOUNDED
    log_concurrent: tuple[float, float] = _UNBOUNDED


UNBOUNDED = Span()  # before training: nothing to clamp to


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return low if value < low else high if value > high else value


def features(
    prompt: int, output: int, concurrent: int, slots: int, context: int, span: Span = UNBOUNDED
) -> tuple[float, ...]:
    """Return φ for a request on a backend that will have `concurrent` requests with it, whose
    KV cache will hold `context` tokens (every request's on it, this one's included), its
    quadratic terms within `span`.

    The definition: training computes it a column at a time (`train.design`) and
    `PoolModel.predict` inline, and tests hold both to it.
    """
    low, high = CONTEXT_KNEES
    log_prompt = math.log1p(prompt)
    log_output = math.log1p(output)
    log_concurrent = math.log(concurrent) if concurrent > 1 else 0.0
    log_context = math.log1p(context / 1000)
    p = _clamp(log_prompt, span.log_prompt)
    o = _clamp(log_output, span.log_output)
    c = _clamp(log_concurrent, span.log_concurrent)
    return (
        1.0,
        log_prompt,
        log_output,
        log_concurrent,
        concurrent / slots,
        log_context,
        math.log1p((context - low) / 1000) if context > low else 0.0,
        math.log1p((context - high) / 1000) if context > high else 0.0,
        p * p,
        o * o,
        p * o,
        c * c,
        log_prompt * c,
        log_output * c,
        log_context * c,
    )


@dataclass(frozen=True, slots=True)
class Residual:
    """A learned correction of one target: weights over φ and the log upper-bound margin."""

    weights: tuple[float, ...] = (0.0,) * len(FEATURES)
    log_bound: float = PRIOR_LOG_BOUND
    upper: float = field(init=False)  # exp(log_bound), the bound's factor, computed once

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES):
            raise ValueError(
                f"a residual has {len(self.weights)} weights; expected one per feature "
                f"({len(FEATURES)}: {', '.join(FEATURES)})"
            )
        object.__setattr__(self, "upper", math.exp(self.log_bound))

    def factor(self, phi: tuple[float, ...]) -> float:
        """Return exp(w · φ): the definition `PoolModel.predict` evaluates, its terms grouped."""
        return math.exp(math.fsum(w * x for w, x in zip(self.weights, phi, strict=True)))


@dataclass(frozen=True, slots=True)
class Learned:
    """What training learned of one model on one pool: a residual per target it could fit, and
    the span of inputs its observations covered."""

    residuals: Mapping[str, Residual] = field(default_factory=dict)
    span: Span = UNBOUNDED


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
    """The prior and the learned residuals of one model on one pool, ready to evaluate fast.

    What does not depend on the request is computed once, when the cost model is built: each
    target's weights as plain floats, and for every concurrency a backend takes, the prior's
    decode step and draw and, per target, the sum of the terms of φ that depend on the batch
    alone and the coefficients the batch gives log prompt, log output and log context (their
    products with log concurrency folded in). `predict` evaluates `features` and
    `Residual.factor` inline from them (tests/costmodel/test_model.py), in about 0.6 of the time
    their calls, the tuples between them and the prior's methods took (docs/routing.md,
    "Decision time").
    """

    __slots__ = (
        "_by_concurrent",
        "_e2e_upper",
        "_own",
        "_own_g_co2_per_j",
        "_own_usd_per_j",
        "_per_hour",
        "_request_weights",
        "_span",
        "_span_bounds",
        "_steps_by_concurrent",
        "_tpot_upper",
        "_ttft_upper",
        "_weights",
        "physics",
        "pool",
    )

    def __init__(self, pool: Pool, physics: Physics, learned: Learned):
        self.pool = pool
        self.physics = physics
        residuals = learned.residuals
        ttft, tpot, e2e, energy = (residuals.get(target, _PRIOR) for target in TARGETS)
        # Plain floats, which the arithmetic below specialises on (a stored version's JSON
        # could give ints).
        self._weights = tuple(tuple(float(w) for w in r.weights) for r in (ttft, tpot, e2e, energy))
        # Per target, the weights of the terms that depend on the request alone; flat, as the
        # tables below are, so that `predict` takes each in one unpacking.
        self._request_weights = tuple(x for w in self._weights for x in w[6:11])
        self._span = learned.span
        self._span_bounds = (*learned.span.log_prompt, *learned.span.log_output)
        self._ttft_upper = ttft.upper
        self._tpot_upper = tpot.upper
        self._e2e_upper = e2e.upper
        self._own = own_rate(pool)
        self._own_usd_per_j = self._own.usd_per_j
        self._own_g_co2_per_j = self._own.g_co2_per_j
        self._per_hour = pool.price.usd_per_hour / 3600
        self._by_concurrent = [self._at_concurrency(n) for n in range(physics.slots + 1)]
        self._steps_by_concurrent = [_step(batch) for batch in self._by_concurrent]

    def _at_concurrency(self, concurrent: int) -> _Batch:
        """Return what depends on the batch alone: the prior's decode step and draw, and per
        target the batch's terms of w · φ and its coefficients of log prompt, log output and
        log context, as `features` computes φ."""
        phys = self.physics
        log_concurrent = math.log(concurrent) if concurrent > 1 else 0.0
        load = concurrent / phys.slots
        c = _clamp(log_concurrent, self._span.log_concurrent)
        per_target = (
            (
                w[0] + w[3] * log_concurrent + w[4] * load + w[11] * c * c,
                w[1] + w[12] * c,
                w[2] + w[13] * c,
                w[5] + w[14] * c,
            )
            for w in self._weights
        )
        return (phys.tpot_s(concurrent), phys.watts(concurrent), *itertools.chain(*per_target))

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
        by_concurrent = self._by_concurrent
        # The batch's terms and coefficients, per target.
        (
            step_prior, watts,
            a0, a1, a2, a5,  # ttft
            b0, b1, b2, b5,  # tpot
            c0, c1, c2, c5,  # e2e
            d0, d1, d2, d5,  # energy
        ) = (
            by_concurrent[concurrent]
            if 0 <= concurrent < len(by_concurrent)
            else self._at_concurrency(concurrent)
        )  # fmt: skip
        # The rest of φ as `features` computes it, the quadratic terms within the span.
        log_prompt = log1p(prompt)
        log_output = log1p(output)
        log_context = log1p(context / 1000)
        past_low = log1p((context - _KNEE_LOW) / 1000) if context > _KNEE_LOW else 0.0
        past_high = log1p((context - _KNEE_HIGH) / 1000) if context > _KNEE_HIGH else 0.0
        low, high, low_o, high_o = self._span_bounds
        p = low if log_prompt < low else high if log_prompt > high else log_prompt
        o = low_o if log_output < low_o else high_o if log_output > high_o else log_output
        pp, oo, po = p * p, o * o, p * o
        # The weights of the terms that depend on the request alone, per target.
        (
            a6, a7, a8, a9, a10,
            b6, b7, b8, b9, b10,
            c6, c7, c8, c9, c10,
            d6, d7, d8, d9, d10,
        ) = self._request_weights  # fmt: skip
        prefill_prior = phys.prefill_fixed_s + phys.prefill_per_token_s * prompt
        prefill = prefill_prior * exp(
            a0
            + a1 * log_prompt
            + a2 * log_output
            + a5 * log_context
            + a6 * past_low
            + a7 * past_high
            + a8 * pp
            + a9 * oo
            + a10 * po
        )
        # The request's own terms of the step's sum, shared with the batch's step without it.
        step_own = b8 * pp + b9 * oo + b10 * po
        tpot = step_prior * exp(
            b0
            + b1 * log_prompt
            + b2 * log_output
            + b5 * log_context
            + b6 * past_low
            + b7 * past_high
            + step_own
        )
        # The batch it joins: the others' steps as they are now, and the slot time the request
        # adds to them by making each step longer (a price a lone request's view would miss).
        others = concurrent - 1
        slowed = 0.0
        if others > 0 and output > 1:
            rest = context - own if context > own else 0  # the others' KV cache alone
            steps = self._steps_by_concurrent
            step_prior_before, e0, e1, e2, e5 = (
                steps[others] if others < len(steps) else _step(self._at_concurrency(others))
            )
            step_before = step_prior_before * exp(
                e0
                + e1 * log_prompt
                + e2 * log_output
                + e5 * log1p(rest / 1000)
                + b6 * (log1p((rest - _KNEE_LOW) / 1000) if rest > _KNEE_LOW else 0.0)
                + b7 * (log1p((rest - _KNEE_HIGH) / 1000) if rest > _KNEE_HIGH else 0.0)
                + step_own
            )
            if tpot > step_before:
                slowed = others * (output - 1) * (tpot - step_before)
        service_prior = prefill_prior + (output - 1 if output > 1 else 0) * step_prior
        service = service_prior * exp(
            c0
            + c1 * log_prompt
            + c2 * log_output
            + c5 * log_context
            + c6 * past_low
            + c7 * past_high
            + c8 * pp
            + c9 * oo
            + c10 * po
        )
        # What the meter will attribute: the device's draw shared with the others in flight.
        energy = (
            service_prior
            * watts
            / concurrent
            * exp(
                d0
                + d1 * log_prompt
                + d2 * log_output
                + d5 * log_context
                + d6 * past_low
                + d7 * past_high
                + d8 * pp
                + d9 * oo
                + d10 * po
            )
        )
        marginal_energy = energy * (watts - phys.idle_w) / watts if watts > 0 else 0.0
        if rate is None:
            rate, per_j, g_per_j = self._own, self._own_usd_per_j, self._own_g_co2_per_j
        else:
            per_j, g_per_j = rate.usd_per_j, rate.g_co2_per_j
        return Prediction(
            name,
            output,
            concurrent,
            queue_s,
            queue_s + prefill,
            queue_s + prefill * self._ttft_upper,
            tpot,
            tpot * self._tpot_upper,
            queue_s + service,
            queue_s + service * self._e2e_upper,
            energy,
            marginal_energy,
            energy * per_j + service * self._per_hour / concurrent,
            marginal_energy * per_j + (service + slowed) * self._per_hour / phys.slots,
            energy * g_per_j,
            marginal_energy * g_per_j,
            rate,
        )


_KNEE_LOW, _KNEE_HIGH = CONTEXT_KNEES
# Per concurrency: the prior's step and draw, then per target (ttft, tpot, e2e, energy) the
# batch's terms and its coefficients of log prompt, log output and log context.
_Batch = tuple[float, ...]


def _step(batch: _Batch) -> tuple[float, float, float, float, float]:
    """Return what the step of a batch without the request needs of its table entry: the
    prior's step and the time per output token's batch terms and coefficients."""
    return batch[0], batch[6], batch[7], batch[8], batch[9]


_PRIOR = Residual()
_NOTHING_LEARNED = Learned()


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
    trained: Mapping[tuple[str, str], Learned] = field(default_factory=dict)
    _cache: dict[tuple[str, str], PoolModel] = field(default_factory=dict, repr=False)
    _kv_bytes: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        # Built with the model (loaded, trained, or rebased on a new policy) rather than by the
        # first decision to need each: a pool model's tables take 30-40 µs for 32 slots.
        for pool, spec in self.policy.pools.items():
            for model in spec.models:
                self.pool_model(pool, model)
                self._kv_bytes[model] = self.policy.kv_bytes_per_token(model)

    def kv_bytes_per_token(self, model: str) -> float:
        """Return the KV-cache bytes one token of the model holds, as the policy says.

        Looked up once per model: the policy's lookup takes 0.2 µs, 1 % of a decision.
        """
        known = self._kv_bytes.get(model)
        return known if known is not None else self.policy.kv_bytes_per_token(model)

    def pool_model(self, pool: str, model: str) -> PoolModel:
        key = (pool, model)
        cached = self._cache.get(key)
        if cached is None:
            spec = self.policy.pools[pool]
            phys = physics(spec, self.policy.params_b(model), self.policy.kv_bytes_per_token(model))
            cached = PoolModel(spec, phys, self.trained.get(key, _NOTHING_LEARNED))
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
