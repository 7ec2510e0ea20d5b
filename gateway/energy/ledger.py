"""Energy attribution: split what a backend's energy counter measured among its requests.

A pure core, fed by the meter (gateway/energy/meter.py) with counter readings and by the
forwarder and the mirror with request spans. Each interval between two readings is split among
the requests that ran in it:

- the energy above idle goes to the requests active in the interval, in proportion to the work
  each did in it (prompt tokens prefilled, weighted, and tokens decoded);
- the idle draw, and the device time that the hourly price pays for, are shared by time.

An interval is split once every request overlapping it has ended, when each one's work is
known, or `SETTLE_WITHIN_S` after it ended, whichever comes first: then a request still running
is given the work rate of those that ended in the interval (under continuous batching every
sequence in decode takes a token a step, so they go at one pace), or, with none ended, the
interval is shared by time. So a request's energy is final at most an interval and
`SETTLE_WITHIN_S` after it ends, even beside one that streams for an hour.

When several gateway replicas send to one backend, each sees only its own requests: a reading
carries this replica's share of the backend's load, and only that share of the interval is
split among its requests, so the replicas together attribute the energy once.

Costs: a reading, an open and a close are O(1); splitting an interval is O(its requests), done
by `settling()` a request at a time, so that a caller can spread it over slices of its loop.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Energy of one prefilled prompt token relative to one decoded token. Prefill is compute-bound
# and batched over the whole prompt, decode is bandwidth-bound one token per step: on an H100
# serving an 8B model a prompt token costs ~0.01 J against ~0.1-2 J per decoded token.
PREFILL_TOKEN_WEIGHT = 0.05
# How long after an interval ends it waits for the requests still running in it.
SETTLE_WITHIN_S = 5.0
# Requests split between two of `settling()`'s pauses (None), where a caller may yield.
STEP = 64
# How much of the learned idle draw a second of higher quiet draw keeps (it rises 1 % a second).
IDLE_KEPT_PER_S = 0.99


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
    forgotten: bool = False
    tag: Any = None  # what the caller attaches to the request, for when it is final

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
    """Energy a backend's counter measured between two readings, this replica's share of it,
    and the requests that opened in it."""

    t0: float
    t1: float
    energy_j: float
    share: float = 1.0
    opened: list[Span] = field(default_factory=list)


class BackendLedger:
    """Attribute one backend's measured energy to the requests it served."""

    def __init__(self, idle_w: float, settle_within_s: float = SETTLE_WITHIN_S):
        self.idle_w = idle_w
        self.settle_within_s = settle_within_s
        self._idle_measured = False
        self._reading: tuple[float, float, float] | None = None
        self._intervals: deque[Interval] = deque()
        self._spans: dict[str, Span] = {}  # every span whose energy is not final yet
        self._open: dict[str, Span] = {}  # those still running, oldest first
        self._opened: list[Span] = []  # opened since the last reading
        self._carried: list[Span] = []  # running at the start of the next interval to split
        self._touched = False  # a request started or ended since the last reading
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
                interval = Interval(t0, t, counter_j - c0, (share0 + share) / 2, self._opened)
                self._opened = []
                self._intervals.append(interval)
                self.power_w = (counter_j - c0) / (t - t0)
                if not self._open and not self._touched:
                    self._idle_floor(self.power_w, t - t0)
        self._touched = False
        self._reading = (t, counter_j, share)
        self.measured_until = t
        return interval

    def restart(self) -> None:
        """Forget the last reading: the device was switched off since (parked), and what it
        drew then is neither its idle draw nor any request's; the next reading starts anew."""
        self._reading = None

    def _idle_floor(self, measured: float, seconds: float) -> None:
        # With nothing running, the draw is the idle power: learn it, so the nominal figure
        # only matters until the device has been seen idle once.
        if not self._idle_measured or measured < self.idle_w:
            self.idle_w = measured
        else:
            # Rise slowly, 1 % a second, however often the counter is read: work this gateway
            # cannot see (another replica's) must not pass for idle draw.
            self.idle_w += (1.0 - IDLE_KEPT_PER_S**seconds) * (measured - self.idle_w)
        self._idle_measured = True

    def open(self, key: str, start: float) -> None:
        """Start attributing energy to a request that began at start."""
        span = Span(key, start)
        self._spans[key] = self._open[key] = span
        self._opened.append(span)
        self._touched = True

    def close(
        self,
        key: str,
        end: float,
        prompt_tokens: int,
        completion_tokens: int,
        first_token: float | None = None,
        tag: Any = None,
    ) -> None:
        """Record how a request ended and the work it did, and what to attach to it."""
        span = self._spans[key]
        span.end = max(end, span.start)
        span.prompt_tokens = prompt_tokens
        span.completion_tokens = completion_tokens
        span.first_token = first_token
        span.tag = tag
        self._open.pop(key, None)
        self._touched = True

    def settle(self) -> list[Span]:
        """Split every interval that is due; return the spans now final."""
        return [span for span in self.settling() if span is not None]

    def settling(self) -> Iterator[Span | None]:
        """Split every interval that is due, oldest first, yielding each span as it becomes
        final and None every `STEP` requests, where the caller may pause.

        The ledger may change while the caller pauses: the interval being split keeps what it
        read of each span, and anything newer waits for the next interval.
        """
        while self._intervals and self._due(self._intervals[0]):
            interval = self._intervals.popleft()
            yield from self._split(interval, self._carried + interval.opened)

    def _due(self, interval: Interval) -> bool:
        oldest = next(iter(self._open.values()), None)
        # To the microsecond: readings meant to be the bound apart differ in a float's last bits.
        waited = round(self.measured_until - interval.t1, 6)
        return oldest is None or oldest.start >= interval.t1 or waited >= self.settle_within_s

    def _split(self, interval: Interval, spans: list[Span]) -> Iterator[Span | None]:
        t0, t1 = interval.t0, interval.t1
        # One pass reads each span once: its time in the interval, and its work if it ended.
        present: list[tuple[Span, float, float, float | None]] = []
        carried: list[Span] = []
        ended_work = ended_time = 0.0
        busy, reach, in_order = 0.0, -math.inf, True
        for n, span in enumerate(spans, 1):
            if n % STEP == 0:
                yield None
            if span.forgotten:
                continue
            end = span.end
            if end is None or end > t1:
                carried.append(span)
            a, b = max(span.start, t0), min(t1 if end is None else end, t1)
            if not (b > a or (span.start == end and t0 <= end < t1)):
                continue
            work = None if end is None else span.work(t0, t1)
            if work is not None:
                ended_work += work
                ended_time += b - a
            present.append((span, a, b, work))
            # Spans come in the order they opened, so their starts in the interval rise and
            # the time something ran is one sweep; a start told out of order needs a sort.
            in_order = in_order and (len(present) == 1 or a >= present[-2][1])
            if b > reach:
                busy += b - max(a, reach)
                reach = b
        if not in_order:
            busy = _union([(a, b) for _, a, b, _ in present])
        self._carried = carried
        if present:
            # A request still running goes at the pace of those that ended (see the docstring).
            rate = ended_work / ended_time if ended_time > 0 else 0.0
            works = [(b - a) * rate if work is None else work for _, a, b, work in present]
            total_work = math.fsum(works)
            total_time = sum(b - a for _, a, b, _ in present)
            idle_total = min(self.idle_w * (t1 - t0), interval.energy_j)
            dynamic_j = (interval.energy_j - idle_total) * interval.share
            # Idle draw and device time are paid only while something runs; a device idling
            # between requests is the fleet's cost, not theirs.
            idle_j = idle_total * busy / (t1 - t0) * interval.share
            for n, ((span, a, b, _), work) in enumerate(zip(present, works, strict=True), 1):
                if n % STEP == 0:
                    yield None
                time_share = (b - a) / total_time if total_time > 0 else 1 / len(present)
                work_share = work / total_work if total_work > 0 else time_share
                span.energy_j += dynamic_j * work_share + idle_j * time_share
                span.device_s += busy * time_share
        carrying = {id(span) for span in carried}
        for n, span in enumerate(spans, 1):
            if n % STEP == 0:
                yield None
            if not span.forgotten and id(span) not in carrying:
                del self._spans[span.key]
                yield span

    def __contains__(self, key: str) -> bool:
        return key in self._spans

    def forget(self, key: str) -> Span | None:
        """Stop tracking a request whose energy cannot be measured; return its span."""
        span = self._spans.pop(key, None)
        if span is not None:
            span.forgotten = True
            self._open.pop(key, None)
            self._touched = True
        return span

    def pending(self) -> list[Span]:
        """Return the spans still waiting for their energy."""
        return list(self._spans.values())
