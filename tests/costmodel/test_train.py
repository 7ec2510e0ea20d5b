from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from gateway.costmodel.predict import TARGETS, CostModel
from gateway.costmodel.train import (
    MIN_OBSERVATIONS,
    Observation,
    RetrainSchedule,
    _columns,
    design,
    observations_from_rows,
    train,
)
from gateway.policy.load import load_policy

POLICY = load_policy(Path(__file__).resolve().parents[2] / "policies/default.yaml")
MODEL = "llama-3.1-8b-instruct"


def true_world(pool: str, prompt: int, output: int, n: int, rng: random.Random) -> Observation:
    """A device that is not what its vendor sheet says: slower prefill, hungrier decode."""
    phys = CostModel(POLICY).pool_model(pool, MODEL).physics
    noise = lambda: rng.lognormvariate(0, 0.03)  # noqa: E731
    ttft = (0.005 + 2.2 * phys.prefill_per_token_s * prompt) * noise()
    tpot = (1.4 * phys.step_fixed_s + 3 * phys.step_per_seq_s * (n - 1)) * noise()
    e2e = ttft + (output - 1) * tpot
    energy = e2e * (1.3 * phys.watts(n)) / n * noise()
    return Observation(pool, MODEL, prompt, output, n, ttft, tpot, e2e, energy)


def observations(pool: str, count: int, seed: int = 1) -> list[Observation]:
    rng = random.Random(seed)
    return [
        true_world(pool, rng.randint(20, 3000), rng.randint(5, 400), rng.randint(1, 16), rng)
        for _ in range(count)
    ]


def test_learns_the_residual_to_within_ten_percent_after_500_observations() -> None:
    data = observations("asic", 500)
    model, scores = train(POLICY, data, version=3)
    asic = scores["asic"][MODEL]
    for target in ("ttft", "tpot", "e2e", "energy"):
        assert asic[target].mape is not None and asic[target].mape < 0.10, target
        assert asic[target].prior_mape is not None and asic[target].prior_mape > asic[target].mape
    assert model.version == 3
    probe = observations("asic", 200, seed=9)
    errors = []
    for o in probe:
        p = model.predict("asic", MODEL, o.prompt_tokens, o.completion_tokens, o.concurrent)
        errors.append(abs(p.e2e_s - o.e2e_s) / o.e2e_s)
    assert sum(errors) / len(errors) < 0.10


def test_upper_bound_covers_about_nine_in_ten() -> None:
    model, _ = train(POLICY, observations("gpu", 600))
    probe = observations("gpu", 400, seed=5)
    covered = sum(
        o.ttft_s
        <= model.predict(
            "gpu", MODEL, o.prompt_tokens, o.completion_tokens, o.concurrent
        ).ttft_upper_s
        for o in probe
        if o.ttft_s is not None
    )
    assert 0.8 <= covered / len(probe) <= 0.99


def test_few_observations_keep_the_prior() -> None:
    model, scores = train(POLICY, observations("cim", MIN_OBSERVATIONS - 1))
    prior = CostModel(POLICY)
    assert scores["cim"][MODEL]["e2e"].mape is None
    a = model.predict("cim", MODEL, 100, 50, 2)
    b = prior.predict("cim", MODEL, 100, 50, 2)
    assert a.e2e_s == pytest.approx(b.e2e_s)


def test_unknown_pools_in_history_are_ignored() -> None:
    stale = [Observation("tpu", MODEL, 10, 10, 1, 0.1, 0.01, 0.2, 1.0)] * 50
    _, scores = train(POLICY, stale)
    assert "tpu" not in scores


def test_held_out_error_scores_the_learned_fit_not_the_prior_on_long_histories() -> None:
    # With thousands of observations the held-out rows are many half-lives newer than the
    # training rows; the fit scored on them must still be the learned one.
    _, scores = train(POLICY, observations("asic", 3000))
    asic = scores["asic"][MODEL]
    assert asic["ttft"].mape is not None and asic["ttft"].mape < 0.10
    assert asic["ttft"].prior_mape is not None and asic["ttft"].prior_mape > 0.3


def slowed(o: Observation, factor: float) -> Observation:
    assert o.ttft_s is not None and o.tpot_s is not None and o.energy_j is not None
    return o._replace(
        ttft_s=o.ttft_s * factor,
        tpot_s=o.tpot_s * factor,
        e2e_s=o.e2e_s * factor,
        energy_j=o.energy_j * factor,
    )


def test_a_pool_seldom_chosen_since_it_recovered_is_not_held_to_its_slow_spell() -> None:
    # The ASIC runs three times slower while the fleet makes 1,500 observations, a third of
    # them its own; then it recovers, and the router, which stopped choosing it, sends it one
    # request in fifty of the next 4,000. Its model follows what those few say: on the pool's
    # own count the slow spell would be the 300 newest observations but 80.
    slow = [slowed(o, 3.0) for o in observations("asic", 500, seed=2)]
    well = observations("asic", 80, seed=3)
    others = iter(observations("gpu", 5000, seed=4))
    history = []
    for o in slow:
        history += [o, next(others), next(others)]
    for o in well:
        history += [o, *(next(others) for _ in range(49))]
    model, _ = train(POLICY, history)
    truth = observations("asic", 200, seed=9)
    errors = [
        abs(
            model.predict("asic", MODEL, o.prompt_tokens, o.completion_tokens, o.concurrent).e2e_s
            - o.e2e_s
        )
        / o.e2e_s
        for o in truth
    ]
    assert sum(errors) / len(errors) < 0.15


def test_energy_is_learned_as_the_median_share_when_some_requests_end_alone() -> None:
    # A fifth of the requests see the others leave and end alone, paying three times the share;
    # the rest pay what the prior says times 1.2. The model predicts what most pay.
    rng = random.Random(3)
    phys = CostModel(POLICY).pool_model("gpu", MODEL).physics
    data = []
    for _ in range(1000):
        prompt, output, n = rng.randint(20, 3000), rng.randint(5, 400), rng.randint(2, 16)
        e2e = phys.ttft_s(prompt) + (output - 1) * phys.tpot_s(n)
        share = e2e * phys.watts(n) / n * 1.2 * rng.lognormvariate(0, 0.02)
        energy = share * (3 if rng.random() < 0.2 else 1)
        data.append(Observation("gpu", MODEL, prompt, output, n, None, None, e2e, energy))
    model, _ = train(POLICY, data)
    prior = CostModel(POLICY)
    for prompt, output, n in [(100, 50, 2), (2000, 300, 12)]:
        learned = model.predict("gpu", MODEL, prompt, output, n).energy_j
        assert learned == pytest.approx(
            1.2 * prior.predict("gpu", MODEL, prompt, output, n).energy_j, rel=0.05
        )


def test_learns_a_curvature_in_log_output_that_a_line_misses() -> None:
    # Steps that turn dearer past a few hundred tokens and cheaper for the shortest answers: a
    # bowl in log output, around 30 tokens.
    rng = random.Random(4)
    phys = CostModel(POLICY).pool_model("asic", MODEL).physics
    data = []
    for _ in range(2000):
        prompt, output, n = rng.randint(20, 2000), rng.randint(2, 1500), rng.randint(1, 16)
        bowl = math.exp(0.1 * (math.log1p(output) - math.log1p(30)) ** 2)
        tpot = phys.tpot_s(n) * bowl * rng.lognormvariate(0, 0.01)
        data.append(Observation("asic", MODEL, prompt, output, n, None, tpot, 1.0, None))
    _, scores = train(POLICY, data)
    assert scores["asic"][MODEL]["tpot"].mape is not None
    assert scores["asic"][MODEL]["tpot"].mape < 0.02


def test_the_median_fit_is_scikit_learns_least_absolute_deviations() -> None:
    import numpy as np
    from sklearn import linear_model

    from gateway.costmodel.train import median_ridge

    rng = np.random.default_rng(8)
    x = rng.normal(size=(400, 4))
    # Skewed noise, where the median and the mean part ways.
    y = x @ np.array([0.5, -1.0, 0.2, 2.0]) + rng.exponential(0.5, size=400)
    weights = rng.uniform(0.1, 1.0, size=400)
    expected = linear_model.QuantileRegressor(
        quantile=0.5, alpha=0.0, fit_intercept=False, solver="highs"
    ).fit(x, y, sample_weight=weights)
    got = median_ridge(x, y, weights, alpha=1e-9, passes=50)
    assert got == pytest.approx(expected.coef_, abs=0.01)


def test_the_closed_form_ridge_is_scikit_learns_ridge() -> None:
    import numpy as np
    from sklearn import linear_model

    from gateway.costmodel.train import RIDGE_ALPHA, ridge

    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 4))
    y = x @ np.array([0.5, -1.0, 0.2, 2.0]) + rng.normal(scale=0.1, size=300)
    weights = rng.uniform(0.1, 1.0, size=300)
    expected = linear_model.Ridge(alpha=RIDGE_ALPHA, fit_intercept=False).fit(x, y, weights)
    assert ridge(x, y, weights) == pytest.approx(expected.coef_, rel=1e-9, abs=1e-12)


def test_retraining_computes_the_priors_and_features_the_request_path_predicts_with() -> None:
    from gateway.costmodel.predict import Span, batch_terms, features, request_terms
    from gateway.costmodel.train import _columns, design

    slots = POLICY.pools["gpu"].slots_per_backend
    phys = CostModel(POLICY).pool_model("gpu", MODEL).physics
    group = [
        Observation("gpu", MODEL, prompt, output, n, 0.1, None, 0.5, None, context)
        for prompt, output, n, context in [
            (0, 1, 0, None),  # a record from before contexts were kept: its own alone
            (1, 0, 1, 1),
            (37, 5, 2, 5000),
            (4000, 900, slots + 9, 40_000),
        ]
    ]
    columns = _columns(group, slots, phys)
    span = Span((1.0, 5.0), (1.0, 3.0), (0.5, 1.5))  # every row's inputs past one side of it
    phi = design(columns, span)
    for i, o in enumerate(group):
        service = phys.ttft_s(o.prompt_tokens) + max(o.completion_tokens - 1, 0) * phys.tpot_s(
            o.concurrent
        )
        energy = service * phys.watts(o.concurrent) / max(o.concurrent, 1)
        assert columns["prior_ttft"][i] == pytest.approx(phys.ttft_s(o.prompt_tokens))
        assert columns["prior_tpot"][i] == pytest.approx(phys.tpot_s(o.concurrent))
        assert columns["prior_e2e"][i] == pytest.approx(service)
        assert columns["prior_energy"][i] == pytest.approx(energy)
        context = o.context_tokens or o.prompt_tokens + o.completion_tokens
        want = features(
            request_terms(o.prompt_tokens, o.completion_tokens, context, span),
            batch_terms(o.concurrent, slots, span),
        )
        assert list(phi[i]) == pytest.approx(list(want))
    assert columns["ttft"][0] == 0.1 and all(v != v for v in columns["tpot"])  # NaN: not measured


def test_prediction_evaluates_the_features_training_fitted_the_weights_on() -> None:
    # Requests past both context knees, below and past the span of prompts training saw.
    rng = random.Random(4)
    seen = [
        o._replace(context_tokens=o.prompt_tokens + o.completion_tokens + rng.randint(0, 40_000))
        for o in observations("gpu", 400)
    ]
    model, _ = train(POLICY, seen)
    learned = model.trained[("gpu", MODEL)]
    assert set(learned.residuals) == set(TARGETS)
    physics = model.pool_model("gpu", MODEL).physics
    slots = POLICY.pools["gpu"].slots_per_backend
    asked = [*seen[:40], *(o._replace(prompt_tokens=p) for o in seen[:5] for p in (0, 90_000))]
    phi = design(_columns(asked, slots, physics), learned.span)
    prior = CostModel(POLICY)
    for row, o in zip(phi, asked, strict=True):
        shape = (o.prompt_tokens, o.completion_tokens, o.concurrent, 0.0, None, o.context_tokens)
        got = model.predict("gpu", MODEL, *shape)
        base = prior.predict("gpu", MODEL, *shape)
        for target, field in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"),
                              ("energy", "energy_j")):  # fmt: skip
            weights = learned.residuals[target].weights
            factor = getattr(got, field) / getattr(base, field)
            assert math.log(factor) == pytest.approx(float(row @ weights), abs=1e-9), target


def test_observations_of_one_model_share_one_name() -> None:
    rows = [
        {"status": 200, "pool": "gpu", "model": "".join(["llama-3.1-", "8b"]), "e2e_ms": 100.0}
        for _ in range(2)
    ]
    first, second = observations_from_rows(rows)
    assert first.model == "llama-3.1-8b"
    assert first.model is second.model


def test_prefill_is_learned_from_the_prompt_tokens_the_backend_did_not_have_cached() -> None:
    row = {"status": 200, "pool": "gpu", "model": "m", "e2e_ms": 100.0, "prompt_tokens": 1000}
    cold, warm, older = observations_from_rows(
        [row, row | {"cached_tokens": 896, "context_tokens": 1200}, row | {"cached_tokens": None}]
    )
    assert (cold.prompt_tokens, warm.prompt_tokens, older.prompt_tokens) == (1000, 104, 1000)
    assert warm.context_tokens == 1200  # every decode step still reads the cached part


def test_the_retrain_schedule_waits_for_new_observations_and_spaces_urgent_runs() -> None:
    schedule = RetrainSchedule(every=200, interval_s=300.0, min_interval_s=10.0)
    assert not schedule.due(0, 10_000.0)  # nothing new: never
    assert not schedule.due(199, 60.0)
    assert schedule.due(200, 10.0)
    assert not schedule.due(5000, 9.9)  # a flood of observations still waits min_interval_s
    assert schedule.due(1, 300.0)  # anything new, after interval_s
