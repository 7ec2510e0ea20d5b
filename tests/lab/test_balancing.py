"""Round-robin and least-loaded by backend: every backend of the eligible pools, prompts unread."""

from __future__ import annotations

from gateway.fleet.state import Fleet, PoolState
from gateway.policy.definition import Policy
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking
from gateway.routing.router import decide
from gateway.whatif.timeline import request_profile
from gateway.whatif.trace import TraceRequest
from lab.balancing import RoundRobin, least_loaded

# Fits the cards' 8k context: every backend of both pools may serve it.
SHORT = TraceRequest(0.0, 2048, 100, blocks=(0, 1, 2, 3), block_tokens=512)


def eligible(fleet: Fleet) -> list[PoolState]:
    return [fleet.pools["asic"], fleet.pools["gpu"]]


def first_choices(ranking: Ranking) -> list[str]:
    return [ranking.backends[pool.name][0].name for pool in ranking.pools]


def test_least_loaded_takes_the_backend_running_the_fewest_requests_a_slot(mixed: Policy) -> None:
    fleet = Fleet(mixed)
    for backend in fleet.backends():
        backend.in_flight = backend.slots // 2
    fleet.pools["gpu"].backends[2].in_flight = 8  # 8 of 32 slots: a quarter
    fleet.pools["asic"].backends[1].in_flight = 6  # 6 of 16: more, a slot for a slot
    profile = request_profile(mixed, SHORT, prefixes=False)
    ranking = least_loaded(profile, mixed.routes[0], eligible(fleet), [])
    assert first_choices(ranking) == ["gpu-2", "asic-1"]
    assert decide(profile, mixed, fleet, least_loaded).backend is fleet.pools["gpu"].backends[2]


def test_least_loaded_never_reads_the_prefix_index(mixed: Policy) -> None:
    fleet = Fleet(mixed, block_tokens=512)
    holder = fleet.pools["gpu"].backends[3]
    fleet.prefixes.sent(holder.name, SHORT.blocks)
    fleet.pools["gpu"].backends[0].in_flight = 1
    holder.in_flight = 2
    for backend in fleet.pools["asic"].backends:
        backend.in_flight = 16
    # Even a profile carrying the prompt's blocks goes to the least loaded, not to their holder.
    profile = request_profile(mixed, SHORT)
    assert profile.blocks
    chosen = decide(profile, mixed, fleet, least_loaded).backend
    assert chosen is not None and chosen.name == "gpu-1"


def test_round_robin_starts_each_request_one_backend_further(mixed: Policy) -> None:
    fleet = Fleet(mixed)
    turns = RoundRobin(start=2)
    profile = request_profile(mixed, SHORT, prefixes=False)
    chosen = []
    for _ in range(9):
        decision = decide(profile, mixed, fleet, turns)
        assert decision.backend is not None
        chosen.append(decision.backend.name)
    order = [*(f"asic-{i}" for i in range(4)), *(f"gpu-{i}" for i in range(4))]
    assert chosen == [*order[2:], *order[:2], order[2]]


def test_a_full_backend_passes_the_request_to_the_next_in_its_ranking(mixed: Policy) -> None:
    fleet = Fleet(mixed)
    for backend in fleet.pools["asic"].backends:
        backend.in_flight = backend.slots
    profile: RequestProfile = request_profile(mixed, SHORT, prefixes=False)
    decision = decide(profile, mixed, fleet, RoundRobin())
    assert decision.backend is fleet.pools["gpu"].backends[0]
