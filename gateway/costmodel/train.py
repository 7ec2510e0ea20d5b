"""Train the cost model's residuals on measured requests, and score them.

For each pool, model and target, fit log(observed / prior) on φ by least absolute deviations
with a ridge penalty, weighting recent observations more; the penalty keeps a pool with few
observations close to its physics prior. The newest fifth of the observations is held out: the
error reported (MAPE) and the upper-bound margin (the 90th percentile of the held-out log
residuals, a split-conformal bound) both come from it.

Absolute deviations fit the median ratio to the prior rather than the mean of its log: what a
device's energy share is when others join it or not is skewed, and the median is what the
error is measured against (bench/cost_model_fit.py compares this with least squares and with
scikit-learn's gradient boosting, per pool and target). The fit is iteratively reweighted ridge
in numpy, ridge's closed form being the same solution as scikit-learn's `Ridge` without an
intercept (tests check both against scikit-learn): a 15×15 solve a pass, which keeps
scikit-learn (~120 MiB resident) out of the serving process and its trainer.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gateway.costmodel.predict import (
    BATCH_TERMS,
    REQUEST_TERMS,
    TARGETS,
    UNBOUNDED,
    Arithmetic,
    CostModel,
    Learned,
    Residual,
    Span,
    batch_terms,
    features,
    request_terms,
)
from gateway.policy.definition import Policy
from gateway.policy.physics import POWER_EXPONENT, Physics

MIN_OBSERVATIONS = 30
HOLDOUT_SHARE = 0.2
BOUND_QUANTILE = 0.9
RIDGE_ALPHA = 1.0
# Least absolute deviations by reweighted ridge: six passes settle the fit (the held-out error
# moves less than 0.05 points after three), and a residual under 0.1% counts as 0.1%.
MEDIAN_PASSES = 6
MEDIAN_FLOOR = 1e-3
# Devices drift (thermal throttling, a firmware change, a failing part): recent observations
# count more, halving in weight every HALF_LIFE observations the whole fleet made since. Counted
# on the fleet's clock, not the pool's: a pool the router stopped choosing while it was slow is
# seen again only through `explore`, a few requests a minute, and counted in its own
# observations its slow spell would stay the newest thing it knew long after it recovered.
HALF_LIFE = 600
# φ over arrays of observations, a column a feature (`features`).
MANY = Arithmetic(np.log1p, np.log, np.minimum, np.maximum)


class Observation(NamedTuple):
    """One measured request: its shape, its load and what it took."""

    pool: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    concurrent: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    energy_j: float | None
    # KV-cache tokens its backend held at admission, its own in; None in records from before
    # the gateway kept it, read as its own alone.
    context_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RetrainSchedule:
    """When to train a new version: the live learner's rule, and the replay's on its clock.

    After `every` new observations, but at most once per `min_interval_s` (under heavy traffic
    `every` arrives many times a second, and training is never that urgent), and after
    `interval_s` in any case, if anything new was observed at all.
    """

    every: int = 200
    interval_s: float = 300.0
    min_interval_s: float = 10.0

    def due(self, new: int, elapsed_s: float) -> bool:
        """Say whether to retrain, `new` observations and `elapsed_s` after the last time."""
        if new == 0:
            return False
        return (new >= self.every and elapsed_s >= self.min_interval_s) or (
            elapsed_s >= self.interval_s
        )


# What GATEWAY_MODEL_RETRAIN_EVERY, _INTERVAL_S and _MIN_INTERVAL_S default to.
DEFAULT_SCHEDULE = RetrainSchedule()


@dataclass(frozen=True, slots=True)
class Score:
    """How well one target is predicted on held-out observations."""

    observations: int
    mape: float | None
    prior_mape: float | None


def _columns(group: Sequence[Observation], slots: int, phys: Physics) -> dict[str, np.ndarray]:
    """Return a group's inputs to φ, its measured targets and their priors, as arrays.

    The priors are the formulas `Physics` evaluates one request with, over the whole group at
    once: retraining runs beside the event loop, and Python loops over thousands of
    observations held the interpreter for most of a retraining.
    """
    prompt = np.array([o.prompt_tokens for o in group], dtype=float)
    output = np.array([o.completion_tokens for o in group], dtype=float)
    concurrent = np.array([o.concurrent for o in group], dtype=float)
    context = np.array(
        [
            o.context_tokens
            if o.context_tokens is not None
            else o.prompt_tokens + o.completion_tokens
            for o in group
        ],
        dtype=float,
    )
    ttft = phys.prefill_fixed_s + phys.prefill_per_token_s * prompt
    tpot = phys.step_fixed_s + phys.step_per_seq_s * np.maximum(concurrent - 1, 0)
    service = ttft + np.maximum(output - 1, 0) * tpot
    share = np.minimum(concurrent / phys.slots, 1.0)
    watts = np.where(
        concurrent <= 0,
        phys.idle_w,
        phys.idle_w + (phys.max_w - phys.idle_w) * np.maximum(share, 0.0) ** POWER_EXPONENT,
    )
    return {
        "prompt": prompt,
        "output": output,
        "concurrent": concurrent,
        "slots": np.full(len(group), float(slots)),
        "context": context,
        "ttft": _measured([o.ttft_s for o in group]),
        "tpot": _measured([o.tpot_s for o in group]),
        "e2e": _measured([o.e2e_s for o in group]),
        "energy": _measured([o.energy_j for o in group]),
        "prior_ttft": ttft,
        "prior_tpot": tpot,
        "prior_e2e": service,
        "prior_energy": service * watts / np.maximum(concurrent, 1),
    }


def terms(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return the request's and the batch's terms of φ of every row of a group, by name, with
    nothing clamped (REQUEST_TERMS, BATCH_TERMS)."""
    prompt, output, context = columns["prompt"], columns["output"], columns["context"]
    request = request_terms(prompt, output, context, UNBOUNDED, MANY)
    batch = batch_terms(columns["concurrent"], columns["slots"], UNBOUNDED, MANY)
    return dict(zip(REQUEST_TERMS, request, strict=True)) | dict(
        zip(BATCH_TERMS, batch, strict=True)
    )


def span_of(columns: Mapping[str, np.ndarray], rows: np.ndarray) -> Span:
    """Return the span of the quadratic terms' inputs over some rows of a group."""
    seen = terms({name: values[rows] for name, values in columns.items()})

    def bounds(name: str) -> tuple[float, float]:
        return float(seen[name].min()), float(seen[name].max())

    return Span(bounds("log_prompt"), bounds("log_output"), bounds("log_concurrent"))


def design(columns: Mapping[str, np.ndarray], span: Span = UNBOUNDED) -> np.ndarray:
    """Return φ of every row of a group (`features`), its quadratic terms within `span`."""
    request = request_terms(columns["prompt"], columns["output"], columns["context"], span, MANY)
    batch = batch_terms(columns["concurrent"], columns["slots"], span, MANY)
    return np.column_stack(np.broadcast_arrays(*features(request, batch)))


def _measured(values: list[float | None]) -> np.ndarray:
    """Return measurements as floats, NaN where none was taken."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _mape(predicted: np.ndarray, observed: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - observed) / observed))


def train(
    policy: Policy, observations: Sequence[Observation], version: int = 1
) -> tuple[CostModel, dict[str, dict[str, dict[str, Score]]]]:
    """Fit residuals on observations (oldest first); return the model and its scores."""
    prior = CostModel(policy)
    groups: dict[tuple[str, str], list[Observation]] = {}
    # Each observation's place in the fleet's sequence: its age is counted on the fleet's clock.
    places: dict[tuple[str, str], list[int]] = {}
    for place, o in enumerate(observations):
        if o.pool in policy.pools:
            groups.setdefault((o.pool, o.model), []).append(o)
            places.setdefault((o.pool, o.model), []).append(place)
    newest = len(observations) - 1
    trained: dict[tuple[str, str], Learned] = {}
    scores: dict[str, dict[str, dict[str, Score]]] = {}
    for (pool, model), group in groups.items():
        slots = policy.pools[pool].slots_per_backend
        columns = _columns(group, slots, prior.pool_model(pool, model).physics)
        ages = newest - np.array(places[(pool, model)], dtype=float)
        span = span_of(columns, np.arange(len(group)))
        residuals: dict[str, Residual] = {}
        for target in TARGETS:
            observed, base = columns[target], columns[f"prior_{target}"]
            usable = (observed > 0) & (base != 0)  # NaN, a missing measurement, compares False
            score, residual = _fit(columns, ages, np.flatnonzero(usable), target, span)
            scores.setdefault(pool, {}).setdefault(model, {})[target] = score
            if residual is not None:
                residuals[target] = residual
        trained[(pool, model)] = Learned(residuals, span)
    return CostModel(policy, version=version, trained=trained), scores


def _fit(
    columns: Mapping[str, np.ndarray], ages: np.ndarray, rows: np.ndarray, target: str, span: Span
) -> tuple[Score, Residual | None]:
    """Fit one target on some rows of a group, scored on their newest fifth; the residual
    served is refit on them all, its quadratic terms within the group's `span`. `ages` are the
    group's rows' ages in fleet observations."""
    n = len(rows)
    if n < MIN_OBSERVATIONS:
        return Score(n, None, None), None
    observed, base = columns[target][rows], columns[f"prior_{target}"][rows]
    logs = np.log(observed / base)
    split = int(n * (1 - HOLDOUT_SHARE))
    # The scored fit knows only what its rows showed: held-out rows past their span are
    # clamped as the request path clamps what training never saw.
    phi = design(columns, span_of(columns, rows[:split]))[rows]
    # Age counts back from the newest row the fit sees: the held-out rows must not make the
    # training rows look old, or the scored fit would be the prior.
    coef = median_ridge(phi[:split], logs[:split], _recency(ages[rows[:split]]))
    held_log = phi[split:] @ coef
    predicted = base[split:] * np.exp(held_log)
    residuals = logs[split:] - held_log
    # Split-conformal: the ceil((n+1)·q)-th smallest residual, so the bound keeps its coverage
    # on a finite held-out set.
    level = min(math.ceil((len(residuals) + 1) * BOUND_QUANTILE) / len(residuals), 1.0)
    bound = float(np.quantile(residuals, level))
    score = Score(
        n,
        _mape(predicted, observed[split:]),
        _mape(base[split:], observed[split:]),
    )
    # Refit on everything for serving; the held-out error stays the honest estimate.
    weights = median_ridge(design(columns, span)[rows], logs, _recency(ages[rows]))
    return score, Residual(tuple(float(w) for w in weights), max(bound, 0.0))


def ridge(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray, alpha: float = RIDGE_ALPHA
) -> np.ndarray:
    """Return β minimising Σ wᵢ(yᵢ − xᵢβ)² + α‖β‖² (no intercept): (XᵀWX + αI)⁻¹ XᵀWy."""
    xw = x * weights[:, None]
    return np.linalg.solve(xw.T @ x + alpha * np.eye(x.shape[1]), xw.T @ y)


def median_ridge(
    x: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    alpha: float = RIDGE_ALPHA,
    passes: int = MEDIAN_PASSES,
) -> np.ndarray:
    """Return β minimising Σ wᵢ|yᵢ − xᵢβ| + (α/2)‖β‖², by reweighted ridge: each pass solves
    the ridge weighted wᵢ / |residual of the pass before| (floored at MEDIAN_FLOOR), a
    quadratic bound on the absolute deviations that touches them at the fit before."""
    beta = ridge(x, y, weights, alpha)
    for _ in range(passes):
        beta = ridge(x, y, weights / np.maximum(np.abs(y - x @ beta), MEDIAN_FLOOR), alpha)
    return beta


def _recency(ages: np.ndarray) -> np.ndarray:
    """Weigh observations by their ages (in the fleet's observations): 1 for the newest,
    halving every HALF_LIFE older."""
    return np.asarray(0.5 ** ((ages - ages.min()) / HALF_LIFE))


def observations_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Observation]:
    """Turn request-record rows into observations (successful, measured requests only)."""
    return [o for o in (observation(_Fields(r)) for r in rows) if o is not None]


class _Fields(dict[str, Any]):
    """A stored row read like a RequestRecord: a column it lacks reads as None."""

    __getattr__ = dict.get


def observation(record: Any) -> Observation | None:
    """Read a request record (or a row of one); None unless it is a measured success."""
    if record.status != 200 or not record.pool or not record.e2e_ms:
        return None
    queue_s = float(record.queue_ms or 0.0) / 1e3
    ttft, tpot = record.ttft_ms, record.tpot_ms
    energy = None if record.energy_estimated else record.energy_j
    # The prefill computed what the backend did not find in its prefix cache: the prompt the
    # model learns prefill from, as the ranking asks it (gateway/routing/ranking.py). The cached
    # part is still read by every decode step, in context_tokens.
    cached = int(record.cached_tokens or 0)
    return Observation(
        sys.intern(str(record.pool)),
        # A served model is one of the policy's: one string for the whole window, not one per
        # request (each request's was parsed from its own body).
        sys.intern(str(record.model)),
        max(int(record.prompt_tokens or 0) - cached, 0),
        int(record.completion_tokens or 0),
        int(record.concurrent or 1),
        None if ttft is None else float(ttft) / 1e3 - queue_s,
        None if tpot is None else float(tpot) / 1e3,
        float(record.e2e_ms) / 1e3 - queue_s,
        None if energy is None else float(energy),
        None if record.context_tokens is None else int(record.context_tokens),
    )
