"""The scaled clock: simulated time runs `speed` times faster than the wall clock."""

from __future__ import annotations

import time
from collections.abc import Callable


class ScaledClock:
    """Map wall time to simulated seconds since start, `speed` simulated seconds per wall second.

    Every simulated duration is divided by `speed` on the wall clock, so tests can run a
    hundred times faster with the same relative behaviour.
    """

    def __init__(self, speed: float = 1.0, *, wall: Callable[[], float] = time.monotonic):
        if not speed > 0 or speed == float("inf"):
            raise ValueError(f"speed must be a positive finite number, got {speed}")
        self.speed = speed
        self._wall = wall
        self._start = wall()

    def now(self) -> float:
        """Return simulated seconds since the clock started."""
        return (self._wall() - self._start) * self.speed

    def wall_delay(self, simulated_at: float) -> float:
        """Return wall seconds from now until the simulated instant `simulated_at` (may be < 0)."""
        return simulated_at / self.speed - (self._wall() - self._start)
