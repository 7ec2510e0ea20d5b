"""The learner: collect measured requests and retrain the cost model in the background.

It retrains when its schedule says (gateway/costmodel/train.py `RetrainSchedule`) in a trainer
process of its own, so a fit never holds the serving process's interpreter (in a thread of the
same process it stalled the event loop up to 13 ms, docs/performance.md), stores each version
with its held-out error, and swaps the new model in. If training fails, the failure is stored
and the last good version keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import sqlalchemy as sa

from gateway.costmodel import store
from gateway.costmodel.predict import CostModel
from gateway.costmodel.train import (
    DEFAULT_SCHEDULE,
    Observation,
    RetrainSchedule,
    Score,
    train,
)
from gateway.metrics import GatewayMetrics
from gateway.periodic import Periodic, helper_process
from gateway.policy.definition import Policy

log = logging.getLogger(__name__)


class Learner:
    """Turn finished request records into observations and new cost-model versions."""

    def __init__(
        self,
        policy: Callable[[], Policy],
        db: sa.Engine,
        metrics: GatewayMetrics,
        on_model: Callable[[CostModel], None],
        *,
        schedule: RetrainSchedule = DEFAULT_SCHEDULE,
        window: int = 20_000,
    ):
        self._policy = policy
        self._db = db
        self._metrics = metrics
        self._on_model = on_model
        self.schedule = schedule
        # Plain tuples of plain values, which the garbage collector stops tracking: kept as
        # objects, the window was most of what every full collection walked (5 of 6 ms).
        self._observations: deque[tuple[Any, ...]] = deque(maxlen=window)
        self._new = 0
        self._last = time.monotonic()
        self.periodic = Periodic("cost-model-learner", 1.0, self._train_if_due)
        self._training = False
        self._trainer: ProcessPoolExecutor | None = None  # started with the first retraining
        self.trainer_pid: int | None = None  # the process that fitted the newest version

    def observe(self, seen: Observation, predicted_energy_j: float | None = None) -> None:
        """Learn from a measured request (its energy, once settled, in `seen`)."""
        self._observations.append(tuple(seen))
        self._new += 1
        if predicted_energy_j and seen.energy_j:
            m = self._metrics
            ratio = seen.energy_j / predicted_energy_j
            m.child(m.prediction_ratio, seen.pool, "energy").observe(ratio)

    def due(self) -> bool:
        return not self._training and self.schedule.due(self._new, time.monotonic() - self._last)

    async def train_now(self) -> CostModel | None:
        """Retrain on the observations kept; return the new model, or None if it failed."""
        self._training = True
        snapshot = list(self._observations)
        self._new, self._last = 0, time.monotonic()
        policy = self._policy()
        version = 0
        try:
            version = await asyncio.to_thread(store.next_version, self._db)
            fitted = asyncio.get_running_loop().run_in_executor(
                self._process(), _train, policy, snapshot, version
            )
            try:
                model, scores, self.trainer_pid = await fitted
            except BrokenProcessPool:
                self._trainer = None  # it died (killed, out of memory): the next one starts anew
                raise
            model = await asyncio.to_thread(store.save, self._db, model, scores, len(snapshot))
        except Exception as exc:
            log.exception("cost-model training failed; the previous version keeps serving")
            try:
                await asyncio.to_thread(
                    store.save_failure, self._db, version, len(snapshot), repr(exc)
                )
            except Exception:
                log.exception("could not record the failed training run")
            return None
        finally:
            self._training = False
        for pool, models in scores.items():
            for targets in models.values():
                for target, score in targets.items():
                    if score.mape is not None:
                        self._metrics.model_mape.labels(pool, target).set(score.mape)
        self._metrics.model_version.set(model.version)
        self._on_model(model)
        log.info("cost model version %d trained on %d observations", model.version, len(snapshot))
        return model

    def _process(self) -> ProcessPoolExecutor:
        if self._trainer is None:
            self._trainer = helper_process()
        return self._trainer

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
        if self._trainer is not None:
            self._trainer.shutdown(wait=False, cancel_futures=True)
            self._trainer = None

    async def _train_if_due(self) -> None:
        if self.due():
            await self.train_now()


def _train(
    policy: Policy, kept: list[tuple[Any, ...]], version: int
) -> tuple[CostModel, dict[str, dict[str, dict[str, Score]]], int]:
    """Fit a version in the trainer process; return it, its scores and this process's id."""
    model, scores = train(policy, list(map(Observation._make, kept)), version)
    return model, scores, os.getpid()
