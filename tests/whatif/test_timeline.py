"""The replay's timeline: a trace's requests on simulated devices, event by event, reproducibly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gateway.costmodel.train import Observation
from gateway.policy.definition import Policy
from gateway.routing.ranking import preference_order
from gateway.whatif.scorecard import DRAIN_S, measure, replayed, summarize
from gateway.whatif.strategy import Strategy, learned
from gateway.whatif.timeline import Replay
from gateway.whatif.trace import TraceRequest, read_trace
from lab.strategies import strategy_for


def static(policy: Policy) -> Strategy:
    """Return the router that takes each route's pools in the order the policy lists them."""
    return Strategy("static", policy, preference_order)


def test_a_replay_is_deterministic_for_a_seed(policy: Policy, requests: list[TraceRequest]) -> None:
    first, again = (measure(learned(policy), requests, seed=7) for _ in range(2))
    assert first == again
    assert measure(learned(policy), requests, seed=8) != first  # the meter reads elsewhere


def test_saturated_pools_queue_then_refuse_and_refusals_miss_the_slo(
    policy: Policy, trace: Path
) -> None:
    burst = read_trace(trace, limit=600, rate_scale=30.0)
    result = measure(static(policy), burst)
    assert result["queued_share"] > 0
    assert result["refused"] > 0
    assert result["served"] + result["refused"] == 600
    assert result["slo_attainment"] <= result["served"] / 600 + 1e-5  # rounded to 5 places


def test_every_request_ends_served_or_refused_and_a_served_one_held_a_slot_from_admission(
    policy: Policy, trace: Path
) -> None:
    burst = read_trace(trace, limit=400, rate_scale=30.0)
    replay = Replay(static(policy), burst).run()
    refused = [p for p in replay.passages if p.refused is not None]
    served = [p for p in replay.passages if p.served]
    assert refused, "a burst this dense must overflow the queues"
    assert len(served) + len(refused) == len(burst)
    for p in served:
        assert p.job is not None and p.admitted_s is not None
        assert p.arrival_s <= p.admitted_s <= p.job.first_token_at <= p.job.finished_at
        assert 1 <= p.concurrent <= policy.pools[p.pool].slots_per_backend
    # The fleet is healthy and every prompt fits: a refusal can only be for capacity.
    assert {p.refused for p in refused} == {"NoCapacity"}


def test_embeddings_and_unstreamed_answers_are_judged_on_their_end_to_end_time(
    policy: Policy,
) -> None:
    # Interactive (the default class): 500 ms to the first token, 50 ms per token after it. A
    # 30k-token prompt takes the GPU well past 500 ms to its first token.
    mix = [
        TraceRequest(0.1 * i, prompt, output, endpoint=endpoint, stream=stream, model=model)
        for i, (prompt, output, endpoint, stream, model) in enumerate(
            [
                (300, 0, "embeddings", False, "bge-large-en-v1.5"),
                (6000, 0, "embeddings", False, "bge-large-en-v1.5"),
                (30_000, 100, "chat", False, None),
                (30_000, 100, "chat", True, None),
                (30_000, 2, "chat", False, None),
            ]
        )
    ]
    replay = Replay(static(policy), mix).run()
    *embeddings, whole, streamed, short = replay.passages
    assert all(p.served and p.e2e_s is not None and p.e2e_s < 0.5 for p in embeddings)
    assert all(p.meets_slo() for p in embeddings)
    for p in (whole, streamed, short):
        assert p.served and p.ttft_s is not None and p.ttft_s > 0.5
    # The same answer: streamed, its first token is late; whole, it is in by 500 + 99 × 50 ms.
    assert whole.e2e_s is not None and whole.e2e_s <= 0.5 + 99 * 0.05 and whole.meets_slo()
    assert not streamed.meets_slo()
    # Two tokens are due by 550 ms.
    assert short.e2e_s is not None and short.e2e_s > 0.55 and not short.meets_slo()


def test_a_prompt_that_repeats_a_prefix_reads_it_from_its_backends_prefix_cache(
    policy: Policy,
) -> None:
    opening = tuple(range(8))  # eight of Mooncake's 512-token blocks: a 4,000-token prompt
    turns = [
        TraceRequest(0.0, 4000, 50, blocks=opening, block_tokens=512),
        TraceRequest(5.0, 4500, 50, blocks=(*opening, 99), block_tokens=512),
        TraceRequest(10.0, 4000, 50),  # an Azure request: no blocks, nothing shared
    ]
    replay = Replay(strategy_for("gpu-only", policy), turns).run()
    first, second, plain = replay.passages
    assert first.job is not None and second.job is not None and plain.job is not None
    assert first.backend is second.backend
    # The first prompt's 16-token blocks before its last token: 249 of them.
    assert [p.job.cached_tokens for p in replay.passages] == [0, 249 * 16, 0]
    assert second.ttft_s is not None and first.ttft_s is not None
    assert second.ttft_s < first.ttft_s / 2


# A conversation on Mooncake's 512-token blocks: its first turn, then a second that repeats the
# first's four whole blocks and adds its own. The first decodes long enough to still run when the
# second arrives, so its backend is busier than the others.
FIRST = TraceRequest(0.0, 4 * 512 + 100, 2000, blocks=(0, 1, 2, 3, 4), block_tokens=512)
SECOND = TraceRequest(5.0, 6 * 512 + 100, 20, blocks=(0, 1, 2, 3, 10, 11, 12), block_tokens=512)


def test_the_index_learns_what_each_backend_was_sent_and_the_next_turn_goes_where_it_is(
    mixed: Policy,
) -> None:
    replay = Replay(strategy_for("gpu-only", mixed), [FIRST, SECOND]).run()
    first, second = replay.passages
    assert first.backend is not None and second.job is not None
    held = first.backend.state.name
    assert replay.fleet.block_tokens == 512
    # The whole blocks of both prompts (a prompt's partial last block is not hashed).
    assert replay.fleet.prefixes.held(held) == 6
    # Busier than three idle GPUs, it holds four of the second prompt's six whole blocks.
    assert second.backend is first.backend
    assert second.expected_blocks == 4 and second.job.cached_tokens == 4 * 512
    assert second.ttft_s is not None and first.ttft_s is not None
    assert second.ttft_s < first.ttft_s


def test_least_loaded_sends_the_next_turn_to_an_idle_backend_without_the_prefix(
    mixed: Policy,
) -> None:
    replay = Replay(strategy_for("least-loaded", mixed), [FIRST, SECOND]).run()
    first, second = replay.passages
    assert second.job is not None
    assert second.backend is not first.backend and second.job.cached_tokens == 0
    # Its router never hashed a prompt: the index learned nothing.
    assert all(p.profile.blocks == () for p in replay.passages)
    assert all(replay.fleet.prefixes.held(b.name) == 0 for b in replay.fleet.backends())


def test_a_prompt_sent_during_anothers_prefill_expects_none_of_it_and_corrects_nothing(
    mixed: Policy,
) -> None:
    # The same prompt twice, the second before the first's prefill has ended: the engine has
    # not kept the blocks yet, and the index, which records them once the first token says so,
    # does not expect them.
    again = [FIRST, replace(FIRST, arrival_s=0.001, output_tokens=5)]
    replay = Replay(strategy_for("gpu-only", mixed), again).run()
    first, second = replay.passages
    assert second.job is not None and second.backend is not None
    assert second.expected_blocks == 0 and second.job.cached_tokens == 0
    assert replay.fleet.prefixes.scale(second.backend.state.name) == 1.0
    # Each prompt's four whole blocks were recorded where it ran, once its prefill ended.
    assert first.backend is not None
    assert replay.fleet.prefixes.held(first.backend.state.name) == 4
    assert replay.fleet.prefixes.held(second.backend.state.name) == 4


def test_the_learned_model_learns_prefill_from_the_tokens_the_engine_computed(
    mixed: Policy,
) -> None:
    strategy = learned(mixed)
    learner = strategy.learner
    assert learner is not None
    seen: list[Observation] = []
    observe = learner.observe

    def keep(observation: Observation, now: float) -> None:
        seen.append(observation)
        observe(observation, now)

    learner.observe = keep  # type: ignore[method-assign]
    replay = Replay(strategy, [FIRST, SECOND]).run()
    cached = [p.job.cached_tokens for p in replay.passages if p.job is not None]
    assert cached[1] > 0
    prompts = {o.prompt_tokens for o in seen}
    assert prompts == {r.prompt_tokens - c for r, c in zip((FIRST, SECOND), cached, strict=True)}


def test_a_trace_without_prefix_blocks_routes_as_the_replay_did_before_the_cache(
    policy: Policy, requests: list[TraceRequest]
) -> None:
    replay = Replay(learned(policy), requests[:100]).run()
    # The live gateway's block size, an empty index, no hit: nothing reaches the ranking.
    assert replay.fleet.block_tokens == 64
    assert all(p.profile.blocks == () and p.profile.block_tokens == 0 for p in replay.passages)
    assert all(replay.fleet.prefixes.held(b.name) == 0 for b in replay.fleet.backends())
    assert all(p.job is not None and p.job.cached_tokens == 0 for p in replay.passages)


def test_a_sparse_trace_is_not_metered_second_by_second_and_energy_is_still_attributed(
    policy: Policy,
) -> None:
    # Two requests a day apart: the meter is read while each runs and settles, not for every
    # idle second between them.
    day = 86_400.0
    trace = [TraceRequest(0.0, 500, 50), TraceRequest(day, 500, 50)]
    strategy = learned(policy)
    learner = strategy.learner
    assert learner is not None
    energies: list[float] = []
    observe = learner.observe

    def keep(observation: Observation, now: float) -> None:
        energies.append(observation.energy_j)
        observe(observation, now)

    learner.observe = keep  # type: ignore[method-assign]
    replay = Replay(strategy, trace)
    readings = 0
    read = replay._read_meters

    def count(now: float) -> None:
        nonlocal readings
        readings += 1
        read(now)

    replay._read_meters = count  # type: ignore[method-assign]
    replay.run()
    assert len(energies) == 2 and all(e > 0 for e in energies)
    assert 0 < readings < 200  # every second of the day would be 86,400


def test_the_fleets_counters_read_at_marks_add_up_to_what_it_drew(
    policy: Policy, requests: list[TraceRequest]
) -> None:
    # The what-if's windows are measured between marks: read mid-traffic, they must split the
    # fleet's energy and its price, not add to it or lose any.
    last = max(r.arrival_s for r in requests)
    marks = [0.0, last / 3, last / 2, last + DRAIN_S]
    run = replayed(learned(policy), requests, marks=marks)
    assert [round(r.at_s, 9) for r in run.readings] == [round(m, 9) for m in marks]
    assert run.readings[1].energy_above_idle_j != run.readings[2].energy_above_idle_j
    whole = replayed(learned(policy), requests)
    assert summarize(run) == summarize(whole)  # reading the counters changes nothing
    for name, sim in run.world.items():
        assert run.readings[0].energy_above_idle_j[name] == 0.0
        assert run.readings[-1].energy_above_idle_j[name] == sim.energy_above_idle_j
        assert run.readings[-1].energy_usd[name] == sim.energy_usd
