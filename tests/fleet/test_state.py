"""Fleet reconfiguration: a new policy's fleet keeps the live state of the backends it keeps."""

from __future__ import annotations

import asyncio

from waiting import until

from gateway.fleet.admission import Admission
from gateway.fleet.state import Fleet
from policies import fleet_policy

GPU = ("http://127.0.0.1:1", "http://127.0.0.1:4")


def test_backends_with_unchanged_urls_keep_their_slots_and_outlier_state() -> None:
    old = Fleet(fleet_policy(gpu=GPU))
    admission = Admission(old)
    held = old.pools["gpu"].backends[0]
    slot = admission.acquire(held, kv_bytes=1000.0)
    old.pools["gpu"].backends[1].ejected = True

    new = old.reconfigure(fleet_policy(gpu=GPU[:1], gpu_extra={"slots_per_backend": 4}))
    admission.fleet = new

    kept = new.pools["gpu"].backends[0]
    assert kept is held and kept.in_flight == 1 and kept.kv_reserved == 1000.0
    assert kept.slots == 4  # the new capacity applies to the state that stays
    assert [b.url for b in new.pools["gpu"].backends] == [GPU[0]]
    admission.release(slot)  # a request routed under the old policy ends
    assert kept.in_flight == 0 and kept.kv_reserved == 0.0


def test_a_backend_moved_to_another_pool_keeps_its_state_under_its_new_pool() -> None:
    old = Fleet(fleet_policy(gpu=GPU))
    moved = old.pools["gpu"].backends[1]
    moved.in_flight = 3
    new = old.reconfigure(fleet_policy(gpu=GPU[:1], asic=GPU[1:]))
    state = new.pools["asic"].backends[0]
    assert state is moved and state.in_flight == 3
    assert (state.pool, state.name, state.slots) == ("asic", "asic-0", 16)


def test_waiters_stay_queued_in_a_pool_that_keeps_its_name() -> None:
    async def scenario() -> None:
        old = Fleet(fleet_policy(gpu=GPU[:1], gpu_extra={"slots_per_backend": 1}))
        admission = Admission(old)
        admission.acquire(old.pools["gpu"].backends[0])
        # No busy machine makes this wait run out: only the new version's slot ends it.
        waiting = asyncio.create_task(admission.wait(old.pools["gpu"], timeout_s=60))
        await until(lambda: old.pools["gpu"].waiters, message="the request never queued")
        new = old.reconfigure(fleet_policy(gpu=GPU[:1], gpu_extra={"slots_per_backend": 2}))
        admission.fleet = new
        assert len(new.pools["gpu"].waiters) == 1
        admission.dispatch(new.pools["gpu"])  # the new version gave the pool a second slot
        backend = (await waiting).backend
        assert backend is new.pools["gpu"].backends[0] and backend.in_flight == 2

    asyncio.run(scenario())


def test_new_backends_start_empty() -> None:
    old = Fleet(fleet_policy(gpu=GPU[:1]))
    old.pools["gpu"].backends[0].in_flight = 2
    new = old.reconfigure(fleet_policy(gpu=GPU))
    assert [b.in_flight for b in new.pools["gpu"].backends] == [2, 0]


def test_the_prefix_index_keeps_what_a_pool_declares_its_engines_cache_else_its_kv_memory() -> None:
    declared = Fleet(
        fleet_policy(gpu_extra={"prefix_cache_tokens": 2_506_752}),
        block_tokens=512,
    )
    assert declared.prefixes.capacity("gpu-0") == 4896  # HBM and host memory, 512-token blocks
    # The ASIC declares nothing: what its KV memory (half of 141 GB) holds at 128 KiB a token.
    assert declared.prefixes.capacity("asic-0") == int(70.5e9 / (131_072 * 512)) == 1050
    sram = Fleet(fleet_policy(asic_extra={"prefix_cache_tokens": 8192}), block_tokens=512)
    assert sram.prefixes.capacity("asic-0") == 16


def test_a_prompt_goes_past_a_backend_still_computing_long_prompts_to_one_holding_less() -> None:
    fleet = Fleet(fleet_policy(gpu=["http://127.0.0.1:1", "http://127.0.0.1:2"]))
    pool = fleet.pools["gpu"]
    first, second = pool.backends
    blocks = (1, 2, 3, 4)
    fleet.prefixes.sent(first.name, blocks)  # gpu-0 holds the whole prefix
    chosen = pool.most_free(blocks=blocks, block_tokens=64.0)
    assert chosen is first
    # gpu-0 has 30,000 prompt tokens to compute before anything sent now: holding the prefix
    # spares 256 tokens, waiting behind them costs far more.
    first.prefilling = 30_000
    assert pool.most_free(blocks=blocks, block_tokens=64.0) is second
    # A load the prefix is worth: the cold backend runs 10 requests its 320 tokens would hold up.
    first.prefilling, second.in_flight = 0, 10
    assert pool.most_free(blocks=blocks, block_tokens=64.0) is first
