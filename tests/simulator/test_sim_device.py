"""The device engine on simulated time: prefill, lockstep decode, slots, queue, energy.

The engine reads no clock, so these tests drive it to chosen simulated instants and check
its event times exactly; no wall-clock timing is involved.
"""

import math

import pytest

from simulator.device import Device, Job, JobState
from simulator.power import PowerCurve
from simulator.profile import ModelSpec, PowerFigures, PrefixCacheFigures, Timing

TIMING = Timing(
    prefill_fixed_ms=10.0,
    prefill_per_token_us=30.0,
    host_transfer_per_token_us=0.0,
    decode_fixed_ms=6.0,
    decode_per_seq_ms=0.5,
)
POWER = PowerFigures(idle_w=100, batch1_w=200, max_w=500, max_at_batch=32)
CHAT = ModelSpec(name="chat-8b", kind="chat", cost_scale=1.0)
BIG = ModelSpec(name="chat-70b", kind="chat", cost_scale=8.75)
EMBED = ModelSpec(name="embed", kind="embedding", cost_scale=0.05, dimensions=8)


def _device(slots: int = 4, timing: Timing = TIMING) -> Device:
    return Device(0, timing, slots, PowerCurve(POWER))


def _run(device: Device) -> None:
    while (at := device.next_event_at()) is not None:
        device.advance(at)


def _ttft(job: Job) -> float:
    return job.first_token_at - job.arrived_at


def _decode_time_per_token(job: Job) -> float:
    return (job.finished_at - job.first_token_at) / (job.output_tokens - 1)


def test_time_to_first_token_is_the_prefill_of_the_prompt():
    device = _device()
    job = Job(CHAT, prompt_tokens=1000, output_tokens=5)
    device.submit(job, 0.0)
    _run(device)
    assert _ttft(job) == pytest.approx(0.010 + 1000 * 30e-6)


def test_time_to_first_token_grows_with_prompt_length():
    ttfts = []
    for prompt in (10, 1000, 10_000):
        device = _device()
        job = Job(CHAT, prompt, 2)
        device.submit(job, 0.0)
        _run(device)
        ttfts.append(_ttft(job))
    assert ttfts == sorted(ttfts)
    assert ttfts[2] > 10 * ttfts[0]


def test_host_transfer_adds_a_cost_per_context_token():
    plain, transfer = (
        _device(),
        _device(timing=TIMING.model_copy(update={"host_transfer_per_token_us": 20.0})),
    )
    jobs = [Job(CHAT, 2000, 2), Job(CHAT, 2000, 2)]
    for device, job in zip((plain, transfer), jobs, strict=True):
        device.submit(job, 0.0)
        _run(device)
    assert _ttft(jobs[1]) - _ttft(jobs[0]) == pytest.approx(2000 * 20e-6)


def test_one_sequence_decodes_at_the_fixed_step_cost():
    device = _device()
    job = Job(CHAT, 10, 101)
    device.submit(job, 0.0)
    _run(device)
    assert _decode_time_per_token(job) == pytest.approx(0.006)


def test_decode_slows_as_more_sequences_decode_together():
    alone, crowd = _device(slots=8), _device(slots=8)
    single = Job(CHAT, 10, 101)
    alone.submit(single, 0.0)
    _run(alone)
    together = [Job(CHAT, 10, 101) for _ in range(8)]
    for job in together:
        crowd.submit(job, 0.0)
    _run(crowd)
    assert _decode_time_per_token(together[0]) == pytest.approx(0.006 + 7 * 0.0005, rel=0.02)
    assert _decode_time_per_token(together[0]) > 1.5 * _decode_time_per_token(single)


def test_a_bigger_model_decodes_slower_by_its_cost_scale():
    small, big = _device(), _device()
    jobs = [Job(CHAT, 100, 51), Job(BIG, 100, 51)]
    for device, job in zip((small, big), jobs, strict=True):
        device.submit(job, 0.0)
        _run(device)
    ratio = _decode_time_per_token(jobs[1]) / _decode_time_per_token(jobs[0])
    assert ratio == pytest.approx(8.75)


def test_requests_beyond_slots_wait_and_start_in_arrival_order():
    device = _device(slots=2)
    jobs = [Job(CHAT, 10, 20) for _ in range(5)]
    for index, job in enumerate(jobs):
        device.submit(job, index * 1e-6)
    assert (device.active, device.queued) == (2, 3)
    _run(device)
    admitted = [job.admitted_at for job in jobs]
    assert admitted == sorted(admitted)
    # A waiting request starts exactly when a running one hands back its slot.
    finishes = sorted(job.finished_at for job in jobs)
    assert jobs[2].admitted_at == pytest.approx(finishes[0])


def test_a_request_holds_its_slot_until_its_last_token():
    device = _device(slots=1)
    first, second = Job(CHAT, 10, 30), Job(CHAT, 10, 30)
    device.submit(first, 0.0)
    device.submit(second, 0.0)
    _run(device)
    assert second.admitted_at == pytest.approx(first.finished_at)
    assert first.tokens_emitted == 30


def test_tokens_appear_one_per_step_while_decoding():
    device = _device()
    job = Job(CHAT, 10, 50)
    device.submit(job, 0.0)
    device.advance(job_first := 0.010 + 10 * 30e-6)
    assert job.tokens_emitted == 1
    device.advance(job_first + 10 * 0.006 + 1e-9)
    assert job.tokens_emitted == 11
    assert job.state is JobState.DECODE


def test_cancelling_a_running_request_frees_its_slot_for_the_queue():
    device = _device(slots=1)
    running, waiting = Job(CHAT, 10, 1000), Job(CHAT, 10, 5)
    device.submit(running, 0.0)
    device.submit(waiting, 0.0)
    device.cancel(running, 0.5)
    assert running.state is JobState.CANCELLED
    assert waiting.admitted_at == pytest.approx(0.5)
    _run(device)
    assert waiting.state is JobState.DONE


def test_an_embedding_needs_one_cheap_pass_and_no_decode():
    device = _device()
    job = Job(EMBED, 100, 0)
    device.submit(job, 0.0)
    _run(device)
    assert job.state is JobState.DONE
    assert job.finished_at == pytest.approx(0.05 * (0.010 + 100 * 30e-6))


def test_slow_factor_multiplies_every_duration():
    normal, slow = _device(), _device()
    slow.slow_factor = 3.0
    jobs = [Job(CHAT, 500, 40), Job(CHAT, 500, 40)]
    for device, job in zip((normal, slow), jobs, strict=True):
        device.submit(job, 0.0)
        _run(device)
    assert jobs[1].finished_at == pytest.approx(3.0 * jobs[0].finished_at)


def test_energy_integrates_idle_power_while_nothing_runs():
    device = _device()
    device.advance(10.0)
    assert device.energy_j == pytest.approx(100 * 10.0)


def test_energy_grows_faster_under_load_but_less_per_sequence():
    idle, light, busy = _device(slots=32), _device(slots=32), _device(slots=32)
    light.submit(Job(CHAT, 10, 100_000), 0.0)
    for _ in range(16):
        busy.submit(Job(CHAT, 10, 100_000), 0.0)
    for device in (idle, light, busy):
        device.advance(5.0)
    assert idle.energy_j < light.energy_j < busy.energy_j
    dynamic_light = light.energy_j - idle.energy_j
    dynamic_busy = busy.energy_j - idle.energy_j
    assert dynamic_busy < 16 * dynamic_light


def test_advancing_in_coarse_or_fine_steps_gives_the_same_timeline():
    coarse, fine = _device(slots=2), _device(slots=2)
    coarse_jobs = [Job(CHAT, 100 * i, 20 + i) for i in range(1, 5)]
    fine_jobs = [Job(CHAT, 100 * i, 20 + i) for i in range(1, 5)]
    for device, jobs in ((coarse, coarse_jobs), (fine, fine_jobs)):
        for job in jobs:
            device.submit(job, 0.0)
    coarse.advance(10.0)
    for tick in range(1, 10_001):
        fine.advance(tick * 0.001)
    for a, b in zip(coarse_jobs, fine_jobs, strict=True):
        assert a.finished_at == pytest.approx(b.finished_at)
    assert math.isclose(coarse.energy_j, fine.energy_j, rel_tol=1e-9)


def test_other_clients_requests_take_slots_and_later_arrivals_wait_behind_them():
    device = _device(slots=4)
    device.set_external(3, kv_tokens=100, now=0.0)
    first, second = Job(CHAT, 10, 5), Job(CHAT, 10, 5)
    device.submit(first, 0.0)
    device.submit(second, 0.0)
    assert (device.active, device.queued) == (4, 1)
    assert (first.state, second.state) == (JobState.PREFILL, JobState.QUEUED)
    device.set_external(5, kv_tokens=100, now=0.001)  # more clients: they wait ahead
    _run(device)
    assert first.state is JobState.DONE and second.state is JobState.QUEUED
    assert (device.external_running, device.external_waiting) == (4, 1)
    device.set_external(0, kv_tokens=100, now=1.0)
    _run(device)
    assert second.state is JobState.DONE and second.admitted_at == 1.0


def test_other_clients_requests_decode_in_the_batch_and_draw_power():
    alone, shared = _device(slots=8), _device(slots=8)
    shared.set_external(4, kv_tokens=0, now=0.0)
    jobs = []
    for device in (alone, shared):
        job = Job(CHAT, 10, 11)
        device.submit(job, 0.0)
        _run(device)
        jobs.append(job)
    assert _decode_time_per_token(jobs[0]) == pytest.approx(0.006)
    assert _decode_time_per_token(jobs[1]) == pytest.approx(0.006 + 4 * 0.0005)
    assert shared.power_w > alone.power_w  # both idle of their own: 4 others still run


def test_kv_usage_is_what_running_requests_reserve():
    device = Device(0, TIMING, 4, PowerCurve(POWER), kv_cache_tokens=1000)
    device.set_external(1, kv_tokens=300, now=0.0)
    job = Job(CHAT, prompt_tokens=400, output_tokens=100)
    device.submit(job, 0.0)
    assert device.kv_usage == pytest.approx(0.8)
    _run(device)
    assert device.kv_usage == pytest.approx(0.3)
    device.set_external(4, kv_tokens=300, now=1.0)
    assert device.kv_usage == 1.0  # reserved past its size: full, not more


def test_attention_makes_a_long_prompts_prefill_grow_with_its_square():
    timing = TIMING.model_copy(update={"prefill_attention_ns": 2.0})
    ttfts = {}
    for prompt in (1000, 4000):
        device = _device(timing=timing)
        job = Job(CHAT, prompt, 2)
        device.submit(job, 0.0)
        _run(device)
        ttfts[prompt] = _ttft(job)
    assert ttfts[1000] == pytest.approx(0.010 + 1000 * 30e-6 + 1000**2 * 2e-9)
    assert ttfts[4000] == pytest.approx(0.010 + 4000 * 30e-6 + 4000**2 * 2e-9)


def test_each_step_reads_the_kv_cache_past_what_on_chip_memory_holds():
    # 1,000 tokens fit on chip; each beyond costs 100 ns a step. A 1,500-token prompt's step k
    # reads its prompt and the k tokens so far: 500 + k past the chip.
    timing = TIMING.model_copy(update={"kv_read_ns": 100.0, "kv_fast_tokens": 1000})
    device = _device(timing=timing)
    job = Job(CHAT, 1500, 11)
    device.submit(job, 0.0)
    _run(device)
    decode = sum(0.006 + 100e-9 * (500 + k) for k in range(1, 11))
    assert job.finished_at - job.first_token_at == pytest.approx(decode)
    assert device.context_tokens() == 0
    # Within the chip, no reading cost at all; other clients' contexts count like ours.
    for external, expected in ((0, 0.006), (1, 0.006 + 0.0005 + 100e-9 * (801 + 1200 - 1000))):
        small = _device(timing=timing)
        small.set_external(external, kv_tokens=1200, now=0.0)
        job = Job(CHAT, 800, 2)
        small.submit(job, 0.0)
        _run(small)
        assert job.finished_at - job.first_token_at == pytest.approx(expected)


def test_other_clients_get_only_the_slots_ours_left_and_wait_for_the_rest():
    device = _device(slots=4)
    for _ in range(3):
        device.submit(Job(CHAT, 10, 1000), 0.0)
    device.set_external(3, kv_tokens=100, now=0.0)
    assert (device.external_running, device.external_waiting, device.active) == (1, 2, 4)
    late = Job(CHAT, 10, 5)
    device.submit(late, 0.001)
    assert late.state is JobState.QUEUED  # the other clients waited first


def test_a_parked_device_draws_its_parked_power_and_serves_again_after_its_wake_up():
    from simulator.profile import ParkingFigures

    device = Device(0, TIMING, 4, PowerCurve(POWER), parking=ParkingFigures(parked_w=40, wake_s=2))
    device.advance(10.0)
    device.park(10.0)
    with pytest.raises(RuntimeError, match="parked"):
        device.submit(Job(CHAT, prompt_tokens=10, output_tokens=2), 11.0)
    device.advance(110.0)
    # 10 s idle, then 100 s parked, counted as its idle draw too: nothing ran above it.
    assert device.energy_j == pytest.approx(100 * 10 + 40 * 100)
    assert device.idle_energy_j == pytest.approx(device.energy_j)
    ready = device.wake(110.0)
    assert ready == 112.0
    with pytest.raises(RuntimeError, match="waking"):
        device.submit(Job(CHAT, prompt_tokens=10, output_tokens=2), 111.0)
    device.advance(112.0)
    assert device.energy_j == pytest.approx(100 * 10 + 40 * 100 + 100 * 2)  # idle while waking
    job = Job(CHAT, prompt_tokens=10, output_tokens=2)
    device.submit(job, 112.0)
    _run(device)
    assert job.finished_at is not None


def test_a_released_device_draws_nothing_and_serves_again_after_its_cold_start():
    from simulator.profile import ParkingFigures

    figures = ParkingFigures(parked_w=40, wake_s=2, released_wake_s=180)
    device = Device(0, TIMING, 4, PowerCurve(POWER), parking=figures)
    device.advance(10.0)
    device.park(10.0, release=True)
    device.advance(110.0)
    assert device.energy_j == pytest.approx(100 * 10)  # nothing drawn while released
    assert device.power_w == 0
    ready = device.wake(110.0)
    assert ready == 290.0
    with pytest.raises(RuntimeError, match="waking"):
        device.submit(Job(CHAT, prompt_tokens=10, output_tokens=2), 289.0)
    device.advance(290.0)
    assert device.energy_j == pytest.approx(100 * 10 + 100 * 180)  # idle while it starts
    # Put to sleep the next time, it draws its parked power and wakes in its sleep's time.
    device.park(290.0)
    device.advance(300.0)
    assert device.energy_j == pytest.approx(100 * 10 + 100 * 180 + 40 * 10)
    assert device.wake(300.0) == 302.0


def test_a_device_whose_profile_gives_no_cold_start_cannot_be_released():
    device = _device()
    with pytest.raises(RuntimeError, match="released_wake_s"):
        device.park(0.0, release=True)
    assert not device.parked


def test_a_device_with_requests_cannot_be_parked():
    device = _device()
    device.submit(Job(CHAT, prompt_tokens=10, output_tokens=50), 0.0)
    with pytest.raises(RuntimeError, match="once its requests are done"):
        device.park(0.001)


def test_a_parked_device_forgets_its_prefix_cache():
    from simulator.profile import PrefixCacheFigures

    device = Device(
        0, TIMING, 4, PowerCurve(POWER), prefix_cache=PrefixCacheFigures(capacity_tokens=64)
    )
    device.prefix_cache.insert([1, 2])
    assert device.prefix_cache.lookup([1, 2]) == (2, 0)
    device.park(0.0)
    assert device.prefix_cache.lookup([1, 2]) == (0, 0)


# Chunked prefill: a step's token budget shared by decodes and prompt chunks, as vLLM schedules


def _budget(tokens: int) -> Timing:
    return TIMING.model_copy(update={"max_batched_tokens": tokens})


def test_a_prompt_longer_than_the_budget_takes_a_step_per_chunk():
    device = _device(timing=_budget(1000))
    job = Job(CHAT, prompt_tokens=3500, output_tokens=2)
    device.submit(job, 0.0)
    _run(device)
    # Four chunks (1000, 1000, 1000, 500): each step pays the fixed cost once.
    assert _ttft(job) == pytest.approx(4 * 0.010 + 3500 * 30e-6)


def test_a_prefill_slows_the_steps_of_the_sequences_decoding_beside_it():
    device = _device(timing=_budget(1000))
    decoding = Job(CHAT, prompt_tokens=10, output_tokens=200)
    device.submit(decoding, 0.0)
    _run_until_decoding(device, decoding)
    before = device.next_event_at()
    prompt = Job(CHAT, prompt_tokens=1998, output_tokens=2)
    device.submit(prompt, device.time)
    device.advance(before)
    # The one decode takes a token of each step's budget: two chunks of 999 ride beside it.
    first = device.next_event_at() - device.time
    assert first == pytest.approx(0.010 + 999 * 30e-6)
    device.advance(device.next_event_at())
    assert prompt.first_token_at is None
    device.advance(device.next_event_at())
    assert prompt.first_token_at == pytest.approx(device.time)
    # Decodes first: the decoding sequence got a token in every step.
    assert decoding.tokens_emitted == 1 + 3


def test_a_smaller_budget_smooths_decoding_and_delays_the_long_prompt():
    """vLLM's documented trade-off: a smaller `max_num_batched_tokens` gives a better
    inter-token latency and a worse time to first token for long prompts."""
    worst_step, long_ttft = {}, {}
    for budget in (512, 4096):
        device = _device(slots=8, timing=_budget(budget))
        decoding = [Job(CHAT, 100, 400) for _ in range(4)]
        for job in decoding:
            device.submit(job, 0.0)
        _run_until_decoding(device, decoding[-1])
        long = Job(CHAT, prompt_tokens=8000, output_tokens=2)
        device.submit(long, device.time)
        steps = []
        while (at := device.next_event_at()) is not None and long.first_token_at is None:
            steps.append(at - device.time)
            device.advance(at)
        worst_step[budget], long_ttft[budget] = max(steps), _ttft(long)
    assert worst_step[512] < worst_step[4096] / 4
    assert long_ttft[512] > long_ttft[4096]


def test_a_cached_prefix_shortens_the_wait_of_the_prompt_admitted_after_it():
    figures = PrefixCacheFigures(block_tokens=16, capacity_tokens=100_000)
    waits = {}
    for cached in (False, True):
        device = Device(0, _budget(2048), 4, PowerCurve(POWER), prefix_cache=figures)
        shared = list(range(1, 376))  # 6,000 tokens in 375 blocks
        if cached:
            warm = Job(CHAT, 6000, 1, blocks=shared)
            device.submit(warm, 0.0)
            _run(device)
        start = device.time
        first = Job(CHAT, 6000, 2, blocks=shared)
        other = Job(CHAT, 2000, 2, blocks=list(range(1000, 1125)))
        device.submit(first, start)
        device.submit(other, start)
        _run(device)
        waits[cached] = _ttft(other)
    # The other prompt waits behind the first's chunks: less when the first is cached.
    assert waits[True] < waits[False] / 3


def test_the_predicted_wait_for_a_first_token_counts_the_prompts_ahead():
    device = _device(timing=_budget(2048))
    ahead = Job(CHAT, prompt_tokens=5000, output_tokens=2)
    device.submit(ahead, 0.0)
    alone, _ = _device(timing=_budget(2048)).prefill(CHAT, 1000)
    predicted, cached = device.prefill(CHAT, 1000)
    behind = Job(CHAT, prompt_tokens=1000, output_tokens=2)
    device.submit(behind, 0.0)
    _run(device)
    assert cached == 0
    assert predicted > alone + 5000 * 30e-6
    assert predicted == pytest.approx(_ttft(behind), rel=0.05)


def _run_until_decoding(device: Device, job: Job) -> None:
    while job.state is not JobState.DECODE or job._join_step is None:
        device.advance(device.next_event_at())
