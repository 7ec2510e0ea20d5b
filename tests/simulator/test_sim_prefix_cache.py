"""The prefix cache: which blocks it keeps, what a hit spares a device's prefill, and what a
client reads of it (`usage.prompt_tokens_details.cached_tokens`, vLLM's counters)."""

from __future__ import annotations

import statistics
import time

import openai
import pytest

from harness.simulators import SimulatorProcess, start_simulator
from simulator.device import Device, Job
from simulator.power import PowerCurve
from simulator.prefix_cache import PrefixCache, prompt_blocks
from simulator.profile import ModelSpec, PowerFigures, PrefixCacheFigures, Timing

CHAT = "llama-3.1-8b-instruct"
BLOCK = 16


# The cache


def test_a_lookup_finds_the_leading_blocks_up_to_the_first_miss() -> None:
    cache = PrefixCache(capacity_tokens=100 * BLOCK, block_tokens=BLOCK)
    cache.insert([1, 2, 3])
    assert cache.lookup([1, 2, 3, 4]) == (3, 0)
    assert cache.lookup([1, 2, 9, 3]) == (2, 0)
    assert cache.lookup([9, 1, 2]) == (0, 0)


def test_the_least_recently_used_blocks_are_evicted_first() -> None:
    cache = PrefixCache(capacity_tokens=4 * BLOCK, block_tokens=BLOCK)
    cache.insert([1, 2])
    cache.insert([3, 4])
    cache.insert([1, 2])  # used again: now [3, 4] is the least recent
    cache.insert([5, 6])
    assert cache.lookup([3, 4]) == (0, 0)
    assert cache.lookup([1, 2]) == (2, 0)
    assert cache.lookup([5, 6]) == (2, 0)


def test_eviction_takes_a_prefix_from_its_tail_so_what_stays_is_still_a_prefix() -> None:
    cache = PrefixCache(capacity_tokens=4 * BLOCK, block_tokens=BLOCK)
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    assert cache.lookup([1, 2, 3]) == (2, 0)
    longer = PrefixCache(capacity_tokens=2 * BLOCK, block_tokens=BLOCK)
    longer.insert([1, 2, 3])  # more than it holds: it keeps the head
    assert longer.lookup([1, 2, 3]) == (2, 0)


def test_evicted_blocks_drop_to_host_memory_until_it_is_full_too() -> None:
    cache = PrefixCache(capacity_tokens=2 * BLOCK, block_tokens=BLOCK, host_tokens=2 * BLOCK)
    cache.insert([1, 2])
    cache.insert([3, 4])
    assert cache.lookup([1, 2]) == (0, 2)
    assert cache.lookup([3, 4]) == (2, 0)
    cache.insert([1, 2])  # loaded back to device memory; [3, 4] drops to host memory
    assert cache.lookup([1, 2]) == (2, 0)
    assert cache.lookup([3, 4]) == (0, 2)
    cache.insert([5, 6])  # [1, 2] drops to host memory, and pushes [3, 4] out of it
    assert cache.lookup([3, 4]) == (0, 0)
    assert cache.lookup([1, 2]) == (0, 2)


def test_a_prefix_may_span_device_and_host_memory() -> None:
    cache = PrefixCache(capacity_tokens=BLOCK, block_tokens=BLOCK, host_tokens=4 * BLOCK)
    cache.insert([2])
    cache.insert([1])
    assert cache.lookup([1, 2, 3]) == (1, 1)


def test_a_cache_of_no_capacity_keeps_nothing() -> None:
    cache = PrefixCache(capacity_tokens=0, block_tokens=BLOCK)
    cache.insert([1, 2])
    assert cache.lookup([1, 2]) == (0, 0)


def test_prompts_share_block_ids_as_far_as_they_share_whole_blocks_of_prefix() -> None:
    common = [f"t{i}" for i in range(40)]
    one = prompt_blocks([*common, "a", *common], BLOCK)
    two = prompt_blocks([*common, "b", *common], BLOCK)
    assert len(one) == len(two) == 81 // BLOCK  # only whole blocks
    assert one[:2] == two[:2]  # tokens 0-31 are the same
    # Block 3 (tokens 32-47) differs at token 40; every block after it names that prefix too,
    # though tokens 48-63 are the same in both.
    assert all(a != b for a, b in zip(one[2:], two[2:], strict=True))


# What a hit spares the device

TIMING = Timing(
    prefill_fixed_ms=10.0,
    prefill_per_token_us=30.0,
    prefill_attention_ns=1.0,
    decode_fixed_ms=6.0,
    decode_per_seq_ms=0.5,
)
POWER = PowerFigures(idle_w=100, batch1_w=200, max_w=500, max_at_batch=32)
MODEL = ModelSpec(name="chat-8b", kind="chat", cost_scale=1.0)


def _device(figures: PrefixCacheFigures) -> Device:
    return Device(0, TIMING, 4, PowerCurve(POWER), prefix_cache=figures)


def _serve(device: Device, prompt: int, blocks: list[int]) -> Job:
    job = Job(MODEL, prompt, 2, blocks=blocks)
    device.submit(job, device.time)
    while (at := device.next_event_at()) is not None:
        device.advance(at)
    return job


def _ttft(job: Job) -> float:
    assert job.first_token_at is not None and job.arrived_at is not None
    return job.first_token_at - job.arrived_at


def test_a_cached_prefix_spares_its_prefill_and_attention_but_not_the_fixed_cost() -> None:
    device = _device(PrefixCacheFigures(capacity_tokens=1000 * BLOCK))
    blocks = list(range(1, 8))  # 112 tokens of blocks; 100 prompt tokens hold 6 whole ones
    first = _serve(device, 100, blocks)
    second = _serve(device, 100, blocks)
    assert (first.cached_tokens, second.cached_tokens) == (0, 96)
    assert _ttft(first) == pytest.approx(0.010 + 100 * 30e-6 + 100**2 * 1e-9)
    # The 4 tokens left are computed, and attend to all 100.
    assert _ttft(second) == pytest.approx(0.010 + 4 * 30e-6 + (100**2 - 96**2) * 1e-9)


def test_a_prompt_cached_whole_still_computes_its_last_block() -> None:
    device = _device(PrefixCacheFigures(capacity_tokens=1000 * BLOCK))
    _serve(device, 96, [1, 2, 3, 4, 5, 6])
    # The last token gives the first output token: vLLM recomputes it, and its block with it.
    assert _serve(device, 96, [1, 2, 3, 4, 5, 6]).cached_tokens == 80


def test_a_hit_in_host_memory_costs_its_transfer_instead_of_its_prefill() -> None:
    figures = PrefixCacheFigures(
        capacity_tokens=BLOCK, host_tokens=100 * BLOCK, host_transfer_per_token_us=2.0
    )
    device = _device(figures)
    _serve(device, 65, [1, 2, 3, 4])  # device memory keeps block 1; 2 to 4 drop to the host's
    again = _serve(device, 65, [1, 2, 3, 4])
    assert again.cached_tokens == 64
    load = 48 * 2e-6
    assert _ttft(again) == pytest.approx(0.010 + 1 * 30e-6 + (65**2 - 64**2) * 1e-9 + load)


def test_without_a_prefix_cache_every_prefill_is_computed_in_full() -> None:
    device = _device(PrefixCacheFigures())
    _serve(device, 100, [1, 2, 3])
    again = _serve(device, 100, [1, 2, 3])
    assert again.cached_tokens == 0
    assert _ttft(again) == pytest.approx(0.010 + 100 * 30e-6 + 100**2 * 1e-9)


# What a client reads

SYSTEM = "You answer questions about routing. " * 300  # about 1,800 tokens


def _chat(client: openai.OpenAI, system: str, question: str) -> openai.types.CompletionUsage:
    reply = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=1,
        temperature=0,
    )
    assert reply.usage is not None
    return reply.usage


def _cached(usage: openai.types.CompletionUsage) -> int:
    assert usage.prompt_tokens_details is not None
    return usage.prompt_tokens_details.cached_tokens or 0


@pytest.fixture(scope="module")
def sim() -> SimulatorProcess:
    with start_simulator("gpu", speed=1000.0, extra_args=["--engine", "vllm"]) as sim:
        yield sim


def _client(sim: SimulatorProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key="unused", max_retries=0)


def test_a_second_request_with_the_same_system_prompt_reads_it_from_the_cache(
    sim: SimulatorProcess,
) -> None:
    system = "Shared. " + SYSTEM
    with _client(sim) as client:
        first = _chat(client, system, "Which slot?")
        second = _chat(client, system, "What pool?")
    assert _cached(first) == 0
    cached = _cached(second)
    # Whole 16-token blocks of the system turn and the question's header, where the two part.
    assert cached % BLOCK == 0
    system_turn = first.prompt_tokens - 3 - (3 + 3)  # less the reply's and the question's turn
    assert system_turn - BLOCK < cached <= system_turn + 3


def test_streamed_answers_and_completions_report_their_cached_tokens(
    sim: SimulatorProcess,
) -> None:
    prompt = "Completion. " + SYSTEM
    with _client(sim) as client:
        client.completions.create(model=CHAT, prompt=prompt + "One?", max_tokens=1)
        answer = client.completions.create(model=CHAT, prompt=prompt + "Two?", max_tokens=1)
        assert answer.usage is not None and _cached(answer.usage) > 1500
        stream = client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]
        stream = client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages += [chunk.usage for chunk in stream if chunk.usage is not None]
    assert [_cached(usage) > 1500 for usage in usages] == [False, True]


def test_vllm_counts_the_prompt_tokens_it_looked_up_and_those_it_found() -> None:
    with start_simulator("gpu", speed=1000.0, extra_args=["--engine", "vllm"]) as sim:
        with _client(sim) as client:
            usages = [_chat(client, SYSTEM, "Counted?") for _ in range(2)]
        labels = {"model_name": CHAT}
        queries = sim.metric("vllm:prefix_cache_queries_total", **labels)
        hits = sim.metric("vllm:prefix_cache_hits_total", **labels)
    assert queries == sum(usage.prompt_tokens for usage in usages)
    assert hits == _cached(usages[1]) > 0


def test_a_prefix_evicted_for_another_is_cached_only_as_far_as_what_stayed() -> None:
    one, other = "A. " + SYSTEM[:7200], "B. " + SYSTEM[:5400]  # about 100 and 75 blocks
    flags = ["--prefix-cache-tokens", str(128 * BLOCK), "--host-cache-tokens", "0"]
    with start_simulator("gpu", speed=1000.0, extra_args=flags) as sim, _client(sim) as client:
        whole = [_cached(_chat(client, one, "Same?")) for _ in range(2)][1]
        others = [_cached(_chat(client, other, "Same?")) for _ in range(2)][1]
        after = _cached(_chat(client, one, "Same?"))
    # The cache holds 128 blocks: the other prompt's took them from this one's tail, and this
    # one keeps the rest.
    assert after == 128 * BLOCK - others
    assert 0 < after < whole


def test_host_memory_keeps_what_device_memory_evicts() -> None:
    cached = {}
    for host in (0, 100_000):
        flags = ["--prefix-cache-tokens", "1024", "--host-cache-tokens", str(host)]
        with start_simulator("gpu", speed=1000.0, extra_args=flags) as sim, _client(sim) as client:
            _chat(client, SYSTEM, "One?")
            cached[host] = _cached(_chat(client, SYSTEM, "Two?"))
    # Device memory keeps 1,024 tokens of the prompt; host memory the rest.
    assert cached[0] == 1024
    assert cached[100_000] > 1700


def test_no_prefix_cache_reports_no_cached_tokens() -> None:
    with start_simulator(
        "gpu", speed=1000.0, extra_args=["--no-prefix-cache", "--engine", "vllm"]
    ) as sim:
        with _client(sim) as client:
            usages = [_chat(client, SYSTEM, "Again?") for _ in range(2)]
        hits = sim.metric("vllm:prefix_cache_hits_total", model_name=CHAT)
    assert [_cached(usage) for usage in usages] == [0, 0]
    assert hits == 0


def test_a_cached_prompt_answers_its_first_token_sooner() -> None:
    # At speed 2 the 6,000-token prompt's prefill is ~115 ms of wall time, cached ~6 ms, beside
    # the ~10 ms of HTTP and tokenizing both pay; ask for a third, of medians of three.
    long = "Timed. " * 3000
    with start_simulator("gpu", speed=2.0) as sim, _client(sim) as client:

        def seconds(system: str) -> float:
            start = time.perf_counter()
            _chat(client, system, "Quick?")
            return time.perf_counter() - start

        uncached = [seconds(f"{i} {long}") for i in range(3)]
        cached = [seconds(f"0 {long}") for _ in range(3)]
    assert statistics.median(cached) < statistics.median(uncached) / 3
