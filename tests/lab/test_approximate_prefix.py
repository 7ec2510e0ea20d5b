"""Approximate prefix: SGLang's cache-aware router, its own trees of what it routed where."""

from __future__ import annotations

from gateway.fleet.state import Fleet
from gateway.policy.definition import Policy
from gateway.routing.router import decide
from gateway.whatif.timeline import request_profile
from gateway.whatif.trace import TraceRequest
from lab.approximate_prefix import ApproximatePrefix, imbalanced


def prompt(blocks: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(0.0, 512 * len(blocks) + 100, 50, blocks=blocks, block_tokens=512)


CONVERSATION = (0, *range(1, 10))  # ten blocks, the first the system prompt all share


def test_a_prompt_follows_its_longest_match_whatever_the_load(mixed: Policy) -> None:
    fleet = Fleet(mixed, block_tokens=512)
    router = ApproximatePrefix()
    first = decide(request_profile(mixed, prompt(CONVERSATION)), mixed, fleet, router).backend
    assert first is not None
    first.in_flight = 12  # busy; every other backend idle
    # Unrelated prompts (sharing only the system prompt) go to the smallest trees, elsewhere.
    for opening in (100, 200, 300):
        other = prompt((0, *range(opening, opening + 9)))
        assert decide(request_profile(mixed, other), mixed, fleet, router).backend is not first
    # The conversation's next turn matches 10 of its 12 blocks there: it goes back, busy or not.
    longer = prompt((*CONVERSATION, 10, 11))
    assert decide(request_profile(mixed, longer), mixed, fleet, router).backend is first
    # The gateway's own index was never read nor fed: the trees are the router's own.
    assert router.trees.held(first.name) == 12
    assert all(fleet.prefixes.held(b.name) == 0 for b in fleet.backends())


def test_a_match_below_the_threshold_goes_to_the_smallest_tree(mixed: Policy) -> None:
    fleet = Fleet(mixed, block_tokens=512)
    router = ApproximatePrefix()
    placed = {}
    for opening in range(1, 9):  # one conversation on each backend, the last the shortest
        blocks = (0, *range(100 * opening, 100 * opening + (12 - opening)))
        backend = decide(request_profile(mixed, prompt(blocks)), mixed, fleet, router).backend
        assert backend is not None
        placed[backend.name] = len(blocks)
    assert len(placed) == 8
    smallest = min(placed, key=lambda name: placed[name])
    # Two of its ten blocks are the conversation's first: 20%, under the 30% threshold.
    stranger = prompt((0, 101, *range(900, 908)))
    chosen = decide(request_profile(mixed, stranger), mixed, fleet, router).backend
    assert chosen is not None and chosen.name == smallest


def test_load_balances_only_past_both_thresholds() -> None:
    assert imbalanced([100, 30])  # 70 apart and more than 1.5 times
    assert not imbalanced([100, 70])  # 30 apart
    assert not imbalanced([200, 140])  # 60 apart
    # A backend here runs at most its 32 slots: never 64 apart, so the trees alone decide.
    assert not imbalanced([32, 0])
