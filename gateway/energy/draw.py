"""Draw: what each backend drew, idle included, and how long it was on and parked, per minute.

A pure core, fed by the power scraper (gateway/energy/meter.py) on the wall clock. It is the
fleet's side of energy, where gateway/energy/ledger.py is the requests' side: every joule a
backend's meter read counts, whether a request ran or not, so the weekly report and the console
can lead with the fleet's energy and device-hours (each `Minute` a row of `backend_energy`,
folded by gateway/report/numbers.py).

- A meter's interval between two readings counts whole, split over the minutes it spans by time.
- Time between two scrape rounds counts as parked when the backend was parked at the round's
  end, else as on (in service, draining, waking, or ejected: it is powered either way).
- Where no reading covers a span (a pool without a meter, scrapes failing, a counter reset,
  the first reading of a backend), an on backend is estimated at its pool's nominal idle draw,
  to which the meter adds the estimated energy above idle of the requests it ran then; a parked
  one drew nothing anyone read, and counts nothing, as parking's energy saved counts it.
  Estimates are kept apart (`estimated_j`), as a request record flags its own.

A minute is handed over once the clock has passed its end; a reading that arrives later for it
makes another row of the same minute, which sums with the first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

MINUTE_S = 60.0


@dataclass(frozen=True, slots=True)
class Seen:
    """A backend as a scrape round found it."""

    pool: str
    backend: str
    parked: bool
    idle_w: float
    # Where its meter's readings reach (the latest, on the wall clock); None with no meter to
    # wait for: the span up to the round is estimated.
    measured_until: float | None


@dataclass(slots=True)
class _Since:
    seen_at: float
    energy_until: float


Key = tuple[float, str, str]  # (minute, pool, backend)


@dataclass(frozen=True, slots=True)
class Minute:
    """A backend's draw and time in (part of) a minute: the columns of `backend_energy`."""

    ts: float
    pool: str
    backend: str
    on_s: float
    parked_s: float
    energy_j: float
    estimated_j: float


class FleetDraw:
    """Tally each backend's energy and time on and parked, per minute, until handed over."""

    def __init__(self, minute_s: float = MINUTE_S):
        self._minute_s = minute_s
        self._since: dict[tuple[str, str], _Since] = {}
        self._minutes: dict[Key, list[float]] = {}  # on_s, parked_s, energy_j, estimated_j

    def measured(self, pool: str, backend: str, t0: float, t1: float, energy_j: float) -> None:
        """Count what a meter read between two readings at t0 and t1."""
        for minute, part in self._spread(t0, t1):
            self._add(minute, pool, backend, 2, energy_j * part)
        since = self._since.get((pool, backend))
        if since is not None:
            since.energy_until = max(since.energy_until, t1)

    def estimated(self, pool: str, backend: str, at: float, energy_j: float) -> None:
        """Count energy estimated from nominal figures at `at` (a request's above idle)."""
        minute = self._minute(at)
        self._add(minute, pool, backend, 2, energy_j)
        self._add(minute, pool, backend, 3, energy_j)

    def round(self, t: float, backends: Iterable[Seen]) -> None:
        """Count each backend's time up to the round at `t`, and estimate what no reading
        covers."""
        for b in backends:
            since = self._since.get((b.pool, b.backend))
            if since is None:
                self._since[(b.pool, b.backend)] = _Since(t, t)
                continue
            if t > since.seen_at:
                for minute, part in self._spread(since.seen_at, t):
                    seconds = (t - since.seen_at) * part
                    self._add(minute, b.pool, b.backend, 1 if b.parked else 0, seconds)
                since.seen_at = t
            until = t if b.measured_until is None else b.measured_until
            if until > since.energy_until:
                if not b.parked:
                    for minute, part in self._spread(since.energy_until, until):
                        j = b.idle_w * (until - since.energy_until) * part
                        self._add(minute, b.pool, b.backend, 2, j)
                        self._add(minute, b.pool, b.backend, 3, j)
                since.energy_until = until

    def take(self, before: float = math.inf) -> list[Minute]:
        """Hand over every minute that ended by `before` (all of them, by default)."""
        done = [k for k in self._minutes if k[0] + self._minute_s <= before]
        rows = []
        for key in sorted(done):
            on_s, parked_s, energy_j, estimated_j = self._minutes.pop(key)
            rows.append(Minute(*key, on_s, parked_s, energy_j, estimated_j))
        return rows

    def _minute(self, t: float) -> float:
        return math.floor(t / self._minute_s) * self._minute_s

    def _spread(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """Return the minutes [t0, t1] spans, each with its share of the span."""
        if t1 <= t0:
            return [(self._minute(t0), 1.0)]
        parts, start = [], self._minute(t0)
        while start < t1:
            overlap = min(t1, start + self._minute_s) - max(t0, start)
            if overlap > 0:
                parts.append((start, overlap / (t1 - t0)))
            start += self._minute_s
        return parts

    def _add(self, minute: float, pool: str, backend: str, at: int, value: float) -> None:
        figures = self._minutes.get((minute, pool, backend))
        if figures is None:
            figures = self._minutes[(minute, pool, backend)] = [0.0, 0.0, 0.0, 0.0]
        figures[at] += value
