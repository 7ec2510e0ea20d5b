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

Slots are not a pool's only limit. Engines compute prompts in chunks within a token budget per
step, beside the sequences decoding (vLLM's chunked prefill), so every step that carries a chunk
is slow for each sequence in it: for long prompts, what a backend can take is the prompt tokens
it computes a second, not its slots. So a pool also needs the backends that spend at most
`PREFILL_SHARE` of their time on its prefill: the prefill seconds a second its arrivals bring
(each prompt's tokens at the policy prior's prefill time a token for its model on the pool,
`gateway.policy.physics`), the most over `SHORT_S` in the last `PROMPT_PEAK_S` or the forecast
rate, whichever is higher. On Azure's code trace (prompts of 2k tokens on average, 13 generated
at the median, bursts of up to 250 requests in 5 s after minutes of quiet), sized by slots
alone, the backends left on served 93 % of requests within the SLO against 99.8 % always on,
losing it to TPOT beside the prefills of bursts (docs/routing.md, "Parking").

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
from gateway.policy.physics import physics

WINDOW_S = 120.0
SHORT_S = 20.0
PACK = 0.6
HOLD_S = 60.0
# Fitted on Azure's code trace, seed 3, the two fleets of docs/routing.md rows 5 and 6: at 0.25
# the released fleet met the SLO by 0.03 points and the asleep one missed it by 1.5; a peak kept
# 300 s served 99.06 % asleep against 600 s's 99.34 %, the bursts coming back after quiet minutes.
PREFILL_SHARE = 0.2
PROMPT_PEAK_S = 600.0
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
    """What a pool saw recently: its arrivals (each with its prompt's prefill seconds), its
    load's samples, its prefill seconds a second, its mean slot time."""

    arrivals: deque[tuple[float, float]] = field(default_factory=deque)
    loads: deque[tuple[float, int]] = field(default_factory=deque)
    prefills: deque[tuple[float, float]] = field(default_factory=deque)
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
        prompt_peak_s: float = PROMPT_PEAK_S,
    ):
        self.min_active = dict(min_active or {})
        self.wake_s = dict(wake_s or {})
        self.releases: frozenset[str] = frozenset()  # the pools whose parking gives devices back
        # The prior's prefill time a prompt token, by pool and model; None: the pool's largest.
        self.per_token_s: dict[tuple[str, str | None], float] = {}
        self.window_s, self.short_s, self.hold_s = window_s, short_s, hold_s
        self.prompt_peak_s = prompt_peak_s
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
        self.per_token_s = {}
        for name, pool in policy.pools.items():
            for model in pool.models:
                prior = physics(pool, policy.params_b(model), 0.0).prefill_per_token_s
                self.per_token_s[name, model] = prior
                self.per_token_s[name, None] = max(prior, self.per_token_s.get((name, None), 0.0))
        return list(blocks)

    def prefill_s(self, pool: str, prompt_tokens: int, model: str | None = None) -> float:
        """Return the prefill seconds a prompt takes a backend of `pool`, by the policy's prior
        (for a model the pool does not list, its largest's; 0 before a policy is known)."""
        per_token = self.per_token_s.get((pool, model)) or self.per_token_s.get((pool, None), 0.0)
        return prompt_tokens * per_token

    def arrived(self, pool: str, now: float, prefill_s: float = 0.0) -> None:
        """Count a request routed to `pool` at `now`, whose prompt takes `prefill_s` to compute
        (`Parking.prefill_s`)."""
        arrivals = self._traffic(pool).arrivals
        arrivals.append((now, prefill_s))
        if arrivals[0][0] < now - self.window_s:  # bounded whether or not the pool is planned
            arrivals.popleft()

    def finished(self, pool: str, slot_s: float) -> None:
        """Count a request of `pool` that held its slot `slot_s` seconds."""
        traffic = self._traffic(pool)
        traffic.slot_s += SLOT_EWMA * (slot_s - traffic.slot_s)

    def needed(self, pool: PoolState, now: float) -> tuple[int, str]:
        """Return the backends `pool` needs for the load forecast from `now`, and the reason."""
        traffic = self._traffic(pool.name)
        start = now - self.window_s
        while traffic.arrivals and traffic.arrivals[0][0] < start:
            traffic.arrivals.popleft()
        while traffic.loads and traffic.loads[0][0] < start:
            traffic.loads.popleft()
        while traffic.prefills and traffic.prefills[0][0] < now - self.prompt_peak_s:
            traffic.prefills.popleft()
        load = sum(b.load for b in pool.backends)
        traffic.loads.append((now, load))
        peak = max(n for _, n in traffic.loads)
        wake_s = self.wake_s.get(pool.name, 0.0)
        recent = [s for t, s in traffic.arrivals if t >= now - self.short_s]
        rate = self._forecast(len(recent), len(traffic.arrivals), wake_s)
        forecast = max(peak, rate * traffic.slot_s) + len(pool.waiters)
        slots = pool.spec.slots_per_backend
        # Prefill seconds a second: how many backends' whole time the prompts take.
        traffic.prefills.append((now, sum(recent) / self.short_s))
        prefill = max(
            max(p for _, p in traffic.prefills),
            self._forecast(sum(recent), sum(s for _, s in traffic.arrivals), wake_s),
        )
        need = max(
            math.ceil(forecast / (slots * PACK)),
            math.ceil(round(prefill / PREFILL_SHARE, 9)),  # rounded: 0.6 / 0.2 is not 3.0000001
        )
        floor = min(max(self.min_active.get(pool.name, 1), 1), len(pool.backends))
        reason = (
            f"forecast {forecast:.1f} requests in flight (peak {peak} in {self.window_s:.0f} s, "
            f"{rate:.2f}/s x {traffic.slot_s:.1f} s held, {len(pool.waiters)} waiting) at "
            f"{PACK:.0%} of {slots} slots a backend, and {prefill:.2f} s of prefill a second "
            f"(the most in {self.prompt_peak_s:.0f} s, or forecast) at {PREFILL_SHARE:.0%} of a "
            "backend's time"
        )
        if len(recent) / self.short_s > len(traffic.arrivals) / self.window_s and wake_s > 0:
            reason += f"; arrivals rising, carried over its {wake_s:g} s wake-up"
        return min(max(need, floor), len(pool.backends)), reason

    def _forecast(self, recent: float, overall: float, wake_s: float) -> float:
        """Return the rate a second to plan for, from what arrived over the last `short_s`
        (`recent`) and over the window (`overall`)."""
        recent, overall = recent / self.short_s, overall / self.window_s
        # The two rates are centred (WINDOW_S - SHORT_S) / 2 apart: their slope, carried on
        # for a wake-up, is the rate the pool sees once a backend woken now serves.
        rising = max(0.0, recent - overall) / ((self.window_s - self.short_s) / 2)
        return max(recent, overall) + rising * wake_s

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
