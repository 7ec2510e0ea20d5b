"""Backend health: probes bring ejected backends back; ejections reach every replica."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import redis
from replicas import Replica, replica
from waiting import until, wait_for

from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Tell me about analog noise in memory arrays."}]


def test_ejected_backend_returns_after_passing_health_checks(sims, tmp_path: Path) -> None:
    sims.asic[0].set_faults(error_rate=1.0)
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, health_check_interval_s=0.1) as gw:
        gw.gateway.outliers.base_ejection_s = 0.3
        client = gw.client()
        for _ in range(3):
            client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2)
        asic = gw.gateway.fleet.pools["asic"].backends[0]
        assert asic.ejected
        pools = {
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=2
            ).headers["x-gateway-pool"]
            for _ in range(3)
        }
        assert pools == {"gpu"}
        sims.asic[0].reset_faults()
        wait_for(lambda: not asic.ejected, message="the backend never came back")
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=2
        )
        assert raw.headers["x-gateway-pool"] == "asic"


@pytest.mark.redis
def test_an_ejection_on_one_replica_takes_the_backend_out_on_the_others(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> tuple[bool, bool]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix) as b,
        ):
            a.outliers.failure(a.asic)
            heard = await until(lambda: b.asic.ejected, message="b never heard of the ejection")
            # A replica that joins now learns the ejection in force from Redis.
            async with replica(redis_url, redis_prefix) as c:
                learned = c.asic.ejected
            return heard, learned

    assert asyncio.run(scenario()) == (True, True)


@pytest.mark.redis
def test_ejections_other_replicas_announce_are_forgiven_like_its_own(
    redis_url: str, redis_prefix: str
) -> None:
    # A backend with a fault now and then, seen failing by replica a: b hears each ejection.
    # Serving 10 s after each return forgives the doubling, so b's own ejection is the base one.
    now = [1000.0]

    def clock() -> float:
        return now[0]

    async def heard(r: Replica) -> None:
        await until(lambda: r.asic.ejected, message="the ejection notice never arrived")

    async def scenario() -> list[float]:
        async with (
            replica(redis_url, redis_prefix, clock=clock) as a,
            replica(redis_url, redis_prefix, clock=clock) as b,
        ):
            intervals = []
            for _ in range(3):
                a.outliers.failure(a.asic)
                await heard(b)
                intervals.append(b.asic.ejected_until - now[0])
                now[0] = max(a.asic.ejected_until, b.asic.ejected_until)
                assert a.outliers.restore(a.asic) and b.outliers.restore(b.asic)
                now[0] += 10.0  # both serve for 10 s after the backend returns
            b.outliers.failure(b.asic)
            intervals.append(b.asic.ejected_until - now[0])
            return intervals

    assert asyncio.run(scenario()) == [2.0, 2.0, 2.0, 2.0]


@pytest.mark.redis
def test_an_ejection_redis_says_lasts_years_is_bounded_like_one_seen_here(
    redis_url: str, redis_prefix: str
) -> None:
    async def scenario() -> float:
        async with replica(redis_url, redis_prefix) as a:
            channel = f"{redis_prefix}:events"
            notice = {"kind": "eject", "from": "elsewhere", "url": a.asic.url, "ms": 3e10}
            client = redis.Redis.from_url(redis_url)
            try:
                await until(  # the replica listens once it has joined
                    lambda: client.pubsub_numsub(channel)[0][1], message="a never listened"
                )
                client.publish(channel, orjson.dumps(notice))
            finally:
                client.close()
            await until(lambda: a.asic.ejected, message="the notice never arrived")
            return a.asic.ejected_until - a.outliers.clock()

    assert 0 < asyncio.run(scenario()) <= 30.0  # the detector's longest ejection
