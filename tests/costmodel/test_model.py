from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from gateway.costmodel.predict import (
    FEATURES,
    TARGETS,
    CostModel,
    Learned,
    PoolModel,
    Prediction,
    Residual,
    Span,
    batch_terms,
    features,
    request_terms,
)
from gateway.policy.load import load_policy
from gateway.policy.tariffs import Rate

POLICY = load_policy(Path(__file__).resolve().parents[2] / "policies/default.yaml")
MODEL = "llama-3.1-8b-instruct"


# What training saw: prompts of 20 to 2,000 tokens, outputs of 5 to 300, 1 to 8 at a time, so
# the cases below fall inside it, below it and past it.
SEEN = Span(
    (math.log1p(20), math.log1p(2000)), (math.log1p(5), math.log1p(300)), (0.0, math.log(8))
)


def learned(seed: int) -> dict[tuple[str, str], Learned]:
    rng = random.Random(seed)
    return {
        (pool, MODEL): Learned(
            {
                target: Residual(
                    tuple(rng.uniform(-0.05, 0.05) for _ in FEATURES), rng.uniform(0, 1)
                )
                for target in TARGETS
            },
            SEEN,
        )
        for pool in POLICY.pools
    }


def by_definition(
    model: CostModel,
    pool: str,
    prompt: int,
    output: int,
    concurrent: int,
    queue_s: float,
    rate: Rate | None,
    context: int | None,
) -> Prediction:
    """Predict as the model's docstring defines it: prior(x) · exp(w · φ(x)), with φ from
    `features` (what training fits on) and each factor from `Residual.factor`."""
    pm = model.pool_model(pool, MODEL)
    phys = pm.physics
    fit = model.trained.get((pool, MODEL), Learned())
    r = {t: fit.residuals.get(t, Residual()) for t in TARGETS}
    own = prompt + output
    context = own if context is None else context
    phi = features(
        request_terms(prompt, output, context, fit.span),
        batch_terms(concurrent, phys.slots, fit.span),
    )
    prefill = phys.ttft_s(prompt) * r["ttft"].factor(phi)
    tpot = phys.tpot_s(concurrent) * r["tpot"].factor(phi)
    others, slowed = concurrent - 1, 0.0
    if others > 0 and output > 1:
        before = features(
            request_terms(prompt, output, max(context - own, 0), fit.span),
            batch_terms(others, phys.slots, fit.span),
        )
        step_before = phys.tpot_s(others) * r["tpot"].factor(before)
        slowed = others * (output - 1) * max(tpot - step_before, 0.0)
    if others > 0:
        # Its prompt's chunks share the steps the others decode in: its prefill in a batch of one.
        alone = features(
            request_terms(prompt, output, context, fit.span), batch_terms(1, phys.slots, fit.span)
        )
        slowed += others * phys.ttft_s(prompt) * r["ttft"].factor(alone)
    service_prior = phys.ttft_s(prompt) + max(output - 1, 0) * phys.tpot_s(concurrent)
    service = service_prior * r["e2e"].factor(phi)
    watts = phys.watts(concurrent)
    energy = service_prior * watts / concurrent * r["energy"].factor(phi)
    marginal = energy * (watts - phys.idle_w) / watts
    rate = rate or Rate(pm.pool.price.usd_per_kwh, pm.pool.price.g_co2_per_kwh)
    per_s = pm.pool.price.usd_per_hour / 3600
    return Prediction(
        pool=pool,
        output_tokens=output,
        concurrent=concurrent,
        queue_s=queue_s,
        ttft_s=queue_s + prefill,
        ttft_upper_s=queue_s + prefill * r["ttft"].upper,
        tpot_s=tpot,
        tpot_upper_s=tpot * r["tpot"].upper,
        e2e_s=queue_s + service,
        e2e_upper_s=queue_s + service * r["e2e"].upper,
        energy_j=energy,
        marginal_energy_j=marginal,
        cost_usd=energy * rate.usd_per_j + service * per_s / concurrent,
        marginal_cost_usd=marginal * rate.usd_per_j + (service + slowed) * per_s / phys.slots,
        carbon_g=energy * rate.g_co2_per_j,
        marginal_carbon_g=marginal * rate.g_co2_per_j,
        rate=rate,
    )


def figures(prediction: Prediction) -> dict[str, float]:
    values = {name: getattr(prediction, name) for name in Prediction.__slots__}
    return {name: value for name, value in values.items() if isinstance(value, float)}


def assert_same(got: Prediction, want: Prediction) -> None:
    assert figures(got) == pytest.approx(figures(want), rel=1e-12)
    assert (got.pool, got.output_tokens, got.concurrent, got.rate) == (
        want.pool,
        want.output_tokens,
        want.concurrent,
        want.rate,
    )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("pool", ["gpu", "asic", "cim"])
@pytest.mark.parametrize(
    ("prompt", "output", "concurrent", "context"),
    [
        (600, 100, 1, None),  # alone: no batch to slow down
        (600, 100, 6, 3000),  # below the first knee
        (37, 1, 3, 5000),  # one output token: no decode steps
        (4000, 900, 4, 20_000),  # past both knees, the others' cache past the first
        (0, 0, 2, None),
        (200, 50, 9, 9000),
        (200, 50, 32, 60_000),  # a full backend of the largest pools
        (200, 50, 41, 9000),  # more than a backend's slots: the load feature past 1
    ],
)
def test_prediction_is_the_prior_times_the_learned_factor_of_the_features_training_fits_on(
    seed: int, pool: str, prompt: int, output: int, concurrent: int, context: int | None
) -> None:
    model = CostModel(POLICY, version=1, trained=learned(seed))
    for queue_s, rate in [(0.0, None), (0.25, Rate(0.31, 420.0))]:
        got = model.predict(pool, MODEL, prompt, output, concurrent, queue_s, rate, context)
        want = by_definition(model, pool, prompt, output, concurrent, queue_s, rate, context)
        assert_same(got, want)


def test_the_prior_alone_predicts_where_nothing_was_learned() -> None:
    model = CostModel(POLICY)
    got = model.predict("gpu", MODEL, 600, 100, 5, context=8000)
    want = by_definition(model, "gpu", 600, 100, 5, 0.0, None, 8000)
    assert_same(got, want)


def test_a_residual_needs_one_weight_per_feature() -> None:
    with pytest.raises(
        ValueError, match=f"has 5 weights; expected one per feature \\({len(FEATURES)}"
    ):
        Residual((0.1,) * 5)


def test_past_what_training_saw_the_curvature_holds_its_edge() -> None:
    # A fit whose only term is log prompt squared: within the span it bends the prior, past it
    # the prediction is the prior times the bend at the span's edge.
    weights = tuple(0.02 if name == "log_prompt_squared" else 0.0 for name in FEATURES)
    trained = {("gpu", MODEL): Learned({"ttft": Residual(weights)}, SEEN)}
    model, prior = CostModel(POLICY, version=1, trained=trained), CostModel(POLICY)
    edge = math.exp(0.02 * math.log1p(2000) ** 2)
    for prompt, factor in [(1000, math.exp(0.02 * math.log1p(1000) ** 2)), (100_000, edge)]:
        learned = model.predict("gpu", MODEL, prompt, 10, 1).ttft_s
        assert learned == pytest.approx(prior.predict("gpu", MODEL, prompt, 10, 1).ttft_s * factor)


def test_a_pool_of_many_slots_is_tabulated_as_decisions_need_it_not_when_a_model_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A retrained model is built on the serving loop: tabulating 100,000 slots per pool there
    # would hold every request for as long.
    doc = POLICY.model_dump()
    for spec in doc["pools"].values():
        spec["slots_per_backend"] = 100_000
    policy = type(POLICY).model_validate(doc)
    tabulated: list[int] = []
    at_concurrency = PoolModel._at_concurrency

    def counted(self: PoolModel, concurrent: int) -> tuple[float, ...]:
        tabulated.append(concurrent)
        return at_concurrency(self, concurrent)

    monkeypatch.setattr(PoolModel, "_at_concurrency", counted)
    model = CostModel(policy, version=1, trained=learned(0))
    assert tabulated == []
    first = model.predict("gpu", MODEL, 600, 100, 5000, context=9000)
    again = model.predict("gpu", MODEL, 600, 100, 5000, context=9000)
    # Its batch, the batch without it, and a batch of one (its prefill's toll on the others).
    assert sorted(tabulated) == [1, 4999, 5000]
    assert_same(again, first)
    assert_same(first, by_definition(model, "gpu", 600, 100, 5000, 0.0, None, 9000))


def test_a_prompt_joining_a_busy_backend_pays_for_the_steps_its_prefill_lengthens() -> None:
    """Under chunked prefill every sequence decoding beside a prompt waits through its chunks:
    a one-token answer (no decode steps of its own to slow anyone) still costs the others its
    prefill each: on a backend with eight others its slot time is eight prefills more than its
    own, and a longer prompt's toll grows with it."""
    model = CostModel(POLICY)
    pm = model.pool_model("gpu", MODEL)
    per_slot_s = pm.pool.price.usd_per_hour / 3600 / pm.physics.slots
    alone = model.predict("gpu", MODEL, 1500, 1, 1)
    crowded = model.predict("gpu", MODEL, 1500, 1, 9)
    toll = (
        crowded.marginal_cost_usd
        - crowded.e2e_s * per_slot_s
        - (crowded.marginal_energy_j * crowded.rate.usd_per_j)
    )
    assert toll == pytest.approx(8 * crowded.ttft_s * per_slot_s, rel=1e-9)
    assert toll > 5 * alone.e2e_s * per_slot_s  # eight others' wait: most of what it costs
    longer = model.predict("gpu", MODEL, 3000, 1, 9)
    assert longer.marginal_cost_usd - longer.e2e_s * per_slot_s > 1.5 * toll
