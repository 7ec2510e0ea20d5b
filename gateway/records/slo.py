"""SLO attainment: whether one finished request met its latency targets.

One definition for every place that counts it: the live metric (telemetry), the rollout guards
and the weekly report. A request meets its SLO when it succeeded and every target it has a
measure for holds. A target without a measure does not count against it: a request that was not
streamed has no time to first token, so only its end-to-end time can miss.
"""

from __future__ import annotations

from typing import Protocol


class Targets(Protocol):
    """Latency targets in milliseconds (None: no target), as an SLO class or a profile has them."""

    @property
    def ttft_ms(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float | None: ...

    @property
    def e2e_ms(self) -> float | None: ...


def meets_slo(
    targets: Targets | None,
    status: int,
    ttft_ms: float | None,
    tpot_ms: float | None,
    e2e_ms: float | None,
) -> bool:
    """Say whether a request succeeded within every target it has a measure for."""
    if status != 200:
        return False
    if targets is None:
        return True
    target = targets.ttft_ms
    if target is not None and ttft_ms is not None and ttft_ms > target:
        return False
    target = targets.tpot_ms
    if target is not None and tpot_ms is not None and tpot_ms > target:
        return False
    target = targets.e2e_ms
    return target is None or e2e_ms is None or e2e_ms <= target
