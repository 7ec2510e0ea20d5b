"""Parking: how many backends each pool needs for the load coming, and which to switch off.

On an always-on fleet most of the energy is idle draw, paid wherever a request runs. Parking
changes what is switched on. Each pool's forecast comes from its own traffic, over the last
`WINDOW_S`: the most requests it held at once, and Little's law on its arrivals (the rate over
the last `SHORT_S`, and over the window, times the mean time a request held its slot), whichever
is highest, plus the requests waiting in its queue. A pool whose backends take `wake_s` to wake
forecasts the load as it will be once one is up: where arrivals are rising (the short rate above
the window's), the rate is carried forward along that slope for `wake_s`. The pool needs enough
backends to hold that at `PACK` of their slots, the rest of the slots being headroom for load
that grows faster than forecast while a backend wakes.

A backend the forecast needs is woken at once: a draining one simply takes requests again, a
parked one is switched on and serves after its wake-up time. One the forecast has not needed
for `HOLD_S`, or for its pool's `wake_s` where that is longer, is drained (it takes no new
request) and parked once its last request is done: one at a time, the active backend running the
fewest requests. A backend parked sooner than its wake-up lasts and needed again costs more to
bring back (its idle draw, and its hours if released, over the wake-up) than it saved, and comes
back late: on Azure's code trace, released devices taking 180 s to start, parking after 60 s woke
17 times, 2 of them with requests waiting, and doubled TTFT p99; after 180 s, 9 and none late
(docs/routing.md, "Parking"). A pool keeps `min_active` backends
on (at least 1), so a route never loses a pool to a forecast made without its traffic, and the
fleet keeps a GPU on: it serves every model, and is the fallback. An ejected backend counts as
off: the plan wakes another in its place.

A backend's `parking` state says where it is: '' in service, 'draining', 'parked', 'waking'.
Only one in service takes a request (`BackendState.takes`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gateway.fleet.state import DRAINING, IN_SERVICE, PARKED, WAKING, BackendState, Fleet, PoolState
from gateway.policy.definition import Policy

WINDOW_S = 120.0
SHORT_S = 20.0
PACK = 0.6
HOLD_S = 60.0
SLOT_EWMA = 0.05  # weight of each new request's slot time in the pool's mean
DEFAULT_SLOT_S = 5.0  # a pool's mean slot time before any request finished


@dataclass(frozen=True, slots=True)
class Move:
    """One step the plan takes: park (drain, then switch off) or wake a backend, and why."""

    backend: BackendState
    action: str  # "park" or "wake"
    reason: str


@dataclass(slots=True)
class PoolTraffic:
    """What a pool saw recently: its arrivals, its load's samples, its mean slot time."""

    arrivals: deque[float] = field(default_factory=deque)
    loads: deque[tuple[float, int]] = field(default_factory=deque)
    slot_s: float = DEFAULT_SLOT_S
    needed_fewer_since: float | None = None


class Parking:
    """Plans, pool by pool, which backends stay on; told of arrivals and finished requests."""

    def __init__(
        self,
        min_active: Mapping[str, int] | None = None,
        wake_s: Mapping[str, float] | None = None,
        *,
        window_s: float = WINDOW_S,
        short_s: float = SHORT_S,
        hold_s: float = HOLD_S,
    ):
        self.min_active = dict(min_active or {})
        self.wake_s = dict(wake_s or {})
        self.releases: frozenset[str] = frozenset()  # the pools whose parking gives devices back
        self.window_s, self.short_s, self.hold_s = window_s, short_s, hold_s
        self.traffic: dict[str, PoolTraffic] = {}

    @classmethod
    def of(cls, policy: Policy) -> Parking:
        """Return a plan with the `min_active` and `wake_s` of the policy's `parking` blocks."""
        parking = cls()
        parking.configure(policy)
        return parking

    def configure(self, policy: Policy) -> list[str]:
        """Take a policy version's figures (traffic seen is kept); return the pools it parks."""
        blocks = {name: pool.parking for name, pool in policy.pools.items() if pool.parking}
        self.min_active = {name: block.min_active for name, block in blocks.items()}
        self.wake_s = {name: block.wake_s for name, block in blocks.items()}
        self.releases = frozenset(n for n, block in blocks.items() if block.mode == "release")
        return list(blocks)

    def arrived(self, pool: str, now: float) -> None:
        """Count a request routed to `pool` at `now`."""
        arrivals = self._traffic(pool).arrivals
        arrivals.append(now)
        if arrivals[0] < now - self.window_s:  # bounded whether or not the pool is planned
            arrivals.popleft()

    def finished(self, pool: str, slot_s: float) -> None:
        """Count a request of `pool` that held its slot `slot_s` seconds."""
        traffic = self._traffic(pool)
        traffic.slot_s += SLOT_EWMA * (slot_s - traffic.slot_s)

    def needed(self, pool: PoolState, now: float) -> tuple[int, str]:
        """Return the backends `pool` needs for the load forecast from `now`, and the reason."""
        traffic = self._traffic(pool.name)
        start = now - self.window_s
        while traffic.arrivals and traffic.arrivals[0] < start:
            traffic.arrivals.popleft()
        while traffic.loads and traffic.loads[0][0] < start:
            traffic.loads.popleft()
        load = sum(b.load for b in pool.backends)
        traffic.loads.append((now, load))
        peak = max(n for _, n in traffic.loads)
        recent = sum(1 for t in traffic.arrivals if t >= now - self.short_s) / self.short_s
        overall = len(traffic.arrivals) / self.window_s
        # The two rates are centred (WINDOW_S - SHORT_S) / 2 apart: their slope, carried on
        # for a wake-up, is the rate the pool sees once a backend woken now serves.
        rising = max(0.0, recent - overall) / ((self.window_s - self.short_s) / 2)
        rate = max(recent, overall) + rising * self.wake_s.get(pool.name, 0.0)
        forecast = max(peak, rate * traffic.slot_s) + len(pool.waiters)
        slots = pool.spec.slots_per_backend
        need = math.ceil(forecast / (slots * PACK))
        floor = min(max(self.min_active.get(pool.name, 1), 1), len(pool.backends))
        reason = (
            f"forecast {forecast:.1f} requests in flight (peak {peak} in {self.window_s:.0f} s, "
            f"{rate:.2f}/s x {traffic.slot_s:.1f} s held, {len(pool.waiters)} waiting) at "
            f"{PACK:.0%} of {slots} slots a backend"
        )
        if rising > 0 and self.wake_s.get(pool.name, 0.0) > 0:
            reason += f"; arrivals rising, carried over its {self.wake_s[pool.name]:g} s wake-up"
        return min(max(need, floor), len(pool.backends)), reason

    def plan(self, fleet: Fleet, now: float, pools: Collection[str] | None = None) -> list[Move]:
        """Return the moves that bring every live pool (of `pools`, if given) to the backends
        its forecast needs."""
        moves: list[Move] = []
        for pool in fleet.pools.values():
            if not pool.spec.live or (pools is not None and pool.name not in pools):
                continue
            need, reason = self.needed(pool, now)
            on = [b for b in pool.backends if b.parking in (IN_SERVICE, WAKING) and not b.ejected]
            traffic = self._traffic(pool.name)
            if need > len(on):
                traffic.needed_fewer_since = None
                # A draining backend takes requests again at once; then the parked wake.
                off = sorted(
                    (b for b in pool.backends if b.parking in (DRAINING, PARKED)),
                    key=lambda b: b.parking != DRAINING,
                )
                moves += [Move(b, "wake", reason) for b in off[: need - len(on)]]
            elif need < len(on):
                if traffic.needed_fewer_since is None:
                    traffic.needed_fewer_since = now
                serving = [b for b in on if b.parking == IN_SERVICE]
                if now - traffic.needed_fewer_since >= self.hold(pool.name) and len(serving) > 1:
                    quietest = min(serving, key=lambda b: (b.load, b.name))
                    moves.append(Move(quietest, "park", reason))
                    traffic.needed_fewer_since = now  # one at a time, hold_s apart
            else:
                traffic.needed_fewer_since = None
        return moves

    def hold(self, pool: str) -> float:
        """Return how long `pool` must need fewer backends before one is parked."""
        return max(self.hold_s, self.wake_s.get(pool, 0.0))

    def _traffic(self, pool: str) -> PoolTraffic:
        traffic = self.traffic.get(pool)
        if traffic is None:
            traffic = self.traffic[pool] = PoolTraffic()
        return traffic
