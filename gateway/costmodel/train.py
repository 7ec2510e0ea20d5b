"""Train the cost model's residuals on measured requests, and score them.

For each pool, model and target, fit ridge regression of log(observed / prior) on φ, weighting
recent observations more; the ridge penalty keeps a pool with few observations close to its
physics prior. The newest fifth of the observations is held out: the error reported (MAPE) and
the upper-bound margin (the 90th percentile of the held-out log residuals, a split-conformal
bound) both come from it.

The fit is ridge's closed form in numpy, the same solution as scikit-learn's `Ridge` without an
intercept (a test checks they agree): with a handful of features it is a 4×4 solve, and it keeps
scikit-learn (~120 MiB resident) out of the serving process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.costmodel.model import TARGETS, CostModel, Residual, features
from gateway.policy import Policy

MIN_OBSERVATIONS = 30
HOLDOUT_SHARE = 0.2
BOUND_QUANTILE = 0.9
RIDGE_ALPHA = 1.0
# Devices drift (thermal throttling, a firmware change, a failing part): recent observations
# count more, halving in weight every HALF_LIFE older ones of the same pool and model.
HALF_LIFE = 150


@dataclass(frozen=True, slots=True)
class Observation:
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


@dataclass(frozen=True, slots=True)
class Score:
    """How well one target is predicted on held-out observations."""

    observations: int
    mape: float | None
    prior_mape: float | None


def _priors(cost: CostModel, o: Observation) -> dict[str, float | None]:
    phys = cost.pool_model(o.pool, o.model).physics
    service = phys.ttft_s(o.prompt_tokens) + max(o.completion_tokens - 1, 0) * phys.tpot_s(
        o.concurrent
    )
    return {
        "ttft": phys.ttft_s(o.prompt_tokens),
        "tpot": phys.tpot_s(o.concurrent),
        "e2e": service,
        "energy": service * phys.watts(o.concurrent) / max(o.concurrent, 1),
    }


def _observed(o: Observation, target: str) -> float | None:
    value = {"ttft": o.ttft_s, "tpot": o.tpot_s, "e2e": o.e2e_s, "energy": o.energy_j}[target]
    return value if value is not None and value > 0 else None


def _mape(predicted: np.ndarray, observed: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - observed) / observed))


def train(
    policy: Policy, observations: Sequence[Observation], version: int = 1
) -> tuple[CostModel, dict[str, dict[str, dict[str, Score]]]]:
    """Fit residuals on observations (oldest first); return the model and its scores."""
    prior = CostModel(policy)
    groups: dict[tuple[str, str], list[Observation]] = {}
    for o in observations:
        if o.pool in policy.pools:
            groups.setdefault((o.pool, o.model), []).append(o)
    trained: dict[tuple[str, str], Mapping[str, Residual]] = {}
    scores: dict[str, dict[str, dict[str, Score]]] = {}
    for (pool, model), group in groups.items():
        slots = policy.pools[pool].slots_per_backend
        residuals: dict[str, Residual] = {}
        # Once per observation, not once per target: these loops are most of a retraining.
        priors = [_priors(prior, o) for o in group]
        phis = [features(o.prompt_tokens, o.completion_tokens, o.concurrent, slots) for o in group]
        for target in TARGETS:
            rows = []
            for o, base, phi in zip(group, priors, phis, strict=True):
                y, b = _observed(o, target), base[target]
                if y is not None and b:
                    rows.append((phi, y, b))
            score, residual = _fit(rows)
            scores.setdefault(pool, {}).setdefault(model, {})[target] = score
            if residual is not None:
                residuals[target] = residual
        trained[(pool, model)] = residuals
    return CostModel(policy, version=version, trained=trained), scores


def _fit(
    rows: list[tuple[tuple[float, ...], float, float]],
) -> tuple[Score, Residual | None]:
    if len(rows) < MIN_OBSERVATIONS:
        return Score(len(rows), None, None), None
    phi = np.array([r[0] for r in rows])
    observed = np.array([r[1] for r in rows])
    base = np.array([r[2] for r in rows])
    target = np.log(observed / base)
    split = int(len(rows) * (1 - HOLDOUT_SHARE))
    # Age counts back from the newest row the fit sees: the held-out rows must not make the
    # training rows look old, or the scored fit would be the prior.
    coef = ridge(phi[:split], target[:split], _recency(split))
    held_log = phi[split:] @ coef
    predicted = base[split:] * np.exp(held_log)
    residuals = target[split:] - held_log
    # Split-conformal: the ceil((n+1)·q)-th smallest residual, so the bound keeps its coverage
    # on a finite held-out set.
    level = min(math.ceil((len(residuals) + 1) * BOUND_QUANTILE) / len(residuals), 1.0)
    bound = float(np.quantile(residuals, level))
    score = Score(
        len(rows),
        _mape(predicted, observed[split:]),
        _mape(base[split:], observed[split:]),
    )
    # Refit on everything for serving; the held-out error stays the honest estimate.
    weights = ridge(phi, target, _recency(len(rows)))
    return score, Residual(tuple(float(w) for w in weights), max(bound, 0.0))


def ridge(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray, alpha: float = RIDGE_ALPHA
) -> np.ndarray:
    """Return β minimising Σ wᵢ(yᵢ − xᵢβ)² + α‖β‖² (no intercept): (XᵀWX + αI)⁻¹ XᵀWy."""
    xw = x * weights[:, None]
    return np.linalg.solve(xw.T @ x + alpha * np.eye(x.shape[1]), xw.T @ y)


def _recency(n: int) -> np.ndarray:
    """Weights for n observations, oldest first: halving every HALF_LIFE back from the newest."""
    return np.asarray(0.5 ** (np.arange(n)[::-1] / HALF_LIFE))


def observations_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Observation]:
    """Turn request-record rows into observations (successful, measured requests only)."""
    return [o for o in (observation(r.get) for r in rows) if o is not None]


def observation(field: Callable[[str], Any]) -> Observation | None:
    """Read one request record, a field at a time; None unless it is a measured success."""
    if field("status") != 200 or not field("pool") or not field("e2e_ms"):
        return None
    queue_s = float(field("queue_ms") or 0.0) / 1e3
    ttft, tpot = field("ttft_ms"), field("tpot_ms")
    energy = None if field("energy_estimated") else field("energy_j")
    return Observation(
        pool=str(field("pool")),
        model=str(field("model")),
        prompt_tokens=int(field("prompt_tokens") or 0),
        completion_tokens=int(field("completion_tokens") or 0),
        concurrent=int(field("concurrent") or 1),
        ttft_s=None if ttft is None else float(ttft) / 1e3 - queue_s,
        tpot_s=None if tpot is None else float(tpot) / 1e3,
        e2e_s=float(field("e2e_ms")) / 1e3 - queue_s,
        energy_j=None if energy is None else float(energy),
    )
