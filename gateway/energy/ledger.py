"""Energy attribution: split what a backend's energy counter measured among its requests.

A pure core, fed by the power scraper (gateway/energy/meter.py) with counter readings and by
the forwarder with request spans. Each interval between two readings is split when every request
overlapping it has ended:

- the energy above idle goes to the requests active in the interval, in proportion to the work
  each did in it (prompt tokens prefilled, weighted, and tokens decoded);
- the idle draw, and the device time that the hourly price pays for, are shared by time.

When several gateway replicas send to one backend, each sees only its own requests: a reading
carries this replica's share of the backend's load, and only that share of the interval is
split among its requests, so the replicas together attribute the energy once.

A request's energy is final once every interval it overlaps has been split.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# Energy of one prefilled prompt token relative to one decoded token. Prefill is compute-bound
# and batched over the whole prompt, decode is bandwidth-bound one token per step: on an H100
# serving an 8B model a prompt token costs ~0.01 J against ~0.1-2 J per decoded token.
PREFILL_TOKEN_WEIGHT = 0.05


@dataclass(slots=True, eq=False)
class Span:
    """One request's time on a backend, and the energy attributed to it so far."""

    key: str
    start: float
    end: float | None = None
    first_token: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    energy_j: float = 0.0
    device_s: float = 0.0

    def work(self, t0: float, t1: float) -> float:
        """Return the work units this span did within [t0, t1]."""
        assert self.end is not None
        prefill = self.prompt_tokens * PREFILL_TOKEN_WEIGHT
        decode = float(self.completion_tokens)
        if self.first_token is None or not self.start <= self.first_token <= self.end:
            return (prefill + decode) * _share(self.start, self.end, t0, t1)
        return prefill * _share(self.start, self.first_token, t0, t1) + decode * _share(
            self.first_token, self.end, t0, t1
        )


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _union(ranges: list[tuple[float, float]]) -> float:
    """Return the total length covered by a set of ranges."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(ranges):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _share(a0: float, a1: float, t0: float, t1: float) -> float:
    """Return the fraction of [a0, a1] that lies in [t0, t1] (all of it if a0 == a1 is inside)."""
    if a1 <= a0:
        return 1.0 if t0 <= a0 < t1 else 0.0
    return _overlap(a0, a1, t0, t1) / (a1 - a0)


@dataclass(slots=True)
class Interval:
    """Energy a backend's counter measured between two readings, and this replica's share."""

    t0: float
    t1: float
    energy_j: float
    share: float = 1.0


class BackendLedger:
    """Attribute one backend's measured energy to the requests it served."""

    def __init__(self, idle_w: float):
        self.idle_w = idle_w
        self._idle_measured = False
        self._reading: tuple[float, float, float] | None = None
        self._intervals: deque[Interval] = deque()
        self._spans: dict[str, Span] = {}
        self.measured_until = -math.inf
        self.power_w: float | None = None  # the draw between the last two readings

    def reading(self, t: float, counter_j: float, share: float = 1.0) -> Interval | None:
        """Take a reading of the cumulative energy counter at time t; return the interval it
        closes, if any.

        `share` is the part of the backend's load that this replica's requests were at t
        (1 for a single gateway); an interval gets the mean of its two ends.
        """
        interval = None
        if self._reading is not None:
            t0, c0, share0 = self._reading
            if t > t0 and counter_j >= c0:  # a counter reset loses one interval, nothing more
                interval = Interval(t0, t, counter_j - c0, (share0 + share) / 2)
                self._intervals.append(interval)
                self.power_w = (counter_j - c0) / (t - t0)
                self._idle_floor(counter_j - c0, t - t0, t0, t)
        self._reading = (t, counter_j, share)
        self.measured_until = t
        return interval

    def restart(self) -> None:
        """Forget the last reading: the device was switched off since (parked), and what it
        drew then is neither its idle draw nor any request's; the next reading starts anew."""
        self._reading = None

    def _idle_floor(self, energy_j: float, seconds: float, t0: float, t1: float) -> None:
        # With nothing running, the draw is the idle power: learn it, so the nominal figure
        # only matters until the device has been seen idle once.
        busy = any(s.start < t1 and (s.end is None or s.end > t0) for s in self._spans.values())
        if busy:
            return
        measured = energy_j / seconds
        if not self._idle_measured or measured < self.idle_w:
            self.idle_w = measured
        else:
            # Rise slowly: work this gateway cannot see (another replica's) must not pass
            # for idle draw.
            self.idle_w += 0.01 * (measured - self.idle_w)
        self._idle_measured = True

    def open(self, key: str, start: float) -> None:
        """Start attributing energy to a request that began at start."""
        self._spans[key] = Span(key, start)

    def close(
        self,
        key: str,
        end: float,
        prompt_tokens: int,
        completion_tokens: int,
        first_token: float | None = None,
    ) -> None:
        """Record how a request ended and the work it did."""
        span = self._spans[key]
        span.end = max(end, span.start)
        span.prompt_tokens = prompt_tokens
        span.completion_tokens = completion_tokens
        span.first_token = first_token

    def settle(self) -> list[Span]:
        """Split every interval whose requests have all ended; return the spans now final."""
        while self._intervals:
            interval = self._intervals[0]
            spans = [
                s
                for s in self._spans.values()
                if s.start < interval.t1 and (s.end is None or s.end > interval.t0)
            ]
            if any(s.end is None for s in spans):
                break
            self._split(interval, spans)
            self._intervals.popleft()
        settled_until = self._intervals[0].t0 if self._intervals else self.measured_until
        done = [s for s in self._spans.values() if s.end is not None and s.end <= settled_until]
        for span in done:
            del self._spans[span.key]
        return done

    def _split(self, interval: Interval, spans: Iterable[Span]) -> None:
        t0, t1 = interval.t0, interval.t1
        present = []
        for span in spans:
            end = span.end if span.end is not None else t1
            a, b = max(span.start, t0), min(end, t1)
            if b > a or span.start == span.end:
                present.append((span, a, b))
        if not present:
            return
        idle_total = min(self.idle_w * (t1 - t0), interval.energy_j)
        dynamic_j = (interval.energy_j - idle_total) * interval.share
        # Idle draw and device time are paid only while something runs; a device idling
        # between requests is the fleet's cost, not theirs.
        busy = _union([(a, b) for _, a, b in present])
        idle_j = idle_total * busy / (t1 - t0) * interval.share
        works = [s.work(t0, t1) for s, _, _ in present]
        total_work = sum(works)
        total_time = sum(b - a for _, a, b in present)
        for (span, a, b), work in zip(present, works, strict=True):
            time_share = (b - a) / total_time if total_time > 0 else 1 / len(present)
            work_share = work / total_work if total_work > 0 else time_share
            span.energy_j += dynamic_j * work_share + idle_j * time_share
            span.device_s += busy * time_share

    def __contains__(self, key: str) -> bool:
        return key in self._spans

    def forget(self, key: str) -> Span | None:
        """Stop tracking a request whose energy cannot be measured; return its span."""
        return self._spans.pop(key, None)

    def pending(self) -> list[Span]:
        """Return the spans still waiting for their energy."""
        return list(self._spans.values())
