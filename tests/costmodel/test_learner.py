"""The learner: measured requests become cost-model versions, fitted in a process of their own."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from pathlib import Path

from rows import request_record

from gateway.costmodel import store
from gateway.costmodel.learner import Learner
from gateway.costmodel.predict import CostModel
from gateway.costmodel.train import observation
from gateway.db.connection import connect, upgrade
from gateway.metrics import GatewayMetrics
from policies import MODEL, fleet_policy


def test_a_retraining_is_fitted_outside_the_serving_process_and_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    db = connect(url)
    policy = fleet_policy()
    served: list[CostModel] = []
    learner = Learner(lambda: policy, db, GatewayMetrics(), served.append)
    draw = random.Random(7)
    for n in range(200):  # measured GPU requests, each slower than the vendor sheet says
        prompt, output = draw.randint(50, 3000), draw.randint(20, 400)
        seen = observation(
            dataclasses.replace(
                request_record(n),
                model=MODEL,
                prompt_tokens=prompt,
                completion_tokens=output,
                ttft_ms=30 + 0.05 * prompt,
                tpot_ms=9.0,
                e2e_ms=30 + 0.05 * prompt + 9.0 * output,
                energy_j=0.5 * output,
                energy_estimated=False,
                concurrent=draw.randint(1, 8),
                context_tokens=draw.randint(1000, 30_000),
            )
        )
        assert seen is not None
        learner.observe(seen)

    async def retrain() -> CostModel | None:
        try:
            return await learner.train_now()
        finally:
            await learner.stop()

    model = asyncio.run(retrain())
    assert model is not None and served == [model]
    assert learner.trainer_pid is not None and learner.trainer_pid != os.getpid()
    stored = store.load_latest(db, policy)
    assert stored is not None and stored.version == model.version == 1
    # What it learned: the GPU's steps are slower than the prior, at every load.
    prior = CostModel(policy).predict("gpu", MODEL, 500, 100, 2)
    learned = model.predict("gpu", MODEL, 500, 100, 2)
    assert learned.tpot_s > 1.2 * prior.tpot_s
    db.dispose()
