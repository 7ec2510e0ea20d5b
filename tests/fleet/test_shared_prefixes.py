"""Replicas sharing the prefix index through a real Redis server."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import redis.asyncio as aioredis
from replicas import Replica, replica
from waiting import until

from gateway.fleet.shared_prefixes import SharedPrefixes
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import Fleet
from gateway.metrics import GatewayMetrics
from gateway.routing.prefix import MAX_BLOCKS
from policies import fleet_policy

BLOCKS = tuple(range(1, 41))


async def listening(r: Replica, count: int) -> None:
    """Wait until `count` replicas listen on the channel, so no notice is published unheard."""

    async def subscribers() -> bool:
        found = await r.shared.redis.pubsub_numsub(r.shared.channel)
        return bool(found) and found[0][1] >= count

    await until(subscribers, message=f"{count} replicas never listened")


@pytest.mark.redis
def test_a_prefix_one_replica_sent_is_known_to_the_other(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with (
            replica(redis_url, redis_prefix) as a,
            replica(redis_url, redis_prefix) as b,
        ):
            await listening(a, 2)
            asic = a.asic.name
            a.fleet.prefixes.sent(asic, BLOCKS)
            await until(
                lambda: b.fleet.prefixes.cached(asic, BLOCKS) == len(BLOCKS),
                message="b never heard of a's blocks",
            )
            # b routes on it and sends the prompt on; a hears it back but it was a's already.
            b.fleet.prefixes.sent(asic, (*BLOCKS, 99))
            await until(lambda: a.fleet.prefixes.cached(asic, (*BLOCKS, 99)) == len(BLOCKS) + 1)
            long = tuple(range(1000, 1000 + MAX_BLOCKS))
            a.fleet.prefixes.sent(asic, long)
            await until(lambda: b.fleet.prefixes.cached(asic, long) == MAX_BLOCKS)
            other = b.fleet.pools["gpu"].backends[0].name
            return (
                b.fleet.prefixes.cached(other, BLOCKS),
                a.fleet.prefixes.held(asic),
                b.fleet.prefixes.held(asic),
            )

    on_other, held_a, held_b = asyncio.run(scenario())
    assert on_other == 0  # the blocks are known where they were sent, nowhere else
    assert held_a == held_b == len(BLOCKS) + 1 + MAX_BLOCKS


@pytest.mark.redis
def test_a_malformed_notice_changes_nothing(redis_url: str, redis_prefix: str) -> None:
    async def scenario() -> tuple[int, int]:
        async with replica(redis_url, redis_prefix) as a:
            await listening(a, 1)
            asic = a.asic.name
            client = aioredis.Redis.from_url(redis_url)
            try:
                for sent in (
                    "not a list",
                    [["asic", "x"]],
                    [[asic, ["1", "2"]], [asic]],
                    [[asic, [7, 8]]],  # well formed: heard after the others
                ):
                    notice = {"kind": "prefixes", "from": "elsewhere", "sent": sent}
                    await client.publish(a.shared.channel, orjson.dumps(notice))
            finally:
                await client.aclose()
            await until(lambda: a.fleet.prefixes.cached(asic, (7, 8)) == 2)
            return a.fleet.prefixes.held(asic), a.fleet.prefixes.cached(asic, (1, 2))

    assert asyncio.run(scenario()) == (2, 0)


def test_without_redis_a_replica_keeps_its_own_index_and_tells_no_one() -> None:
    fleet = Fleet(fleet_policy())
    # Never started: the state of a replica that cannot reach Redis.
    shared = SharedState("redis://127.0.0.1:1", GatewayMetrics())
    told = SharedPrefixes(shared, fleet.prefixes)
    asic = fleet.pools["asic"].backends[0].name
    fleet.prefixes.sent(asic, BLOCKS)
    assert fleet.prefixes.cached(asic, BLOCKS) == len(BLOCKS)
    assert told._pending == []
