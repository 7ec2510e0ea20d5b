"""The replay's learner: the cost model learned online, scored before it learns each request."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gateway.costmodel.train import Observation, RetrainSchedule
from gateway.policy.definition import Policy
from gateway.whatif.replay_learner import OnlineLearner
from gateway.whatif.scorecard import measure
from gateway.whatif.strategy import learned
from gateway.whatif.timeline import MODEL
from gateway.whatif.trace import TraceRequest


def test_the_learned_router_retrains_on_what_it_measured(
    policy: Policy, requests: list[TraceRequest]
) -> None:
    model = cast(dict[str, Any], measure(learned(policy), requests, seed=7)["cost_model"])
    assert model["version"] >= 1
    assert sum(model["observations"].values()) == len(requests)
    assert model["training_failures"] == 0


def test_each_observation_is_scored_against_the_model_serving_before_it_is_learned(
    policy: Policy,
) -> None:
    learner = OnlineLearner(policy, schedule=RetrainSchedule(every=40, min_interval_s=0))
    prior = learner.model.predict("gpu", MODEL, 500, 100, 4)
    # The device takes twice what the prior says, for every target.
    seen = Observation(
        "gpu", MODEL, 500, 100, 4, prior.ttft_s * 2, prior.tpot_s * 2, prior.e2e_s * 2,
        prior.energy_j * 2,
    )  # fmt: skip
    learner.observe(seen, now=0.0)
    assert learner.report()["mape_online"]["gpu"]["e2e"] == pytest.approx(0.5)
    for n in range(1, 200):
        learner.observe(seen, now=float(n))
    assert learner.model.version >= 1
    learned = learner.model.predict("gpu", MODEL, 500, 100, 4)
    assert learned.e2e_s == pytest.approx(seen.e2e_s, rel=0.05)
    # Scored out of sample: the error counted before each retrain, so the mean stays above 0.
    assert 0 < learner.report()["mape_online"]["gpu"]["e2e"] < 0.5
