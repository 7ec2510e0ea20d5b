"""Session hash: a conversation sticks to the backend its session hashes to, blind to the cache."""

from __future__ import annotations

from collections import Counter

from gateway.fleet.state import Fleet
from gateway.policy.definition import Policy
from gateway.routing.router import decide
from gateway.whatif.timeline import Replay, request_profile
from gateway.whatif.trace import TraceRequest, conversation
from lab.session_hash import SessionHash
from lab.strategies import strategy_for


def turn(at: float, prompt: int, opening: int, more: int = 0) -> TraceRequest:
    """A turn of the conversation opening with block `opening` after the shared first block."""
    blocks = (0, opening, *range(opening + 1, opening + 1 + more))
    return TraceRequest(at, prompt, 50, blocks=blocks, block_tokens=512)


def test_a_conversation_is_named_by_its_first_two_blocks() -> None:
    assert conversation(turn(0.0, 1500, 7)) == conversation(turn(9.0, 4000, 7, more=5))
    assert conversation(turn(0.0, 1500, 7)) != conversation(turn(0.0, 1500, 8))
    assert conversation(TraceRequest(0.0, 300, 5, blocks=(0,), block_tokens=512)) is None
    assert conversation(TraceRequest(0.0, 300, 5)) is None


def test_a_session_stays_on_its_backend_whatever_its_load_and_the_cache(mixed: Policy) -> None:
    fleet = Fleet(mixed, block_tokens=512)
    ring = SessionHash()
    profile = request_profile(mixed, turn(0.0, 1500, 7), prefixes=False, session=True)
    home = decide(profile, mixed, fleet, ring).backend
    assert home is not None
    # Busier than every other backend, holding nothing of the prompt while another holds it all:
    # the session still goes home.
    home.in_flight = home.slots - 1
    other = next(b for b in fleet.backends() if b is not home)
    fleet.prefixes.sent(other.name, (0, 7, 8, 9))
    later = request_profile(mixed, turn(9.0, 2000, 7, more=2), prefixes=False, session=True)
    assert decide(later, mixed, fleet, ring).backend is home
    # Full, it passes the session to the next backend clockwise, the same one every time.
    home.in_flight = home.slots
    spill = decide(later, mixed, fleet, ring).backend
    assert spill is not None and spill is not home
    assert decide(later, mixed, fleet, SessionHash()).backend is spill


def test_sessions_spread_over_every_backend(mixed: Policy) -> None:
    fleet = Fleet(mixed)
    ring = SessionHash()
    homes = Counter()
    for opening in range(1, 801):
        profile = request_profile(mixed, turn(0.0, 1500, opening), prefixes=False, session=True)
        backend = decide(profile, mixed, fleet, ring).backend
        assert backend is not None
        homes[backend.name] += 1
    assert len(homes) == 8
    # 160 points a backend: each of the eight takes its share within a few tens of percent.
    assert max(homes.values()) < 2 * min(homes.values())


def test_every_turn_of_a_replayed_conversation_lands_on_one_backend(mixed: Policy) -> None:
    turns = [turn(t, 1500 + 600 * t, 7, more=t) for t in range(5)]
    turns += [turn(t + 0.5, 1500, 100 + t) for t in range(5)]  # others, in between
    replay = Replay(strategy_for("session-hash", mixed), sorted(turns, key=lambda r: r.arrival_s))
    replay.run()
    ours = {p.backend.state.name for p in replay.passages if p.request.blocks[1] == 7 and p.backend}
    assert len(ours) == 1
    assert all(p.profile.blocks == () for p in replay.passages)
