"""Board power as a function of how many sequences a device is working on.

P(n) = idle                              for n = 0
P(n) = min(max, idle + k · n^alpha)      for n >= 1

with k = batch1 - idle, and alpha chosen so the curve reaches `max` at `max_at_batch`.
alpha < 1 makes the dynamic part grow sub-linearly: a busy device spends less energy per
token, as measured on real GPUs.
"""

from __future__ import annotations

import math

from simulator.profile import PowerFigures


class PowerCurve:
    """Board power in watts for a number of active sequences, fitted to a profile's figures."""

    def __init__(self, figures: PowerFigures):
        self.idle_w = figures.idle_w
        self.max_w = figures.max_w
        self.k = figures.batch1_w - figures.idle_w
        self.alpha = math.log((figures.max_w - figures.idle_w) / self.k) / math.log(
            figures.max_at_batch
        )

    def watts(self, active: int) -> float:
        """Return the board power with `active` sequences in flight."""
        if active <= 0:
            return self.idle_w
        return min(self.max_w, self.idle_w + self.k * active**self.alpha)
