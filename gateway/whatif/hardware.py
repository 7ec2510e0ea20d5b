"""What a replay asks of a hardware model: devices that keep the truth on a virtual clock.

A hardware model builds one device per backend of the replayed fleet, for its pool's kind (gpu,
asic, cim). The replay submits requests to it by model name, advances it from event to event,
applies the factors its conditions set (`gateway.whatif.conditions`) and reads its energy
counters; the routing benchmark's oracle reads its marginal figures for one more request and
prices them itself (`lab.oracle`). A request carries its prompt's prefix blocks where its trace
has them (chained ids, `block_tokens` each): the device's own prefix cache decides how much of
its prefill they spare.

The gateway never imports a hardware model: one registers itself under the entry point group
`shadow_gateway.hardware`, and `load_hardware` finds it by name. The simulator's, `simulator`, is
the default (`simulator/hardware.py`, registered in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Protocol, cast

GROUP = "shadow_gateway.hardware"
DEFAULT = "simulator"


class HardwareError(ValueError):
    """No hardware model is registered under the name asked for."""


class Job(Protocol):
    """One request on a device, as the replay reads it back (instants on the virtual clock)."""

    @property
    def admitted_at(self) -> float | None: ...

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def finished_at(self) -> float | None: ...

    @property
    def done(self) -> bool: ...

    @property
    def cached_tokens(self) -> int:
        """The prompt tokens the device's prefix cache held when the request was admitted."""
        ...


class Marginal(Protocol):
    """A device's figures for one more request as it is now, under the factors in force."""

    @property
    def prefill_s(self) -> float:
        """The wait for the request's first token: the running step, the prompts admitted
        before it, then its own prefill, in chunks beside the sequences decoding now."""
        ...

    @property
    def prefill_work_s(self) -> float:
        """The compute its prefill adds to the steps that carry it, which every sequence
        decoding beside it waits through."""
        ...

    @property
    def cached_tokens(self) -> int:
        """The prompt tokens its prefix cache holds now, which that prefill skips."""
        ...

    @property
    def decoding(self) -> int:
        """The sequences decoding now."""
        ...

    @property
    def step_s(self) -> float:
        """A decode step of the sequences decoding now, at the request's model's cost."""
        ...

    @property
    def joined_step_s(self) -> float:
        """A decode step once the request has joined them, its context added."""
        ...

    @property
    def above_idle_w(self) -> float:
        """The power above idle with the requests holding a slot now."""
        ...

    @property
    def joined_above_idle_w(self) -> float:
        """The power above idle with the request added."""
        ...


class Device(Protocol):
    """One backend's hardware: runs the requests submitted to it and meters its energy."""

    @property
    def time(self) -> float:
        """The instant it has been advanced to."""
        ...

    @property
    def energy_j(self) -> float:
        """The energy it drew so far."""
        ...

    @property
    def idle_energy_j(self) -> float:
        """What it would have drawn idle over the same time."""
        ...

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
        ...

    def advance(self, now: float) -> None:
        """Process every event due by `now`, in order."""
        ...

    def next_event_at(self) -> float | None:
        """Return the instant of the next event, or None when nothing is running."""
        ...

    def set_condition(self, slow_factor: float, power_factor: float, now: float) -> None:
        """From `now`, take `slow_factor` times as long and draw `power_factor` times the power."""
        ...

    def park(self, now: float, release: bool = False) -> None:
        """Switch the device off from `now` (it holds no request): asleep it draws its parked
        power; released (its node powered down, its instance given back) nothing, and its
        wake-up is a start from cold."""
        ...

    def wake(self, now: float) -> float:
        """Switch the device on from `now`; return the instant it can take a request."""
        ...

    def marginal(
        self,
        model: str,
        prompt_tokens: int,
        context_tokens: int,
        blocks: Sequence[int] = (),
        block_tokens: int = 0,
    ) -> Marginal:
        """Return the figures of one more request whose decoding reads `context_tokens`, its
        prompt's prefix `blocks` looked up in the device's prefix cache."""
        ...


class Hardware(Protocol):
    """A hardware model: the devices a replay runs on, and what each model costs on them."""

    def device(self, kind: str, models: Mapping[str, float]) -> Device:
        """Return a fresh idle device of a pool's kind serving `models`, each with its size in
        billions of parameters (the policy's, for a model the hardware model does not know)."""
        ...


def load_hardware(name: str = DEFAULT) -> Hardware:
    """Return the hardware model registered under `name` in the entry point group."""
    found = entry_points(group=GROUP)
    if name not in found.names:
        names = ", ".join(sorted(found.names)) or "none"
        raise HardwareError(
            f"no hardware model {name!r} in entry point group {GROUP!r} (found: {names})"
        )
    return cast(Hardware, found[name].load()())
