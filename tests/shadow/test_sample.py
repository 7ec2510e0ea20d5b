"""Sample: which shadow copies a routed request gets, drawn from a hash of its decision id."""

from __future__ import annotations

import math

from shadowworld import shadow_policy

from gateway.policy.definition import DEFAULT_NOISE_SHARE, NoiseFloor
from gateway.routing.classify import RequestProfile
from gateway.shadow.sample import NOISE, sample, stable_fraction
from policies import MODEL, fleet_policy


def profile(prompt_tokens: int = 100, tenant: str = "anonymous", **kw: object) -> RequestProfile:
    fields: dict = {
        "endpoint": "chat",
        "model": MODEL,
        "prompt_tokens": prompt_tokens,
        "max_tokens": 64,
        "slo_class": "interactive",
        "ttft_ms": None,
        "tpot_ms": None,
        "e2e_ms": None,
        "tenant": tenant,
        "stream": False,
    }
    fields.update(kw)
    return RequestProfile(**fields)


def keys(n: int) -> list[str]:
    return [f"{i:032x}" for i in range(n)]


def test_sample_rate_is_honoured_within_binomial_bounds() -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"], rate=0.1)
    route = policy.routes[0]
    n, p = 2000, 0.1
    picked = sum(bool(sample(profile(), route, policy, key)) for key in keys(n))
    sd = math.sqrt(n * p * (1 - p))
    assert abs(picked - n * p) < 4 * sd


def test_targets_are_sampled_independently_and_the_same_way_every_time() -> None:
    draws = [
        (stable_fraction(k, "cim") < 0.5, stable_fraction(k, "asic") < 0.5) for k in keys(2000)
    ]
    both = sum(a and b for a, b in draws)
    assert abs(both - 500) < 4 * math.sqrt(2000 * 0.25 * 0.75)
    assert stable_fraction("abc", "cim") == stable_fraction("abc", "cim")


def test_filters_and_the_candidate_context_decide_what_is_considered() -> None:
    policy = fleet_policy(
        tenants=[{"name": "acme"}],
        routes=[
            {
                "name": "chat",
                "match": {"models": [MODEL]},
                "pools": ["gpu"],
                "shadow": [
                    {
                        "pool": "cim",
                        "sample_rate": 1.0,
                        "match": {"prompt_tokens": {"max": 3000}, "tenants": ["acme"]},
                    },
                    {"pool": "asic", "sample_rate": 1.0, "match": {"prompt_tokens": {"min": 2049}}},
                ],
            }
        ],
    )
    route = policy.routes[0]

    def pools(p: RequestProfile) -> list[str | None]:
        return [plan.pool for plan in sample(p, route, policy, "k")]

    assert pools(profile(100, "acme")) == ["cim"]
    assert pools(profile(100, "other")) == []
    assert pools(profile(2500, "acme")) == ["cim", "asic"]
    # 4000 prompt + 64 output tokens exceed the CIM part's 4096-token context.
    assert pools(profile(4000, "acme")) == ["asic"]
    assert pools(profile(100, "acme", model="other-model")) == []


def test_noise_copies_are_a_share_of_the_sampled_requests() -> None:
    policy = shadow_policy(
        ["http://g:1", "http://g:2"], ["http://a:2"], ["http://c:3"], rate=0.5, noise=0.5
    )
    route = policy.routes[0]
    plans = [sample(profile(), route, policy, key) for key in keys(2000)]
    noise = [p for p in plans if any(plan.kind == "noise" for plan in p)]
    assert all(any(plan.kind == "candidate" for plan in p) for p in noise)
    assert abs(len(noise) - 500) < 4 * math.sqrt(2000 * 0.25 * 0.75)


def test_a_shadowed_route_without_a_noise_floor_gets_the_default_one() -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"], noise=None)
    route = policy.routes[0]
    assert route.noise_floor is None

    def kinds(noise_draw: float) -> list[str]:
        def draw(key: str, salt: str) -> float:
            return noise_draw if salt == NOISE else 0.0

        return [plan.kind for plan in sample(profile(), route, policy, "k", draw)]

    assert kinds(DEFAULT_NOISE_SHARE - 1e-9) == ["candidate", "noise"]
    assert kinds(DEFAULT_NOISE_SHARE) == ["candidate"]
    # The floor measures what the candidate is measured by, within its own (default) budget.
    noise = next(
        p for p in sample(profile(), route, policy, "k", lambda k, s: 0.0) if p.pool is None
    )
    assert noise.compare == route.shadow[0].compare
    assert noise.budget == NoiseFloor(share=1).budget
    # The hash draws it for a quarter of the sampled requests, the same ones every time.
    drawn = {
        k for k in keys(2000) if any(p.kind == NOISE for p in sample(profile(), route, policy, k))
    }
    assert drawn == {k for k in keys(2000) if stable_fraction(k, NOISE) < DEFAULT_NOISE_SHARE}
    assert abs(len(drawn) - 500) < 4 * math.sqrt(2000 * 0.25 * 0.75)


def test_a_noise_floor_of_share_0_is_off() -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"], noise=0.0)
    route = policy.routes[0]
    plans = sample(profile(), route, policy, "k", lambda key, salt: 0.0)
    assert route.noise is None and [p.kind for p in plans] == ["candidate"]
