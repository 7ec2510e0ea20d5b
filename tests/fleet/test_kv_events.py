"""Following an engine's KV-cache events: the simulator publishes on vLLM's wire, the gateway's
subscriber keeps the exact index, through lost batches, a restart and silence."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import msgpack
import pytest
from waiting import until

from gateway.fleet.engine_blocks import Cleared, Removed, Stored
from gateway.fleet.kv_events import KvEventSubscriber, MalformedBatch, decode
from gateway.fleet.prefixes import PrefixIndex
from gateway.routing.tokens import token_blocks
from harness.gateways import free_port
from harness.simulators import SimulatorProcess, start_simulator
from simulator.schema import EngineTokenizer

CHAT = "llama-3.1-8b-instruct"
BACKEND = "gpu-0"


@contextmanager
def _publishing(pub: int, replay: int | None) -> Iterator[SimulatorProcess]:
    config = {"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{pub}"}
    if replay is not None:
        config["replay_endpoint"] = f"tcp://127.0.0.1:{replay}"
    flags = ["--kv-events-config", json.dumps(config)]
    with start_simulator("gpu", speed=200, extra_args=flags) as sim:
        yield sim


def _prompt(topic: str) -> str:
    return f"A long note on {topic}: " + " ".join(f"{topic}{i}" for i in range(300))


def _keys(prompt: str) -> tuple[int, ...]:
    """The keys of what an engine caches of a prompt: its whole blocks before its last token."""
    ids = EngineTokenizer().prompt_ids("completions", {"prompt": prompt})
    assert ids is not None
    cacheable = (len(ids) - 1) // 16 * 16
    return token_blocks(ids[:cacheable])


async def _answer(sim: SimulatorProcess, prompt: str) -> None:
    async with httpx.AsyncClient(base_url=sim.url, timeout=30) as client:
        body = {"model": CHAT, "prompt": prompt, "max_tokens": 2}
        (await client.post("/v1/completions", json=body)).raise_for_status()


def _run(scenario) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(asyncio.wait_for(scenario(), 120))


async def _following(index: PrefixIndex, pub: int, replay: int | None) -> KvEventSubscriber:
    subscriber = KvEventSubscriber(index)
    endpoint = f"tcp://127.0.0.1:{pub}"
    subscriber.configure({BACKEND: (endpoint, f"tcp://127.0.0.1:{replay}" if replay else None)})
    return subscriber


async def _until_live(index: PrefixIndex, sim: SimulatorProcess) -> None:
    """Send prompts until the subscription has heard one (and so serves)."""
    for attempt in range(100):
        await _answer(sim, _prompt(f"warmup{attempt}"))
        try:
            await until(lambda: index.exact(BACKEND), timeout=0.3)
            return
        except AssertionError:
            continue
    raise AssertionError("the subscription never heard a batch")


def test_the_index_holds_what_the_engine_cached_and_the_estimate_never_saw() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        index.configure({BACKEND: 1000})
        with _publishing(pub, replay) as sim:
            subscriber = await _following(index, pub, replay)
            try:
                await _until_live(index, sim)
                keys = _keys(_prompt("tides"))
                assert index.cached(BACKEND, keys) == 0
                # Another client's request: the gateway sent nothing, the engine says it all.
                await _answer(sim, _prompt("tides"))
                await until(lambda: index.cached(BACKEND, keys) == len(keys))
                assert index.held(BACKEND) == 0  # the estimate knows nothing of it
                sim.reset_prefix_cache()
                await until(lambda: index.cached(BACKEND, keys) == 0, message="cleared")
                assert index.exact(BACKEND)
            finally:
                await subscriber.close()

    _run(scenario)


def test_lost_batches_are_recovered_from_the_replay_socket() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        with _publishing(pub, replay) as sim:
            subscriber = await _following(index, pub, replay)
            try:
                await _until_live(index, sim)
                sim.lose_kv_events(2)
                topics = ["harbour", "orchard", "glacier"]
                for topic in topics:
                    await _answer(sim, _prompt(topic))
                for topic in topics:
                    keys = _keys(_prompt(topic))
                    await until(lambda keys=keys: index.cached(BACKEND, keys) == len(keys))
                assert index.engines[BACKEND].trusted
            finally:
                await subscriber.close()

    _run(scenario)


def test_a_gap_no_replay_can_fill_hands_the_backend_to_the_estimate_until_a_clear() -> None:
    pub = free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        index.configure({BACKEND: 1000})
        with _publishing(pub, None) as sim:
            subscriber = await _following(index, pub, None)
            try:
                await _until_live(index, sim)
                sim.lose_kv_events(1)
                await _answer(sim, _prompt("lost"))
                await _answer(sim, _prompt("heard"))
                await until(lambda: not index.exact(BACKEND), message="the index distrusted")
                estimated = _keys(_prompt("estimated"))
                index.sent(BACKEND, estimated)
                assert index.cached(BACKEND, estimated) == len(estimated)  # the estimate's word
                sim.reset_prefix_cache()
                await until(lambda: index.exact(BACKEND), message="trusted after a clear")
                assert index.cached(BACKEND, estimated) == 0  # the engine's word again
            finally:
                await subscriber.close()

    _run(scenario)


def test_what_an_engine_published_before_the_subscription_is_known_at_once() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        with _publishing(pub, replay) as sim:
            await _answer(sim, _prompt("early"))  # published to no one
            subscriber = await _following(index, pub, replay)
            try:
                keys = _keys(_prompt("early"))
                await until(
                    lambda: index.cached(BACKEND, keys) == len(keys), message="the replayed blocks"
                )
                assert index.exact(BACKEND)
            finally:
                await subscriber.close()

    _run(scenario)


def test_a_restarted_engine_is_followed_from_its_new_start() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        subscriber = await _following(index, pub, replay)
        try:
            before = _keys(_prompt("before"))
            with _publishing(pub, replay) as sim:
                await _until_live(index, sim)
                await _answer(sim, _prompt("before"))
                await until(lambda: index.cached(BACKEND, before) == len(before))
            after = _keys(_prompt("after"))
            with _publishing(pub, replay) as sim:  # the same endpoints: a new engine
                # Its empty cache is known as soon as the subscription reaches it, before it
                # publishes a word.
                await until(lambda: index.cached(BACKEND, before) == 0, message="the old blocks")
                await _answer(sim, _prompt("after"))
                await until(
                    lambda: index.cached(BACKEND, after) == len(after),
                    message="the new engine's blocks",
                )
        finally:
            await subscriber.close()

    _run(scenario)


def test_events_that_stop_hand_the_backend_to_the_estimate() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        index.configure({BACKEND: 1000})
        with _publishing(pub, replay) as sim:
            subscriber = await _following(index, pub, replay)
            try:
                await _until_live(index, sim)
                assert subscriber.check() == []  # quiet, but nothing was expected of it
                sim.lose_kv_events(1000)  # from now on nothing reaches the subscriber
                keys = _keys(_prompt("silence"))
                index.sent(BACKEND, keys)  # the gateway sent it a prompt to store
                await _answer(sim, _prompt("silence"))
                # Stale once two checks in a row hear nothing (a batch already on its way may
                # still land between the first two).
                await until(lambda: subscriber.check() == [BACKEND], message="never stale")
                assert not index.exact(BACKEND)
                assert index.cached(BACKEND, keys) == len(keys)  # the estimate serves
            finally:
                await subscriber.close()

    _run(scenario)


def test_both_of_vllms_encodings_decode_and_anything_else_is_refused() -> None:
    as_map = msgpack.packb(
        {
            "ts": 1.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [b"\x01" * 32],
                    "parent_block_hash": None,
                    "token_ids": list(range(16)),
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                },
                {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
        }
    )
    as_arrays = msgpack.packb(
        [
            1.0,
            [
                ["BlockStored", [7], None, list(range(16)), 16, None, "GPU"],
                ["BlockRemoved", [7], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ]
    )
    stored, removed, cleared = decode(as_map)
    assert stored == Stored([b"\x01" * 32], None, list(range(16)), 16, "GPU")
    assert removed == Removed([b"\x01" * 32], "GPU") and cleared == Cleared()
    assert decode(as_arrays) == [
        Stored([7], None, list(range(16)), 16, "GPU"),
        Removed([7], "GPU"),
        Cleared(),
    ]
    for bad in (b"\xc1", msgpack.packb(3), msgpack.packb({"events": [{"type": "Other"}]})):
        with pytest.raises(MalformedBatch):
            decode(bad)


def test_a_new_engine_whose_first_batches_were_missed_is_not_taken_for_the_old_one() -> None:
    pub, replay = free_port(), free_port()

    async def scenario() -> None:
        index = PrefixIndex()
        subscriber = await _following(index, pub, replay)
        try:
            old = _keys(_prompt("old"))
            with _publishing(pub, replay) as sim:
                await _until_live(index, sim)
                await _answer(sim, _prompt("old"))
                await until(lambda: index.cached(BACKEND, old) == len(old))
            heard = subscriber._feeds[BACKEND].expected or 0
            with _publishing(pub, replay) as sim:
                # The new engine's numbers run past the old one's before a batch is heard.
                sim.lose_kv_events(heard + 2)
                topics = [f"new{i}" for i in range(heard + 3)]
                for topic in topics:
                    await _answer(sim, _prompt(topic))
                first = _keys(_prompt(topics[0]))
                await until(
                    lambda: index.cached(BACKEND, first) == len(first),
                    message="the new engine's first blocks, from its replay buffer",
                )
                assert index.cached(BACKEND, old) == 0
                assert index.exact(BACKEND)
        finally:
            await subscriber.close()

    _run(scenario)
