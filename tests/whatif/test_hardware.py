"""The replay runs on any hardware model that keeps the interface, found by its entry point name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest

from gateway.policy.definition import Policy
from gateway.whatif.hardware import GROUP, HardwareError, load_hardware
from gateway.whatif.trace import TraceRequest
from lab.bench import benchmark
from lab.strategies import STRATEGIES

PREFILL_S = 0.05
STEP_S = 0.01
IDLE_W = 20.0
REQUEST_W = 40.0  # each running request draws this above idle


@dataclass(eq=False)
class ConstantJob:
    admitted_at: float
    first_token_at: float
    due_at: float
    finished_at: float | None = None
    done: bool = False
    cached_tokens: int = 0


@dataclass(frozen=True)
class ConstantMarginal:
    prefill_s: float
    cached_tokens: int
    prefill_work_s: float
    decoding: int
    step_s: float
    joined_step_s: float
    above_idle_w: float
    joined_above_idle_w: float


class ConstantDevice:
    """Every request takes PREFILL_S to its first token and STEP_S a token after it, whatever
    else runs, and draws REQUEST_W above idle while it runs."""

    def __init__(self) -> None:
        self.time = self.energy_j = self.idle_energy_j = 0.0
        self.slow = self.power = 1.0
        self.running: dict[ConstantJob, Callable[[], None]] = {}

    def submit(
        self,
        model: str,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        on_done: Callable[[], None],
        blocks: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> ConstantJob:
        self.advance(now)
        first = now + PREFILL_S * self.slow
        job = ConstantJob(now, first, first + STEP_S * self.slow * max(output_tokens - 1, 0))
        self.running[job] = on_done
        return job

    def next_event_at(self) -> float | None:
        return min((job.due_at for job in self.running), default=None)

    def advance(self, now: float) -> None:
        for job in sorted(self.running, key=lambda j: j.due_at):
            if job.due_at > now:
                break
            self._integrate(job.due_at)
            job.finished_at, job.done = job.due_at, True
            self.running.pop(job)()
        self._integrate(now)

    def _integrate(self, until: float) -> None:
        elapsed = max(until - self.time, 0.0)
        self.energy_j += (IDLE_W + REQUEST_W * len(self.running)) * self.power * elapsed
        self.idle_energy_j += IDLE_W * self.power * elapsed
        self.time = max(until, self.time)

    def set_condition(self, slow_factor: float, power_factor: float, now: float) -> None:
        self.advance(now)
        self.slow, self.power = slow_factor, power_factor

    def marginal(
        self,
        model: str,
        prompt_tokens: int,
        context_tokens: int,
        blocks: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> ConstantMarginal:
        n = len(self.running)
        return ConstantMarginal(
            PREFILL_S * self.slow,
            0,
            0.0,  # its prefill holds up nothing else
            n,
            STEP_S * self.slow,
            STEP_S * self.slow,
            REQUEST_W * n * self.power,
            REQUEST_W * (n + 1) * self.power,
        )


class ConstantHardware:
    def device(self, kind: str, models: Mapping[str, float]) -> ConstantDevice:
        return ConstantDevice()


def test_every_strategy_replays_on_a_hardware_model_written_elsewhere(
    policy: Policy, requests: list[TraceRequest]
) -> None:
    head = requests[:100]
    results = benchmark(policy, head, hardware=ConstantHardware())
    busy_s = sum(PREFILL_S + STEP_S * max(r.output_tokens - 1, 0) for r in head)
    for name in STRATEGIES:
        result = results[name]
        assert result["served"] == len(head), name
        # The figures are the constant device's: its latencies, its energy.
        assert result["ttft_p50_ms"] == PREFILL_S * 1e3, name
        assert result["tpot_p50_ms"] == STEP_S * 1e3, name
        assert result["energy_above_idle_j"] == pytest.approx(REQUEST_W * busy_s, abs=0.1), name


def test_an_unknown_hardware_model_names_the_group_and_the_registered_ones() -> None:
    with pytest.raises(HardwareError) as raised:
        load_hardware("fpga")
    assert str(raised.value) == (
        f"no hardware model 'fpga' in entry point group {GROUP!r} (found: simulator)"
    )
