"""Token buckets in memory and in Redis, and tenants' rate limits on the request path."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import openai
import pytest
from waiting import until

from gateway.fleet.ratelimit import Bucket, Draw, TokenBuckets, tenant_draws
from gateway.fleet.sharedstate import SharedState
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import RateLimit
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy


def test_a_bucket_allows_its_capacity_then_refills_at_its_rate() -> None:
    bucket = Bucket(rate=2.0, capacity=2.0, now=0.0)
    assert [bucket.take(1, 0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(1, 0.4) is False
    assert bucket.take(1, 0.5) is True
    assert bucket.wait_s(1, 0.5) == pytest.approx(0.5)


def test_a_cost_beyond_the_capacity_waits_for_a_full_bucket_instead_of_never_passing() -> None:
    bucket = Bucket(rate=10.0, capacity=100.0, now=0.0)
    assert bucket.take(500, 0.0) is True
    assert bucket.wait_s(500, 0.0) == pytest.approx(10.0)


def test_spending_from_several_buckets_is_all_or_nothing() -> None:
    buckets = TokenBuckets(clock=lambda: 0.0)
    requests, tokens = Draw("r", 1.0, 10.0), Draw("t", 1.0, 100.0, cost=60)
    assert asyncio.run(buckets.take([requests, tokens])) == 0
    assert asyncio.run(buckets.take([requests, tokens])) == pytest.approx(20.0)
    # The refused request spent nothing from the request bucket: nine are left.
    assert [asyncio.run(buckets.take([requests])) for _ in range(10)].count(0) == 9


def test_settling_gives_back_what_was_not_used_and_takes_what_was_owed() -> None:
    buckets = TokenBuckets(clock=lambda: 0.0)
    draw = Draw("t", rate=1.0, capacity=100.0, cost=90)
    assert asyncio.run(buckets.take([draw])) == 0
    asyncio.run(buckets.settle(Draw("t", 1.0, 100.0, cost=-80)))  # used 10 of the 90
    assert asyncio.run(buckets.take([draw])) == 0
    asyncio.run(buckets.settle(Draw("t", 1.0, 100.0, cost=500)))  # used far more: owes 100
    assert asyncio.run(buckets.take([Draw("t", 1.0, 100.0, cost=1)])) == pytest.approx(101.0)


def test_tenant_draws_spend_requests_and_tokens_a_minute() -> None:
    draws = tenant_draws("acme", RateLimit(requests_per_minute=60, tokens_per_minute=6000), 300)
    assert draws == [
        Draw("tenant:acme:requests", 1.0, 60.0),
        Draw("tenant:acme:tokens", 100.0, 6000.0, 300),
    ]


@pytest.mark.redis
def test_replicas_spend_from_one_bucket_in_redis(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> tuple[int, float]:
        replicas = [SharedState(redis_url, GatewayMetrics(), prefix=redis_prefix) for _ in "ab"]
        for shared in replicas:
            await shared.start()
        try:
            buckets = [TokenBuckets(shared) for shared in replicas]
            draw = Draw("shared", rate=0.1, capacity=5)
            waits = [await buckets[i % 2].take([draw]) for i in range(8)]
            return waits.count(0), max(waits)
        finally:
            for shared in replicas:
                await shared.stop()

    allowed, longest = asyncio.run(scenario())
    assert allowed == 5
    assert 0 < longest <= 10.0


@pytest.mark.redis
def test_replicas_settle_the_bucket_in_redis(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> list[float]:
        replicas = [SharedState(redis_url, GatewayMetrics(), prefix=redis_prefix) for _ in "ab"]
        for shared in replicas:
            await shared.start()
        try:
            a, b = (TokenBuckets(shared) for shared in replicas)
            draw = Draw("settled", rate=0.01, capacity=100, cost=90)
            first = await a.take([draw])
            await b.settle(Draw("settled", 0.01, 100, cost=-80))
            return [first, await a.take([draw]), await b.take([draw])]
        finally:
            for shared in replicas:
                await shared.stop()

    first, given_back, spent = asyncio.run(scenario())
    assert first == 0 and given_back == 0 and spent > 0


@pytest.mark.redis
def test_without_redis_each_replica_spends_its_share_of_the_rate(private_redis) -> None:
    url = private_redis.url  # type: ignore[attr-defined]

    async def scenario() -> int:
        a, b = (SharedState(url, GatewayMetrics(), prefix="p", lease_s=0.4) for _ in "ab")
        await a.start()
        await b.start()
        await until(  # a's heartbeat sees b: two replicas
            lambda: a.replicas == 2, message=lambda: f"a counts {a.replicas} replicas, not 2"
        )
        private_redis.stop()  # type: ignore[attr-defined]
        try:
            buckets = TokenBuckets(a)
            waits = [await buckets.take([Draw("share", 0.01, 10)]) for _ in range(10)]
            return waits.count(0)
        finally:
            await a.stop()
            await b.stop()

    assert asyncio.run(scenario()) == 5  # half of the ten a minute, for each of two replicas


def tenant(name: str, key: str, **limit: float) -> dict:
    return {
        "name": name,
        "api_key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
        "rate_limit": limit,
    }


def test_a_tenant_over_its_limit_gets_429_with_retry_after_and_others_are_served(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        tenants=[
            tenant("acme", "acme-key", requests_per_minute=3),
            tenant("globex", "globex-key", tokens_per_minute=100),
        ],
    )

    def ask(server, key: str, max_tokens: int = 4) -> str:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        try:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=max_tokens,
                extra_body={"ignore_eos": True},  # every answer as long as max_tokens allows
            )
            return "ok"
        except openai.RateLimitError as exc:
            assert exc.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
            assert "acme" in exc.message or "globex" in exc.message
            assert int(exc.response.headers["retry-after"]) >= 1
            return "limited"

    with run_gateway(policy, tmp_path) as server:
        acme = [ask(server, "acme-key") for _ in range(5)]
        anonymous = [ask(server, "no-tenant") for _ in range(5)]
        # globex pays in tokens: a prompt plus 60 output tokens each, 100 a minute.
        globex = [ask(server, "globex-key", max_tokens=60) for _ in range(2)]
        metrics = server.http().get("/metrics").text
    assert acme == ["ok"] * 3 + ["limited"] * 2
    assert anonymous == ["ok"] * 5
    assert globex == ["ok", "limited"]
    assert 'gateway_rate_limited_total{tenant="acme"} 2.0' in metrics


def test_a_tenant_is_charged_what_its_answers_used_not_what_they_might_have(
    sims, tmp_path: Path
) -> None:
    # Each request may use 3,000 tokens and is charged that up front; its answer stops by
    # itself within 400. Charged only up front, the second would wait some 40 s for the
    # bucket to refill; settled for what the first used, it is served at once.
    policy = fleet_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        tenants=[tenant("acme", "acme-key", tokens_per_minute=3500)],
    )
    with run_gateway(policy, tmp_path) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="acme-key", max_retries=0)
        used = []
        for _ in range(2):
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2990
            )
            assert answer.usage is not None and answer.usage.completion_tokens <= 400
            used.append(answer.usage.total_tokens)
        # A request that alone may use more than the tenant's minute can never pass: 400.
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1200, n=3
            )
        # best_of answers are generated too, though one is returned: each is charged.
        with pytest.raises(openai.BadRequestError) as best_of:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=1200,
                extra_body={"best_of": 3},
            )
    assert best_of.value.body["code"] == "exceeds_rate_limit"  # type: ignore[index]
    assert refused.value.body["code"] == "exceeds_rate_limit"  # type: ignore[index]
    assert refused.value.body["param"] == "max_tokens"  # type: ignore[index]
    assert "acme" in refused.value.message and "3500" in refused.value.message
    assert len(used) == 2


def test_a_request_naming_no_output_limit_is_given_the_one_it_is_charged(
    sims, tmp_path: Path
) -> None:
    # ignore_eos makes the backend generate until its limit: without one written into the
    # forwarded body that is the model's whole context, far beyond what the request was charged.
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)

        def ask(**extra: object) -> tuple[int, str]:
            answer = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"ignore_eos": True} | extra,
            )
            assert answer.usage is not None
            return answer.usage.completion_tokens, answer.choices[0].finish_reason

        assert ask() == (policy.assumed_max_tokens, "length")
        # min_tokens above the assumed limit raises the limit to it, as the backend requires.
        assert ask(min_tokens=policy.assumed_max_tokens + 44) == (
            policy.assumed_max_tokens + 44,
            "length",
        )


def test_a_request_without_a_key_is_not_charged_to_a_tenant_named_anonymous(
    sims, tmp_path: Path
) -> None:
    # Requests without a tenant key are recorded as "anonymous"; a tenant may have that name.
    policy = fleet_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        tenants=[tenant("anonymous", "its-key", requests_per_minute=1)],
    )

    def ask(server, key: str) -> str:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        try:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            return "ok"
        except openai.RateLimitError:
            return "limited"

    with run_gateway(policy, tmp_path) as server:
        keyless = [ask(server, "no-tenant") for _ in range(3)]
        keyed = [ask(server, "its-key") for _ in range(2)]
    assert keyless == ["ok"] * 3
    assert keyed == ["ok", "limited"]
