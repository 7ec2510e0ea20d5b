"""Learn the cost model online during a replay, the way the live gateway's learner does.

Observations arrive as the energy meter settles finished requests. The schedule is the live
learner's (`RetrainSchedule`), on the virtual clock. The model
is trained with `gateway.costmodel.train.train` and swapped in at once: on the virtual clock
training takes no time, where the live learner trains in a worker thread and the old version
serves meanwhile. Each observation is first scored against the version serving
when it arrived, given its true shape (prompt, output tokens, concurrency), so the error reported
is out of sample: predicted before the model saw it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from gateway.costmodel.predict import TARGETS, CostModel, Prediction
from gateway.costmodel.train import DEFAULT_SCHEDULE, Observation, RetrainSchedule, Score, train
from gateway.policy.definition import Policy

# After this many observations of a pool its error counts toward the target.
WARM_OBSERVATIONS = 500


def _predicted(prediction: Prediction, target: str) -> float:
    return {
        "ttft": prediction.ttft_s,
        "tpot": prediction.tpot_s,
        "e2e": prediction.e2e_s,
        "energy": prediction.energy_j,
    }[target]


def _observed(observation: Observation, target: str) -> float | None:
    value = {
        "ttft": observation.ttft_s,
        "tpot": observation.tpot_s,
        "e2e": observation.e2e_s,
        "energy": observation.energy_j,
    }[target]
    return value if value is not None and value > 0 else None


@dataclass(slots=True)
class _Errors:
    """Sums of absolute percentage errors per pool and target."""

    total: dict[tuple[str, str], float] = field(default_factory=dict)
    count: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, pool: str, target: str, error: float) -> None:
        key = (pool, target)
        self.total[key] = self.total.get(key, 0.0) + error
        self.count[key] += 1

    def mape(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (pool, target), n in sorted(self.count.items()):
            out.setdefault(pool, {})[target] = round(self.total[(pool, target)] / n, 4)
        return out


class OnlineLearner:
    """Collect observations, retrain on the schedule, and keep score of the model's error."""

    def __init__(
        self,
        policy: Policy,
        *,
        schedule: RetrainSchedule = DEFAULT_SCHEDULE,
        window: int = 20_000,
    ):
        self.policy = policy
        self.schedule = schedule
        self.model = CostModel(policy)
        self.scores: dict[str, dict[str, dict[str, Score]]] = {}
        self.failures = 0
        self.seen: Counter[str] = Counter()
        self._observations: deque[Observation] = deque(maxlen=window)
        self._new = 0
        self._last_s = 0.0
        self._all = _Errors()
        self._warm = _Errors()

    def observe(self, observation: Observation, now: float) -> None:
        """Score an observation against the serving model, keep it, and retrain when due."""
        prediction = self.model.predict(
            observation.pool,
            observation.model,
            observation.prompt_tokens,
            observation.completion_tokens,
            observation.concurrent,
            context=observation.context_tokens,
        )
        warm = self.seen[observation.pool] >= WARM_OBSERVATIONS
        for target in TARGETS:
            observed = _observed(observation, target)
            if observed is None:
                continue
            error = abs(_predicted(prediction, target) - observed) / observed
            self._all.add(observation.pool, target, error)
            if warm:
                self._warm.add(observation.pool, target, error)
        self.seen[observation.pool] += 1
        self._observations.append(observation)
        self._new += 1
        if self.schedule.due(self._new, now - self._last_s):
            self.retrain(now)

    def retrain(self, now: float) -> None:
        """Train a new version on the observations kept; keep the old one if training fails."""
        self._new, self._last_s = 0, now
        try:
            model, scores = train(self.policy, list(self._observations), self.model.version + 1)
        except Exception:
            # The live learner logs and keeps serving the last good version; so does the replay.
            self.failures += 1
            return
        self.model, self.scores = model, scores

    def report(self) -> dict[str, object]:
        """Return the model's version, its observations and its errors, for the result file."""
        holdout: dict[str, dict[str, float | None]] = {}
        prior: dict[str, dict[str, float | None]] = {}
        for pool, models in sorted(self.scores.items()):
            for targets in models.values():
                for target, score in targets.items():
                    holdout.setdefault(pool, {})[target] = _round(score.mape)
                    prior.setdefault(pool, {})[target] = _round(score.prior_mape)
        return {
            "version": self.model.version,
            "training_failures": self.failures,
            "observations": dict(sorted(self.seen.items())),
            "mape_online": self._all.mape(),
            f"mape_after_{WARM_OBSERVATIONS}": self._warm.mape(),
            "mape_holdout_last_version": holdout,
            "mape_prior_holdout_last_version": prior,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
