"""Hardware profiles: the figures that make a simulated device a GPU, an ASIC or a CIM part.

A profile is data (a YAML file in `simulator/profiles/`, or any path), validated into
typed models. A new kind of chip is a new file, not new code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import ProfileError

PROFILES_DIR = Path(__file__).parent / "profiles"


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Figures):
    """A model a device serves, and how much it costs relative to the 8B reference."""

    name: str = Field(min_length=1)
    kind: Literal["chat", "embedding"]
    cost_scale: float = Field(gt=0)
    dimensions: int | None = Field(default=None, gt=0)
    max_context: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _embedding_has_dimensions(self) -> ModelSpec:
        if self.kind == "embedding" and self.dimensions is None:
            raise ValueError(f"embedding model '{self.name}' needs 'dimensions'")
        return self


class Timing(_Figures):
    """Prefill and decode costs of the 8B reference model, in simulated time.

    Beside the fixed and per-token costs: attention's prefill work grows with the square of the
    prompt (`prefill_attention_ns` per token²), and every decode step reads the KV cache of
    every sequence in the batch, `kv_read_ns` per context token past the first
    `kv_fast_tokens` (what on-chip memory holds at no extra cost). A step computes at most
    `max_batched_tokens` tokens, one for each sequence decoding and the rest in prompt chunks
    (vLLM's `--max-num-batched-tokens`; simulator/device.py).
    """

    prefill_fixed_ms: float = Field(ge=0)
    prefill_per_token_us: float = Field(ge=0)
    host_transfer_per_token_us: float = Field(default=0.0, ge=0)
    prefill_attention_ns: float = Field(default=0.0, ge=0)
    decode_fixed_ms: float = Field(gt=0)
    decode_per_seq_ms: float = Field(ge=0)
    kv_read_ns: float = Field(default=0.0, ge=0)
    kv_fast_tokens: int = Field(default=0, ge=0)
    max_batched_tokens: int = Field(default=8192, gt=0)


class PrefixCacheFigures(_Figures):
    """The cache of computed prompt prefixes a device keeps (simulator/prefix_cache.py).

    `capacity_tokens` of blocks stay in device memory (0 turns the cache off); blocks it evicts
    drop to `host_tokens` of host memory, whence a hit loads them back at
    `host_transfer_per_token_us` a token instead of computing their prefill again.
    """

    block_tokens: int = Field(default=16, gt=0)
    capacity_tokens: int = Field(default=0, ge=0)
    host_tokens: int = Field(default=0, ge=0)
    host_transfer_per_token_us: float = Field(default=0.0, ge=0)

    @property
    def enabled(self) -> bool:
        """Say whether the cache can hold a block at all."""
        return self.capacity_tokens > 0 or self.host_tokens > 0


class PowerFigures(_Figures):
    """Board power at idle, at batch 1 and at its maximum (reached at `max_at_batch`)."""

    idle_w: float = Field(ge=0)
    batch1_w: float
    max_w: float
    max_at_batch: int = Field(gt=1)

    @model_validator(mode="after")
    def _ordered(self) -> PowerFigures:
        if not self.idle_w < self.batch1_w < self.max_w:
            raise ValueError(
                f"power figures must rise: idle_w ({self.idle_w}) < batch1_w ({self.batch1_w})"
                f" < max_w ({self.max_w})"
            )
        return self


class ParkingFigures(_Figures):
    """What a device draws switched off by the gateway, and how long it takes to serve again.

    Asleep, `parked_w` is the board's draw with its engine asleep or stopped, at most its idle
    draw (None: its idle draw, no saving known), and `wake_s` the time from the wake-up call to
    its first request. Released (its node powered down, its instance given back), it draws
    nothing, and `released_wake_s` is the time to have it back: the node or instance started,
    the engine started and the model's weights loaded (None: it cannot be released). While it
    wakes either way it draws its idle power.
    """

    parked_w: float | None = Field(default=None, ge=0)
    wake_s: float = Field(default=0.0, ge=0)
    released_wake_s: float | None = Field(default=None, ge=0)


class Precision(_Figures):
    """How the device's numerics move its answers from the noiseless reference.

    `logit_noise` is the standard deviation, in logits, that its arithmetic adds where two
    tokens compete (simulator/precision.py); `drift` the KL per token, in nats, by which its
    distribution at every position moves from the reference's at the median answer (what the
    judge's benign rule reads); `harmful_rate` the share of answers with a wrong fact or field;
    `embedding_noise` the error of each embedding component, relative to its size.
    """

    logit_noise: float = Field(ge=0)
    drift: float = Field(default=0.0, ge=0)
    harmful_rate: float = Field(default=0.0, ge=0, le=1)
    embedding_noise: float = Field(default=0.0, ge=0)


class Profile(_Figures):
    """Everything that distinguishes one kind of device from another."""

    name: str = Field(min_length=1)
    hardware: str
    device_label_prefix: str = "sim"
    slots: int = Field(gt=0)
    max_context: int = Field(gt=0)
    # Tokens of KV cache per device; a request reserves its prompt and output while it runs.
    kv_cache_tokens: int = Field(default=262144, gt=0)
    timing: Timing
    prefix_cache: PrefixCacheFigures = PrefixCacheFigures()
    power: PowerFigures
    parking: ParkingFigures = ParkingFigures()
    precision: Precision
    models: tuple[ModelSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_models(self) -> Profile:
        names = [model.name for model in self.models]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"models listed twice: {', '.join(duplicates)}")
        return self

    def model(self, name: str) -> ModelSpec | None:
        """Return the served model called `name`, or None."""
        for model in self.models:
            if model.name == name:
                return model
        return None


def bundled_profiles() -> list[str]:
    """List the names of the profiles shipped with the simulator."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a bundled profile by name, or a profile file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            bundled = ", ".join(bundled_profiles())
            raise ProfileError(
                f"profile '{name_or_path}' is not bundled (bundled: {bundled})"
                " and is not a path to a YAML file"
            )
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile file {path} is not valid YAML: {exc}") from exc
    return _validate(raw, source=str(path))


def apply_overrides(
    profile: Profile,
    figures: Mapping[str, Any],
    models: Sequence[str] | None = None,
) -> Profile:
    """Return `profile` with figures replaced, keyed by dotted path (`timing.decode_fixed_ms`).

    `models` replaces the served models; each name is looked up in this profile, then in the
    bundled ones, so a device can be given any model the simulator knows.
    """
    data = profile.model_dump()
    for dotted, value in figures.items():
        section: dict[str, Any] = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            section = section[key]
        if leaf not in section:
            raise ProfileError(f"override '{dotted}' names no profile figure")
        section[leaf] = value
    if models is not None:
        data["models"] = [_known_model(name, profile).model_dump() for name in models]
    return _validate(data, source=f"profile '{profile.name}' with overrides")


def _known_model(name: str, profile: Profile) -> ModelSpec:
    catalog = [profile, *(load_profile(bundled) for bundled in bundled_profiles())]
    for candidate in catalog:
        spec = candidate.model(name)
        if spec is not None:
            return spec
    known = sorted({model.name for candidate in catalog for model in candidate.models})
    raise ProfileError(f"model '{name}' is not known (known models: {', '.join(known)})")


def _validate(raw: object, *, source: str) -> Profile:
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'profile'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ProfileError(f"{source} is not a valid profile: {problems}") from exc
