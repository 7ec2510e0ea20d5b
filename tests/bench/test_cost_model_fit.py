"""Where the cost model's energy error comes from: the meter rebuilt from the replay's spans
splits energy as the replay's own ledger did, and a finer meter splits it closer to what each
request drew."""

from __future__ import annotations

import random
from pathlib import Path

from bench.cost_model_fit import METER_INTERVAL_S, attribution, replay, split_again
from gateway.policy.load import load_policy
from lab.scenario import PLAIN

ROOT = Path(__file__).resolve().parents[2]


def test_the_rebuilt_meter_splits_as_the_replay_did_and_a_finer_one_comes_closer() -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    trace = ROOT / "traces" / "azure_llm_2023_conv.csv"
    run, observations, phase = replay(policy, trace, seed=0, scenario=PLAIN, limit=1500)
    assert 0 <= phase < 1 and phase == random.Random(0).random()
    found = attribution(split_again(run, phase, METER_INTERVAL_S), observations)
    assert set(found) == {"gpu", "asic"}
    for pool in found.values():
        assert pool["rebuilt_vs_replay_max_relative_difference"] < 1e-6
        assert pool["mape_metered_0.1s_vs_continuous"] < pool["mape_metered_vs_continuous"]
