"""The simulator as the routing replay's hardware model (`gateway/whatif/hardware.py`).

Each backend of a replayed pool is a `Device` built from the bundled profile of the pool's kind,
so its timing, power and prefix cache are the simulator's, not the policy's nominal ones. A
request's prefix blocks, in whatever block size its trace hashed them (Mooncake's 512 tokens),
reach the device's cache as the blocks of its own size (16 tokens) they span: a trace block of k
of those is k blocks keyed by it and their place in it. It is registered
under the entry point group `shadow_gateway.hardware` as `simulator` (pyproject.toml); nothing
here imports the gateway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from simulator.device import Device, Job
from simulator.power import PowerCurve
from simulator.profile import ModelSpec, Profile, load_profile


@dataclass(frozen=True, slots=True)
class Marginal:
    """A device's figures for one more request as it is now, for the replay's oracle."""

    prefill_s: float
    cached_tokens: int
    prefill_work_s: float
    decoding: int
    step_s: float
    joined_step_s: float
    above_idle_w: float
    joined_above_idle_w: float


def model_spec(profile: Profile, model: str, params_b: float) -> ModelSpec:
    """Return a model's figures on a profile.

    A model the profile does not serve (a real fleet's names) costs what its size says against
    the 8B reference, as a chat model.
    """
    return profile.model(model) or ModelSpec(name=model, kind="chat", cost_scale=params_b / 8.0)


class SimulatedDevice:
    """A simulated device serving named models: what a replay submits to and reads."""

    def __init__(self, profile: Profile, models: Mapping[str, ModelSpec]):
        self.device = Device(
            0,
            profile.timing,
            profile.slots,
            PowerCurve(profile.power),
            prefix_cache=profile.prefix_cache,
            parking=profile.parking,
        )
        self.timing = profile.timing
        self.models = models

    @property
    def time(self) -> float:
        return self.device.time

    @property
    def energy_j(self) -> float:
        return self.device.energy_j

    @property
    def idle_energy_j(self) -> float:
        return self.device.idle_energy_j

    def submit(
        self,
        model: str,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        on_done: Callable[[], None],
        blocks: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> Job:
        """Queue a request at `now`, its prompt's prefix `blocks` of `block_tokens` each; call
        `on_done` once, when its last token is out."""

        def progress() -> None:
            if job.done:
                on_done()

        job = Job(
            self.models[model],
            prompt_tokens,
            output_tokens,
            blocks=self._cache_blocks(blocks, block_tokens),
            on_progress=progress,
        )
        self.device.submit(job, now)
        return job

    def _cache_blocks(self, blocks: Sequence[int], block_tokens: int) -> Sequence[int]:
        """Return a request's prefix blocks as the device's prefix cache keys them."""
        size = self.device.prefix_cache.block_tokens
        if not blocks or block_tokens == size:
            return blocks
        if block_tokens % size:
            raise ValueError(
                f"prefix blocks of {block_tokens} tokens do not split into the {size}-token"
                " blocks of the device's prefix cache"
            )
        per = block_tokens // size
        return [block * per + i for block in blocks for i in range(per)]

    def advance(self, now: float) -> None:
        """Process every event due by `now`, in order."""
        self.device.advance(now)

    def next_event_at(self) -> float | None:
        """Return the instant of the next event, or None when nothing is running."""
        return self.device.next_event_at()

    def set_condition(self, slow_factor: float, power_factor: float, now: float) -> None:
        """From `now`, take `slow_factor` times as long and draw `power_factor` times the power."""
        self.device.set_condition(slow_factor, power_factor, now)

    def park(self, now: float, release: bool = False) -> None:
        """Switch the device off from `now`, asleep or released; it holds no request."""
        self.device.park(now, release)

    def wake(self, now: float) -> float:
        """Switch the device on from `now`; return the instant it can serve."""
        return self.device.wake(now)

    def marginal(
        self,
        model: str,
        prompt_tokens: int,
        context_tokens: int,
        blocks: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> Marginal:
        """Return the figures of one more request whose decoding reads `context_tokens`, its
        prompt's prefix `blocks` looked up in the prefix cache, by the device's own formulas
        (simulator/device.py) under its condition now."""
        device, timing = self.device, self.timing
        slow, scale = device.slow_factor, self.models[model].cost_scale
        prefill, cached = device.prefill(
            self.models[model], prompt_tokens, self._cache_blocks(blocks, block_tokens)
        )

        def step(sequences: int, tokens: int) -> float:
            work = timing.decode_fixed_ms / 1e3
            work += timing.decode_per_seq_ms / 1e3 * max(sequences - 1, 0)
            work += timing.kv_read_ns / 1e9 * max(0, tokens - timing.kv_fast_tokens)
            return slow * scale * work

        def above_idle(active: int) -> float:
            return (device.power.watts(active) - device.power.idle_w) * device.power_factor

        decoding, context = device.decoding, device.context_tokens()
        return Marginal(
            prefill_s=prefill,
            cached_tokens=cached,
            prefill_work_s=device.prefill_work(self.models[model], prompt_tokens, cached),
            decoding=decoding,
            step_s=step(decoding, context),
            joined_step_s=step(decoding + 1, context + context_tokens),
            above_idle_w=above_idle(device.active),
            joined_above_idle_w=above_idle(device.active + 1),
        )


class SimulatorHardware:
    """The simulator's devices: each pool kind's bundled profile (gpu, asic, cim)."""

    def __init__(self) -> None:
        self._profiles: dict[str, Profile] = {}

    def device(self, kind: str, models: Mapping[str, float]) -> SimulatedDevice:
        """Return a fresh idle device of a kind's bundled profile serving `models`, each with its
        size in billions of parameters."""
        if kind not in self._profiles:
            self._profiles[kind] = load_profile(kind)
        profile = self._profiles[kind]
        return SimulatedDevice(
            profile, {name: model_spec(profile, name, size) for name, size in models.items()}
        )
