"""The simulator's KV-cache events, read as a consumer of vLLM's would read them.

The structs below are vLLM's field layout (`vllm/distributed/kv_events.py` at commit 0181ea3:
`EventBatch`, and the tagged `BlockStored`, `BlockRemoved`, `AllBlocksCleared`), decoded with
msgspec as vLLM encodes them: a batch the simulator publishes must decode into them whole.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import openai
import pytest
import zmq

from harness.gateways import free_port
from harness.simulators import SimulatorProcess, start_simulator
from simulator.prefix_cache import BlockStored as CacheBlockStored
from simulator.prefix_cache import PrefixCache
from simulator.schema import completion_tokens, prompt_ids

CHAT = "llama-3.1-8b-instruct"


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]  # type: ignore[assignment]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


@pytest.fixture
def publishing():
    pub, replay = free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
    }
    flags = ["--kv-events-config", json.dumps(config)]
    with start_simulator("gpu", speed=200, extra_args=flags) as sim:
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(config["endpoint"])
        dealer = context.socket(zmq.DEALER)
        dealer.connect(config["replay_endpoint"])
        yield sim, sub, dealer
        sub.close(linger=0)
        dealer.close(linger=0)
        context.term()


def _receive(sub: zmq.Socket) -> tuple[int, KVEventBatch]:
    assert sub.poll(60_000), "no event batch within 60 s"
    topic, seq, payload = sub.recv_multipart()
    assert topic == b""
    return int.from_bytes(seq, "big"), DECODER.decode(payload)


def _answer(sim: SimulatorProcess, prompt: str) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="none")
    client.completions.create(model=CHAT, prompt=prompt, max_tokens=2)


def _until_subscribed(sim: SimulatorProcess, sub: zmq.Socket) -> tuple[int, KVEventBatch]:
    """Send distinct prompts until the subscription hears one (ZeroMQ drops what a PUB socket
    sends before a subscriber's connection is up), and return the first batch heard."""
    for attempt in range(50):
        _answer(sim, f"warming the subscription up, attempt {attempt}, " + "pad " * 40)
        if sub.poll(200):
            return _receive(sub)
    raise AssertionError("the subscription never heard a batch")


def _heard(sub: zmq.Socket, wanted: Any) -> tuple[int, KVEventBatch]:
    """Receive batches until one `wanted(batch)` holds (earlier prompts' may still come)."""
    while True:
        seq, batch = _receive(sub)
        if wanted(batch):
            return seq, batch


def _storing(prompt: str) -> Any:
    """Return a test of whether a batch stores the prompt's first block."""
    first = list(prompt_ids(completion_tokens(prompt))[:16])

    def wanted(batch: KVEventBatch) -> bool:
        return any(isinstance(e, BlockStored) and e.token_ids[:16] == first for e in batch.events)

    return wanted


def test_a_prefill_publishes_its_blocks_with_their_tokens_in_vllms_layout(publishing):
    sim, sub, _ = publishing
    _until_subscribed(sim, sub)
    prompt = "The tide came in over the flats while the gulls circled. " * 20
    _answer(sim, prompt)
    _, batch = _heard(sub, _storing(prompt))
    assert batch.data_parallel_rank == 0 and batch.ts > 0
    (stored,) = batch.events
    assert isinstance(stored, BlockStored)
    assert stored.medium == "GPU" and stored.block_size == 16 and stored.lora_id is None
    ids = prompt_ids(completion_tokens(prompt))
    whole = (len(ids) - 1) // 16  # the blocks before the prompt's last token
    assert stored.parent_block_hash is None
    assert len(stored.block_hashes) == whole
    assert stored.token_ids == list(ids[: whole * 16])


def test_sequence_numbers_count_up_and_lost_batches_come_back_by_replay(publishing):
    sim, sub, dealer = publishing
    _until_subscribed(sim, sub)
    prompts = [f"prompt number {i} about the lighthouse keeper " + "word " * 40 for i in range(4)]
    _answer(sim, prompts[0])
    first, _ = _heard(sub, _storing(prompts[0]))
    sim.lose_kv_events(2)
    for prompt in prompts[1:]:
        _answer(sim, prompt)
    seq, heard = _receive(sub)  # the two before it never reached the subscriber
    assert seq == first + 3
    dealer.send_multipart((b"", (first + 1).to_bytes(8, "big")))
    replayed = []
    while True:
        assert dealer.poll(60_000)
        _, number, payload = dealer.recv_multipart()
        if number == (-1).to_bytes(8, "big", signed=True):
            break
        replayed.append((int.from_bytes(number, "big"), DECODER.decode(payload)))
    assert [n for n, _ in replayed] == [first + 1, first + 2, first + 3]
    assert all(_storing(p)(b) for p, (_, b) in zip(prompts[1:], replayed, strict=True))
    assert replayed[-1][1] == heard


def test_resetting_the_prefix_cache_publishes_all_blocks_cleared(publishing):
    sim, sub, _ = publishing
    _until_subscribed(sim, sub)
    sim.reset_prefix_cache()
    _heard(sub, lambda batch: batch.events == [AllBlocksCleared()])


def test_evictions_publish_removals_and_the_host_copies_they_leave():
    cache = PrefixCache(capacity_tokens=2 * 16, block_tokens=16, host_tokens=16)
    heard: list[list[Any]] = []
    cache.events = heard.append
    cache.insert([1, 2], token_ids=list(range(32)))
    cache.insert([7], token_ids=list(range(100, 116)))
    # Block 2 (the first prompt's tail) leaves device memory for the host's.
    assert heard[1][0] == CacheBlockStored((7,), None, tuple(range(100, 116)), 16, "GPU")
    removed, offloaded = heard[1][1:]
    assert removed.block_hashes == (2,) and removed.medium == "GPU"
    assert offloaded == CacheBlockStored((2,), 1, tuple(range(16, 32)), 16, "CPU")
