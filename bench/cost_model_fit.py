"""Where the cost model's error comes from, and which estimator fits it best, per pool and target.

    python -m bench.cost_model_fit --seed 0 --out docs/results/cost-model-fit-seed0.json

Replays the trace with the learned strategy, as `gateway bench routing` does, keeps the
observations its learner saw, in order, and reports:

- `attribution`: every device's energy split among its requests again, from their spans and the
  device's power curve: as the meter splits it (a reading every `--meter-interval`, 1 s as the
  gateway scrapes by default; the split the model learns from and is scored against, which this
  one must equal), at 0.1 s, and continuously (each
  instant's idle draw shared by time among the requests running, the rest by the work each
  does at that instant). How far the meter's split is from the continuous one is error no
  estimator can remove.
- `predictability`: energy (the meter's split and the continuous one) and time per output token
  fitted by gradient boosting, the newest fifth held out: from what is known at admission, and
  with the mean concurrency over the request's life, known only once it has ended. The
  difference is what load arriving after the decision costs.
- `estimators`: each observation predicted by a fit on those before it, refitted every
  `--refit-every` observations as the replay's learner does: the MAPE after a pool's first 500
  observations per pool and target (the figure `gateway bench routing` reports), and predicted
  over observed energy in sum. `median-quadratic` is the gateway's fit (`train`); `ridge` the one
  before it, `ridge-quadratic` least squares on the gateway's features; the others are
  scikit-learn's gradient boosting, which serves nowhere.

The device's power curve is the simulator's (`simulator.power.PowerCurve`), read from the
replay's devices: this is a measurement of the simulated world, as the oracle is.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.costmodel.predict import FEATURES, TARGETS, UNBOUNDED
from gateway.costmodel.train import (
    HALF_LIFE,
    MIN_OBSERVATIONS,
    Observation,
    _columns,
    design,
    ridge,
    terms,
    train,
)
from gateway.energy.ledger import PREFILL_TOKEN_WEIGHT, BackendLedger
from gateway.policy.definition import Policy
from gateway.policy.load import load_policy
from gateway.whatif.conditions import ReplayRates
from gateway.whatif.replay_learner import WARM_OBSERVATIONS, OnlineLearner
from gateway.whatif.strategy import learned
from gateway.whatif.timeline import START_S, Replay, observation
from gateway.whatif.trace import read_trace
from lab.scenario import PLAIN, Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
METER_INTERVAL_S = 1.0
FINE_INTERVAL_S = 0.1
HOLDOUT_SHARE = 0.2
LINEAR = FEATURES.index("log_prompt_squared")  # φ before the quadratic terms: the fit before
# Physics the gradient-boosted fit of log(observed) is held to, over (log prompt, log output,
# concurrency, log context): more tokens never take less time or energy, a fuller batch and a
# larger KV cache never make a step shorter. Energy against concurrency is left free: a fuller
# batch is slower but shares the draw.
MONOTONE = {
    "ttft": (1, 0, 0, 0),
    "tpot": (0, 0, 1, 1),
    "e2e": (1, 1, 1, 1),
    "energy": (1, 1, 0, 1),
}


class RecordingLearner(OnlineLearner):
    """The replay's learner, keeping every observation it is given, in order."""

    def __init__(self, policy: Policy, **kwargs: Any):
        super().__init__(policy, **kwargs)
        self.kept: list[Observation] = []

    def observe(self, observation: Observation, now: float) -> None:
        self.kept.append(observation)
        super().observe(observation, now)


def replay(
    policy: Policy,
    trace: Path,
    seed: int,
    scenario: Scenario,
    limit: int | None,
    meter_interval_s: float = METER_INTERVAL_S,
) -> tuple[Replay, list[Observation], float]:
    """Run the learned strategy over the trace as `gateway bench routing` does, the meter read
    every `meter_interval_s`; return the replay, its learner's observations and the meter's
    phase."""
    requests = read_trace(trace, limit=limit)
    rates = ReplayRates(policy, scenario)
    phase = random.Random(seed).random()
    strategy = learned(policy, rates=rates)
    assert strategy.learner is not None
    learner = RecordingLearner(policy, schedule=strategy.learner.schedule)
    strategy = dataclasses.replace(strategy, learner=learner)
    run = Replay(
        strategy,
        requests,
        meter_phase_s=phase,
        meter_interval_s=meter_interval_s,
        conditions=scenario,
        rates=rates,
        draw=random.Random(seed).random,
    )
    return run.run(), learner.kept, phase


# -- attribution ---------------------------------------------------------------------------


@dataclasses.dataclass
class Served:
    """One served request on its device: its span and what it did."""

    key: str
    start: float
    first: float
    end: float
    prompt: int
    output: int


def served(run: Replay) -> dict[str, list[Served]]:
    """Return each backend's served requests, by admission."""
    by_backend: dict[str, list[Served]] = {}
    for p in run.passages:
        job = p.job
        if p.backend is None or job is None or job.finished_at is None:
            continue
        assert job.admitted_at is not None and job.first_token_at is not None
        by_backend.setdefault(p.backend.state.name, []).append(
            Served(
                p.key,
                job.admitted_at,
                job.first_token_at,
                job.finished_at,
                p.request.prompt_tokens,
                p.request.output_tokens,
            )
        )
    return by_backend


class Meter:
    """A device's energy counter, rebuilt from its requests' spans and its power curve."""

    def __init__(self, spans: Sequence[Served], watts: Callable[[int, float], float]):
        changes = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])
        self.times = np.array([0.0] + [t for t, _ in changes])
        self.running = np.cumsum([0] + [d for _, d in changes])
        power = np.array([watts(int(n), t) for n, t in zip(self.running, self.times, strict=True)])
        self.power = power
        self.counter = np.concatenate(([0.0], np.cumsum(power[:-1] * np.diff(self.times))))

    def energy_at(self, t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.times, t, side="right") - 1
        return self.counter[i] + self.power[i] * (t - self.times[i])

    def mean_running(self, start: float, end: float) -> float:
        """Return the requests running on the device, on average over [start, end)."""
        i0 = np.searchsorted(self.times, start, side="right")
        i1 = np.searchsorted(self.times, end, side="left")
        edges = np.concatenate(([start], self.times[i0:i1], [end]))
        counts = self.running[i0 - 1 : i1]
        span = end - start
        return float(counts @ np.diff(edges) / span) if span > 0 else float(counts[0])


def metered_split(
    spans: Sequence[Served], meter: Meter, idle_w: float, interval: float, phase: float
) -> dict[str, float]:
    """Split a device's energy as the gateway's ledger does with readings every `interval`;
    return each request's energy."""
    end = max(s.end for s in spans) + 2 * interval
    readings = np.arange(phase % interval, end, interval)
    counters = meter.energy_at(readings)
    # At one instant the replay runs the device first (a request ends, a waiting one starts),
    # then reads the meter.
    events: list[tuple[float, int, Any]] = [(s.end, 0, s) for s in spans]
    events += [(s.start, 1, s) for s in spans]
    events += [(float(t), 2, float(c)) for t, c in zip(readings, counters, strict=True)]
    events.sort(key=lambda e: (e[0], e[1]))
    ledger = BackendLedger(idle_w)
    energy: dict[str, float] = {}
    for at, kind, what in events:
        if kind == 0:
            ledger.close(what.key, at, what.prompt, what.output, what.first)
        elif kind == 1:
            ledger.open(what.key, at)
        else:
            ledger.reading(at, what)
            for span in ledger.settle():
                energy[span.key] = span.energy_j
    return energy


def continuous_split(
    spans: Sequence[Served], watts: Callable[[int, float], float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Split a device's energy at every instant: its idle draw by time among the requests
    running, the rest by the work each does then; return each request's energy and idle part."""
    changes: list[tuple[float, str, float | None]] = []
    for s in spans:
        prefill = s.first - s.start
        decode = s.end - s.first
        changes.append((s.start, s.key, s.prompt * PREFILL_TOKEN_WEIGHT / max(prefill, 1e-12)))
        changes.append((s.first, s.key, s.output / decode if decode > 0 else 0.0))
        changes.append((s.end, s.key, None))
    changes.sort(key=lambda c: c[0])
    energy = dict.fromkeys((s.key for s in spans), 0.0)
    idle = dict.fromkeys(energy, 0.0)
    rates: dict[str, float] = {}
    now = 0.0
    for at, key, rate in changes:
        if at > now and rates:
            n, total = len(rates), sum(rates.values())
            floor = watts(0, now)
            above = (watts(n, now) - floor) * (at - now)
            for running, r in rates.items():
                energy[running] += above * (r / total if total > 0 else 1 / n)
                energy[running] += floor * (at - now) / n
                idle[running] += floor * (at - now) / n
        now = at
        if rate is None:
            rates.pop(key, None)
        else:
            rates[key] = rate
    return energy, idle


def _mape(predicted: np.ndarray, observed: np.ndarray) -> float:
    return round(float(np.mean(np.abs(predicted - observed) / observed)), 4)


# -- the estimators ------------------------------------------------------------------------

# A fit of one pool's observations (oldest first), returning what it predicts for others of that
# pool, per target.
Predictor = Callable[[Sequence[Observation]], dict[str, np.ndarray]]
Fit = Callable[[Sequence[Observation]], Predictor]


def _recency(n: int, half_life: float | None) -> np.ndarray:
    if half_life is None:
        return np.ones(n)
    return np.asarray(0.5 ** (np.arange(n)[::-1] / half_life))


def _raw(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Return the inputs a tree splits on: log prompt, log output, concurrency, log context."""
    seen = terms(columns)
    return np.column_stack(
        (
            seen["log_prompt"],
            seen["log_output"],
            np.exp(seen["log_concurrent"]),
            seen["log_context"],
        )
    )


def gateway_fit(policy: Policy) -> Fit:
    """The gateway's fit, `train`, and the request path's `predict`."""

    def fit(history: Sequence[Observation]) -> Predictor:
        model, _ = train(policy, history)

        def predict(batch: Sequence[Observation]) -> dict[str, np.ndarray]:
            predictions = [
                model.predict(
                    o.pool,
                    o.model,
                    o.prompt_tokens,
                    o.completion_tokens,
                    o.concurrent,
                    context=o.context_tokens,
                )
                for o in batch
            ]
            return {
                "ttft": np.array([p.ttft_s for p in predictions]),
                "tpot": np.array([p.tpot_s for p in predictions]),
                "e2e": np.array([p.e2e_s for p in predictions]),
                "energy": np.array([p.energy_j for p in predictions]),
            }

        return predict

    return fit


# Fits log(observed / prior) of one target, or log(observed) where the estimator says so: given
# the target's name, the group's columns and its usable rows, returns the fitted log of the
# target for any group's columns.
TargetFit = Callable[
    [str, dict[str, np.ndarray], np.ndarray], Callable[[dict[str, np.ndarray]], np.ndarray]
]


def per_target(policy: Policy, fit_target: TargetFit) -> Fit:
    """Fit each target of a pool's observations with `fit_target`, the prior where too few."""
    from gateway.costmodel.predict import CostModel

    prior = CostModel(policy)

    def columns_of(group: Sequence[Observation]) -> dict[str, np.ndarray]:
        o = group[0]
        phys = prior.pool_model(o.pool, o.model).physics
        return _columns(group, policy.pools[o.pool].slots_per_backend, phys)

    def fit(history: Sequence[Observation]) -> Predictor:
        columns = columns_of(history)
        fitted = {}
        for target in TARGETS:
            observed, base = columns[target], columns[f"prior_{target}"]
            rows = np.flatnonzero((observed > 0) & (base != 0))
            if len(rows) >= MIN_OBSERVATIONS:
                fitted[target] = fit_target(target, columns, rows)

        def predict(batch: Sequence[Observation]) -> dict[str, np.ndarray]:
            seen = columns_of(batch)
            return {
                target: fitted[target](seen) if target in fitted else seen[f"prior_{target}"]
                for target in TARGETS
            }

        return predict

    return fit


def ridge_fit(quadratic: bool) -> TargetFit:
    """Least squares in logs with the gateway's penalty and recency, on φ: the linear terms
    alone (the fit before) unless `quadratic`."""

    def phi(columns: dict[str, np.ndarray]) -> np.ndarray:
        full = design(columns, UNBOUNDED)
        return full if quadratic else full[:, :LINEAR]

    def fit(target: str, columns: dict[str, np.ndarray], rows: np.ndarray) -> Any:
        base = columns[f"prior_{target}"]
        logs = np.log(columns[target][rows] / base[rows])
        weights = ridge(phi(columns)[rows], logs, _recency(len(rows), HALF_LIFE))
        return lambda seen: seen[f"prior_{target}"] * np.exp(phi(seen) @ weights)

    return fit


def boosted_fit(half_life: float | None, monotone: bool) -> TargetFit:
    """scikit-learn's HistGradientBoostingRegressor with absolute-error loss: of log(observed /
    prior) on the raw inputs, or, `monotone`, of log(observed) held to the physics' directions
    (no prior then: a tree's extrapolation is flat)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    def fit(target: str, columns: dict[str, np.ndarray], rows: np.ndarray) -> Any:
        base = columns[f"prior_{target}"]
        logs = np.log(columns[target][rows] / (1.0 if monotone else base[rows]))
        model = HistGradientBoostingRegressor(
            loss="absolute_error",
            max_iter=100,
            monotonic_cst=MONOTONE[target] if monotone else None,
        ).fit(_raw(columns)[rows], logs, sample_weight=_recency(len(rows), half_life))

        def predict(seen: dict[str, np.ndarray]) -> np.ndarray:
            fitted = np.exp(model.predict(_raw(seen)))
            return fitted if monotone else seen[f"prior_{target}"] * fitted

        return predict

    return fit


def estimators(policy: Policy) -> dict[str, Fit]:
    return {
        "median-quadratic": gateway_fit(policy),
        "ridge": per_target(policy, ridge_fit(quadratic=False)),
        "ridge-quadratic": per_target(policy, ridge_fit(quadratic=True)),
        "boosted": per_target(policy, boosted_fit(None, monotone=False)),
        "boosted-recent": per_target(policy, boosted_fit(HALF_LIFE, monotone=False)),
        "boosted-monotone": per_target(policy, boosted_fit(None, monotone=True)),
    }


def online(
    observations: Sequence[Observation], fit: Fit, every: int, window: int
) -> dict[str, Any]:
    """Predict each observation by a fit on those before it (the newest `window`), refitted
    every `every` observations; return the MAPE after each pool's first 500, per target, and
    predicted over observed energy in sum."""
    errors: dict[tuple[str, str], list[float]] = {}
    energy: dict[str, list[float]] = {}
    started = time.perf_counter()
    for start in range(0, len(observations), every):
        history = observations[max(0, start - window) : start]
        block = observations[start : start + every]
        for pool, model in sorted({(o.pool, o.model) for o in block}):
            mine = [o for o in block if (o.pool, o.model) == (pool, model)]
            seen = sum(1 for o in observations[:start] if o.pool == pool)
            past = [o for o in history if (o.pool, o.model) == (pool, model)]
            predicted = fit(past)(mine) if past else None
            for i, o in enumerate(mine):
                if seen + i < WARM_OBSERVATIONS or predicted is None:
                    continue
                measured = (o.ttft_s, o.tpot_s, o.e2e_s, o.energy_j)
                for target, value in zip(TARGETS, measured, strict=True):
                    if value is None or value <= 0:
                        continue
                    guess = float(predicted[target][i])
                    errors.setdefault((pool, target), []).append(abs(guess - value) / value)
                    if target == "energy":
                        sums = energy.setdefault(pool, [0.0, 0.0])
                        sums[0] += guess
                        sums[1] += value
    mape: dict[str, dict[str, float]] = {}
    for (pool, target), values in sorted(errors.items()):
        mape.setdefault(pool, {})[target] = round(float(np.mean(values)), 4)
    return {
        f"mape_after_{WARM_OBSERVATIONS}": mape,
        "energy_predicted_over_observed": {
            pool: round(p / o, 4) for pool, (p, o) in sorted(energy.items())
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


# -- where the energy error comes from -----------------------------------------------------


def _draw(run: Replay, pool: str, backend: str, curve: Any) -> Callable[[int, float], float]:
    """Return a device's draw with n requests running at an instant: the simulator's power
    curve times the scenario's power factor on it then."""

    def watts(n: int, t: float) -> float:
        _, factor = run.conditions.factors(pool, backend, max(t - START_S, 0.0))
        return float(curve.watts(n)) * factor

    return watts


def split_again(
    run: Replay, phase: float, interval: float = METER_INTERVAL_S
) -> dict[str, dict[str, float]]:
    """Split every device's energy again, the meter's way, finer and continuously; return per
    served request (by key) its pool, energies and mean concurrency over its life."""
    by_backend = served(run)
    rows: dict[str, dict[str, Any]] = {}
    for name, sim in run.world.items():
        spans = by_backend.get(name)
        if not spans:
            continue
        curve = sim.device.device.power  # type: ignore[attr-defined]  # the simulator's device
        pool = sim.state.pool
        watts = _draw(run, pool, name, curve)
        meter = Meter(spans, watts)
        # The ledger starts from the pool's nominal idle draw and learns the real one, as the
        # replay's does.
        idle_w = run.policy.pools[pool].power.idle_w
        metered = metered_split(spans, meter, idle_w, interval, phase)
        fine = metered_split(spans, meter, idle_w, FINE_INTERVAL_S, phase)
        exact, idle = continuous_split(spans, watts)
        for span in spans:
            rows[span.key] = {
                "pool": pool,
                "end": span.end,
                "metered": metered[span.key],
                "fine": fine[span.key],
                "continuous": exact[span.key],
                "idle": idle[span.key],
                "life_concurrency": meter.mean_running(span.start, span.end),
            }
    return rows


def attribution(
    rows: dict[str, dict[str, Any]], observations: Sequence[Observation]
) -> dict[str, dict[str, Any]]:
    """Return per pool how far the meter's split is from the continuous one, and how closely
    the rebuilt meter gives what the replay's learner was told."""
    out: dict[str, dict[str, Any]] = {}
    for pool in sorted({r["pool"] for r in rows.values()}):
        mine = [r for r in rows.values() if r["pool"] == pool]
        metered = np.array([r["metered"] for r in mine])
        fine = np.array([r["fine"] for r in mine])
        exact = np.array([r["continuous"] for r in mine])
        told = np.sort([o.energy_j for o in observations if o.pool == pool and o.energy_j])
        rebuilt = np.sort(metered)
        out[pool] = {
            "requests": len(mine),
            "idle_share_of_energy": round(float(sum(r["idle"] for r in mine) / exact.sum()), 4),
            "mape_metered_vs_continuous": _mape(metered, exact),
            "mape_metered_0.1s_vs_continuous": _mape(fine, exact),
            "rebuilt_vs_replay_max_relative_difference": (
                float(np.max(np.abs(rebuilt - told) / told)) if len(told) == len(rebuilt) else None
            ),
        }
    return out


def predictability(
    policy: Policy, run: Replay, rows: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Fit energy (the meter's split, the continuous one) and time per output token by gradient
    boosting on the older four fifths of each pool's requests, from what admission knows and
    with the mean concurrency over each request's life; return the held-out MAPE of each."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    from gateway.costmodel.predict import CostModel

    prior = CostModel(policy)
    out: dict[str, dict[str, Any]] = {}
    done = sorted((p for p in run.passages if p.key in rows), key=lambda p: rows[p.key]["end"])
    for pool in sorted({r["pool"] for r in rows.values()}):
        mine = [p for p in done if rows[p.key]["pool"] == pool]
        group = [observation(p, rows[p.key]["metered"]) for p in mine]
        o = group[0]
        phys = prior.pool_model(o.pool, o.model).physics
        columns = _columns(group, policy.pools[pool].slots_per_backend, phys)
        admission = _raw(columns)
        life = np.array([[rows[p.key]["life_concurrency"]] for p in mine])
        targets = {
            "energy_metered": (columns["energy"], columns["prior_energy"]),
            "energy_continuous": (
                np.array([rows[p.key]["continuous"] for p in mine]),
                columns["prior_energy"],
            ),
            "tpot": (columns["tpot"], columns["prior_tpot"]),
        }
        split = int(len(group) * (1 - HOLDOUT_SHARE))
        for name, (observed, base) in targets.items():
            usable = np.flatnonzero((observed > 0) & (base > 0))
            train_rows, held = usable[usable < split], usable[usable >= split]
            logs = np.log(observed / np.where(base > 0, base, 1.0))
            scores = {}
            for known, x in (
                ("at_admission", admission),
                ("with_life_concurrency", np.hstack((admission, life))),
            ):
                model = HistGradientBoostingRegressor(loss="absolute_error", max_iter=200)
                model.fit(x[train_rows], logs[train_rows])
                predicted = base[held] * np.exp(model.predict(x[held]))
                scores[known] = _mape(predicted, observed[held])
            out.setdefault(pool, {})[name] = scores
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT / "traces/azure_llm_2023_conv.csv")
    parser.add_argument("--policy", type=Path, default=ROOT / "policies/default.yaml")
    parser.add_argument("--scenario", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int)
    parser.add_argument(
        "--meter-interval",
        type=float,
        default=METER_INTERVAL_S,
        help="seconds between the energy meter's readings (the gateway's scrape interval)",
    )
    parser.add_argument("--refit-every", type=int, default=200)
    parser.add_argument("--window", type=int, default=20_000)
    parser.add_argument("--estimators", help="comma-separated (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    policy = load_policy(args.policy)
    scenario = PLAIN if args.scenario is None else load_scenario(args.scenario)
    run, observations, phase = replay(
        policy, args.trace, args.seed, scenario, args.limit, args.meter_interval
    )
    rows = split_again(run, phase, args.meter_interval)
    fits = estimators(policy)
    chosen = args.estimators.split(",") if args.estimators else list(fits)
    document: dict[str, Any] = {
        "trace": str(
            args.trace.relative_to(ROOT) if args.trace.is_relative_to(ROOT) else args.trace
        ),
        "scenario": None if args.scenario is None else str(args.scenario),
        "seed": args.seed,
        "requests": len(run.passages),
        "observations": len(observations),
        "meter_interval_s": args.meter_interval,
        "refit_every": args.refit_every,
        "date": datetime.date.today().isoformat(),
        "attribution": attribution(rows, observations),
        "predictability": predictability(policy, run, rows),
        "estimators": {
            name: online(observations, fits[name], args.refit_every, args.window) for name in chosen
        },
    }
    text = json.dumps(document, indent=2) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
