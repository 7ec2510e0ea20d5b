"""The routing policy as typed models: pools, SLO classes, tenants, routes and promotion.

A policy names the pools (backends and capability matrix), the SLO classes, the tenants and the
routes. Each model validates its own fields, and unknown keys are errors; the rules that join
fields (a route naming a pool that exists) are `gateway/policy/consistency.py`, and reading YAML
into these models with located errors is `gateway/policy/load.py`.
"""

from __future__ import annotations

import hashlib
import re
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gateway.compare.measures import DEFAULT_COMPARATORS

PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
# A driver, engine or firmware version: a label of the backend's metrics, so short and printable.
Version = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]( ?[\x21-\x7e])*$")
]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The only variables a policy may take an upstream key from (gateway/policy/credentials.py).
KEY_PREFIX = "GATEWAY_UPSTREAM_KEY_"


class Strict(BaseModel):
    """Base for policy models: unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Backend(Strict):
    """One OpenAI-compatible server inside a pool."""

    name: str = ""
    url: str
    metrics_url: str | None = Field(
        default=None,
        description="Prometheus endpoint with the DCGM power series; default URL/metrics.",
    )
    engine_metrics_url: str | None = Field(
        default=None,
        description="Prometheus endpoint with the serving engine's load series (its pool's "
        "`engine`); default URL/metrics, where vLLM, SGLang, TGI and llama.cpp serve them.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the key sent upstream as Authorization: "
        f"Bearer, named {KEY_PREFIX}...; the policy names the variable, never the key.",
    )
    kv_events: str | None = Field(
        default=None,
        description="Where the backend's engine publishes its KV-cache events (vLLM's "
        "--kv-events-config `endpoint`, e.g. tcp://10.0.0.5:5557): the gateway subscribes and "
        "routes on what the engine holds. null: the gateway's own estimate.",
    )
    kv_events_replay: str | None = Field(
        default=None,
        description="The engine's replay socket (`replay_endpoint`, e.g. tcp://10.0.0.5:5558), "
        "which resends the events a subscriber missed. null: a gap is not recovered.",
    )

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(tcp://[^\s*]+:\d+|ipc://\S+)", value):
            raise ValueError(
                "a KV-event endpoint is tcp://HOST:PORT or ipc://PATH, where the gateway "
                f"connects (no '*'), got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _replay_of_a_publisher(self) -> Backend:
        if self.kv_events_replay is not None and self.kv_events is None:
            raise ValueError("kv_events_replay needs kv_events: it replays what that publishes")
        return self

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _variable_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            # Never quote the value: an operator who pasted the key itself must not see it logged.
            raise ValueError(
                "api_key_env names an environment variable (letters, digits and underscores, "
                "not starting with a digit) that holds the key, not the key itself"
            )
        if value is not None and not value.startswith(KEY_PREFIX):
            raise ValueError(
                f"api_key_env may name only a variable starting with {KEY_PREFIX}, got {value!r}: "
                "a policy must not send the gateway's other secrets (DATABASE_URL, the admin "
                "token) to a backend"
            )
        return value


class PowerFigures(Strict):
    """Nominal power draw of one backend, as the vendor declares it."""

    idle_w: NonNegativeFloat
    max_w: PositiveFloat


class Price(Strict):
    """What one backend costs to run: its hourly price, and its electricity's price and carbon
    where no tariff window of the pool's `tariff` is in force."""

    usd_per_hour: NonNegativeFloat = 0.0
    usd_per_kwh: NonNegativeFloat = 0.0
    g_co2_per_kwh: NonNegativeFloat = Field(
        default=0.0, description="Carbon intensity of the electricity, in grams of CO2 per kWh."
    )


CLOCK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$|^24:00$")


class TariffWindow(Strict):
    """A time of day (UTC) when a site's electricity has its own price and carbon intensity."""

    start: str = Field(description="HH:MM, UTC.")
    end: str = Field(description="HH:MM, UTC, after start; 24:00 is midnight at the end.")
    usd_per_kwh: NonNegativeFloat
    g_co2_per_kwh: NonNegativeFloat

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not CLOCK.match(value):
            raise ValueError(f"a time of day is HH:MM (00:00 to 24:00), got {value!r}")
        return value

    def seconds(self) -> tuple[int, int]:
        """Return the window as seconds after midnight, UTC: [start, end)."""
        return _seconds(self.start), _seconds(self.end)


def _seconds(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60


class PowerMetrics(Strict):
    """Where a pool's backends report energy: Prometheus metric names (DCGM's by default)."""

    energy_counter: str = Field(
        default="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        description="Cumulative energy in millijoules, one series per device.",
    )
    power_gauge: str = Field(
        default="DCGM_FI_DEV_POWER_USAGE", description="Instantaneous draw in watts."
    )


class GoLive(Strict):
    """The precision check a shadow-only pool must have passed to serve clients."""

    suite: str = Field(
        default="chat.jsonl",
        min_length=1,
        description="File name of the suite the passing check replayed (its folder aside).",
    )
    suite_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The suite's exact content: the SHA-256 of its file, as the check records it.",
    )
    reference: str | None = Field(
        default=None,
        description="The pool the passing check compared against; null: any live gpu pool.",
    )
    unlabelled: str | None = Field(
        default=None,
        min_length=1,
        description="Why the pool's models have no labelled suite: a check then counts on a"
        " suite without labelled questions, which judges meaning alone. null: the suite needs"
        " a labelled part (questions with their right answers, `expected`).",
    )


# What a parking command may name of the backend it switches: `{name}`, `{url}`, `{pool}`.
HOOK_FIELDS = ("name", "url", "pool")


class PoolParking(Strict):
    """Switching a pool's idle backends off and on again (docs/routing.md#parking).

    `vllm` sends vLLM's sleep mode calls to the backend itself (POST /sleep?level=1, POST
    /wake_up, GET /is_sleeping); `command` runs the operator's argv for each, with the backend's
    `{name}`, `{url}` and `{pool}` put in (a power cap, a scale to zero, a process stopped and
    started again). `mode` says what a parked device costs: `sleep`, its parked draw and its
    hours; `release`, nothing (its node powered down, its instance given back), for a wake-up
    that starts it from cold.
    """

    hook: Literal["vllm", "command"] = Field(
        description="vllm: the backend's sleep and wake-up endpoints; command: park_command and "
        "wake_command."
    )
    park_command: list[str] | None = Field(
        default=None,
        description="With hook: command, the argv that switches a drained backend off "
        "({name}, {url}, {pool} are put in); exit 0 is success.",
    )
    wake_command: list[str] | None = Field(
        default=None,
        description="With hook: command, the argv that switches it on again; it serves once its "
        "/health answers 200.",
    )
    mode: Literal["sleep", "release"] = Field(
        default="sleep",
        description="sleep: a parked backend stays the operator's, asleep or stopped (it draws "
        "its parked power, its hours are paid); release: its node is powered down or its "
        "instance given back (nothing drawn or paid), and waking it starts one from cold.",
    )
    wake_s: NonNegativeFloat = Field(
        description="Seconds from the wake-up call to the first request served: the plan wakes "
        "a backend this far ahead of the load it forecasts (released, it also keeps it parked "
        "no sooner than this after it was last needed)."
    )
    min_active: int = Field(
        default=1,
        ge=1,
        description="Backends of the pool always on (at least 1; the fleet's last GPU backend "
        "is never parked either).",
    )
    hook_timeout_s: PositiveFloat = Field(
        default=30.0,
        description="Longest a hook call may take; past it the call has failed (a backend being "
        "parked stays in service, one being woken is called again).",
    )

    @field_validator("park_command", "wake_command")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value or not value[0].strip():
            raise ValueError("a command is a non-empty list: the program, then its arguments")
        for arg in value:
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(arg)]
            except ValueError as exc:
                raise ValueError(f"{arg!r} is not a valid command argument: {exc}") from None
            for field_name in fields:
                if field_name is not None and field_name not in HOOK_FIELDS:
                    known = ", ".join("{" + f + "}" for f in HOOK_FIELDS)
                    raise ValueError(
                        f"a command may name {known}, not {{{field_name}}} (in {arg!r})"
                    )
        return value

    @model_validator(mode="after")
    def _commands_match_hook(self) -> PoolParking:
        commands = {"park_command": self.park_command, "wake_command": self.wake_command}
        if self.hook == "command":
            missing = [name for name, argv in commands.items() if argv is None]
            if missing:
                raise ValueError(f"hook: command needs {' and '.join(missing)}")
        else:
            given = [name for name, argv in commands.items() if argv is not None]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} for hook: "
                    "command; hook: vllm calls the backend's own /sleep and /wake_up"
                )
            if self.mode == "release":
                raise ValueError(
                    "mode: release gives the device back, which vLLM's sleep mode does not (its "
                    "engine and node stay up): use hook: command with commands that power the "
                    "node down or release the instance"
                )
        if self.wake_s > self.hook_timeout_s:
            raise ValueError(
                f"wake_s is {self.wake_s:g} s, longer than hook_timeout_s ({self.hook_timeout_s:g}"
                " s): a woken backend would be taken for failed before it could serve; raise "
                "hook_timeout_s"
            )
        return self

    def command(self, action: str, name: str, url: str, pool: str) -> list[str]:
        """Return the argv of `action` ("park" or "wake") for one backend."""
        argv = self.park_command if action == "park" else self.wake_command
        assert argv is not None, "only a command hook has commands"
        return [arg.format(name=name, url=url, pool=pool) for arg in argv]


def engine_version_of(runtime: str, engine: object) -> str | None:
    """Return the engine version a former `runtime` string gives ('vllm 0.6.3' of a vllm pool:
    '0.6.3'): what follows the engine's name when it starts with it, else the whole string
    (which names an engine the pool's `engine` does not); None when it is the name alone."""
    name, _, rest = runtime.strip().partition(" ")
    if isinstance(engine, str) and re.sub(r"[^a-z0-9]", "", name.lower()) == engine:
        return rest.strip() or None
    return runtime.strip() or None


def retired_runtime(runtime: object, engine: object) -> str:
    """Say what a pool's former `runtime` is now, and what to write instead."""
    version = engine_version_of(str(runtime), engine)
    write = f"engine_version: '{version}'" if version is not None else "no engine_version"
    return (
        f"runtime ({runtime!r}) is retired: a pool's serving engine is `engine` and its version "
        f"`engine_version`; write {write} instead (docs/policy.md#versions)"
    )


class Pool(Strict):
    """A set of backends of one hardware kind sharing one capability entry."""

    kind: str = Field(description="Hardware kind, e.g. gpu, asic, cim.")
    backends: list[Backend] = Field(min_length=1)
    models: list[str] = Field(min_length=1)
    max_context: int = Field(gt=0, description="Longest prompt plus output, in tokens.")
    memory_gb: PositiveFloat = Field(
        description="Memory of one backend, in GB: its models' weights, its KV cache and 10% "
        "headroom must fit in it."
    )
    slots_per_backend: int = Field(gt=0, description="Concurrent requests one backend takes.")
    precision: str = "bf16"
    compute_tflops: PositiveFloat
    bandwidth_gbs: PositiveFloat
    power: PowerFigures
    price: Price = Price()
    power_metrics: PowerMetrics | None = Field(
        default=PowerMetrics(),
        description="null: the backends expose no power; energy is estimated from `power`.",
    )
    live: bool = Field(
        default=True, description="False marks a shadow-only pool: never serves clients."
    )
    go_live: GoLive = Field(
        default=GoLive(),
        description="The precision check that lets a shadow-only pool serve clients.",
    )
    queue_depth: int = Field(default=256, ge=0, description="Requests that may wait for a slot.")
    kv_cache_gb: PositiveFloat | None = Field(
        default=None,
        description="Memory of one backend for KV cache, after weights; default half of memory.",
    )
    prefix_cache_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Prompt tokens one backend keeps cached between requests, host-memory "
        "offload included (vLLM logs its KV cache's size in tokens): what the gateway's prefix "
        "index expects it to hold. null: what `kv_cache_gb` holds.",
    )
    driver: Version | None = Field(
        default=None, description="Driver version of the backends, e.g. '550.90.07'."
    )
    firmware: Version | None = Field(default=None, description="Firmware version of the devices.")
    tariff: str | None = Field(
        default=None,
        description="A schedule of the policy's `tariffs`: the price and carbon intensity of the "
        "pool's electricity by time of day (where it runs); outside its windows, `price`'s.",
    )
    engine: Literal["vllm", "sglang", "tgi", "triton", "llamacpp"] | None = Field(
        default=None,
        description="Serving engine of the backends, whose own load series (requests running "
        "and waiting, KV cache in use) the metering scrape reads: load other clients put on a "
        "shared backend takes its slots. With llamacpp, `max_context` is a slot's context "
        "(llama-server's -c / -np) and each choice of an answer is counted (its usage counts "
        "one). null: the gateway's own bookkeeping only.",
    )
    engine_version: Version | None = Field(
        default=None,
        description="Version of the serving engine, e.g. '0.6.3'. With engine null (one whose "
        "load series the gateway does not read), it names that engine too, e.g. "
        "'vendor-sdk 1.18'.",
    )
    parking: PoolParking | None = Field(
        default=None,
        description="Park the backends the forecast load does not need, through this hook. "
        "null: every backend stays on.",
    )

    @model_validator(mode="before")
    @classmethod
    def _runtime_is_engine_version(cls, data: Any) -> Any:
        """Read the former `runtime` as `engine_version`, as migration 0022 rewrites it, so a
        gateway serving a file that still has it starts; validation refuses it
        (gateway/policy/consistency.py `retired`), so no new version is stored with it."""
        if isinstance(data, dict) and "runtime" in data:
            runtime, engine = data["runtime"], data.get("engine")
            if "engine_version" in data:
                raise PydanticCustomError(
                    "renamed",
                    "{retired}; not both",
                    {"key": "runtime", "retired": retired_runtime(runtime, engine)},
                )
            data = {k: v for k, v in data.items() if k != "runtime"}
            data["engine_version"] = engine_version_of(str(runtime), engine)
        return data

    @field_validator("driver", "engine_version", "firmware", mode="before")
    @classmethod
    def _quoted(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            # YAML reads 1.10 as the number 1.1: a version written bare would lose its digits.
            raise ValueError(f"write a version as a quoted string, e.g. '{value}'")
        return value

    @model_validator(mode="after")
    def _parks_what_it_has(self) -> Pool:
        if self.parking is not None and self.parking.min_active > len(self.backends):
            raise ValueError(
                f"parking.min_active is {self.parking.min_active}, more than the pool's "
                f"{len(self.backends)} backends: it could never park one"
            )
        return self

    def versions(self) -> dict[str, str | None]:
        """Return the driver, engine and firmware versions the policy gives (None: not given)."""
        return {
            "driver": self.driver,
            "engine_version": self.engine_version,
            "firmware": self.firmware,
        }

    def kv_capacity_bytes(self) -> float:
        """Return the KV-cache memory of one backend, in bytes."""
        return (self.kv_cache_gb if self.kv_cache_gb is not None else self.memory_gb / 2) * 1e9


class SloClass(Strict):
    """Named latency targets, and how long a request of this class may wait or hang."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None
    max_queue_ms: NonNegativeFloat = Field(
        default=1000.0, description="Longest wait for a free slot before falling back."
    )
    timeout_s: PositiveFloat = Field(
        default=60.0, description="Upstream timeout for the first byte and between stream chunks."
    )
    deadline_s: PositiveFloat = Field(
        default=600.0,
        description="Longest an answer may take upstream in all, a stream included; past it, "
        "it is cut (a stream ends with an error event).",
    )


class TokenRange(Strict):
    """An inclusive range of prompt tokens."""

    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)

    def contains(self, tokens: int) -> bool:
        return tokens >= self.min and (self.max is None or tokens <= self.max)


class Match(Strict):
    """Which requests a route takes; an empty list matches anything."""

    models: list[str] = []
    prompt_tokens: TokenRange = TokenRange()
    slo_classes: list[str] = []
    tenants: list[str] = []


class ShadowMatch(Strict):
    """Which of a route's requests a shadow target copies; an empty list matches anything."""

    models: list[str] = []
    prompt_tokens: TokenRange = TokenRange()
    tenants: list[str] = []


class ShadowBudget(Strict):
    """The most load mirrored copies may put on a pool; past it a copy is dropped, never queued."""

    max_concurrent: int = Field(default=4, gt=0, description="Copies in flight at once.")
    max_per_second: PositiveFloat = Field(default=10.0, description="Copies sent per second.")
    max_slot_share: float = Field(
        default=0.25, gt=0, le=1, description="Share of the pool's slots copies may hold."
    )


class SemanticSimilarity(Strict):
    """Embed differing answers on the fleet's own embedding route and keep their similarity."""

    model: str = Field(min_length=1, description="An embedding model a live pool serves.")
    max_per_second: PositiveFloat = Field(
        default=5.0, description="Answer pairs embedded per second, at most."
    )
    max_concurrent: PositiveInt = Field(default=2, description="Embedding requests at once.")


class Comparison(Strict):
    """Which comparators measure a copy against the primary, and whether raw texts are kept."""

    comparators: list[str] = list(DEFAULT_COMPARATORS)
    logprobs: int = Field(
        default=5,
        ge=0,
        le=20,
        description="Top logprobs a copy asks for when the client asked none (0: none); the"
        " client's answer never changes.",
    )
    semantic_similarity: SemanticSimilarity | None = Field(
        default=None,
        description="Measure differing answers' semantic similarity with this embedding model.",
    )
    store_text: bool = Field(
        default=False, description="Keep both raw answers on the shadow record."
    )
    text_retention_h: PositiveFloat = Field(
        default=72.0, description="Hours after which stored texts are erased."
    )


class ShadowTarget(Strict):
    """A candidate pool that receives a sampled copy of a route's requests, only to compare."""

    pool: str
    sample_rate: float = Field(ge=0, le=1, description="Share of matching requests copied.")
    match: ShadowMatch = ShadowMatch()
    compare: Comparison = Comparison()
    budget: ShadowBudget = ShadowBudget()


# The share of a shadowed route's samples that also get a noise (A/A) copy when its policy
# names no noise floor.
DEFAULT_NOISE_SHARE = 0.25


class NoiseFloor(Strict):
    """A same-pool (A/A) sample: how much two answers of the primary's own pool disagree.

    The copy goes to another backend of the pool that served the primary; when no other one can
    take it (a single-backend pool, the others ejected or full), the backend that answered is
    asked again, which measures its own nondeterminism.
    """

    share: float = Field(
        ge=0,
        le=1,
        description="Share of the route's shadow samples also sent to the primary's own pool "
        "(another backend, else the same one again); 0 turns the noise floor off.",
    )
    compare: Comparison = Comparison()
    budget: ShadowBudget = ShadowBudget(max_concurrent=2, max_slot_share=0.1)


# A model whose size the policy does not give is assumed to be this big.
DEFAULT_PARAMS_B = 8.0
# KV-cache bytes per token per billion parameters: Llama-style grouped-query attention in bf16.
KV_BYTES_PER_TOKEN_PER_B = 16_384


class ModelSpec(Strict):
    """What routing needs to know about a model: its size and its KV cache per token."""

    params_b: PositiveFloat = Field(description="Parameters, in billions.")
    kind: Literal["chat", "embedding"] = "chat"
    paraphrase_similarity: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="An embedding model's: the similarity it gives an answer and a paraphrase "
        "of it (windowed, as shadow pairs are compared), measured on paraphrases of the fleet's "
        "answers. Where the judge's meaning tolerance starts (docs/promotion.md); null: 0.98.",
    )
    kv_bytes_per_token: PositiveFloat | None = Field(
        default=None, description="KV-cache bytes one token holds; default from params_b."
    )
    tokenizer: str | None = Field(
        default=None,
        description="Import path (module:Class) of the model's tokenizer as its engines render "
        "and tokenize prompts: the gateway keys prompts' prefix blocks by token, as engines' "
        "KV-cache events name them. Required for a model served by backends with `kv_events`. "
        "null: blocks of the prompt's text.",
    )

    @field_validator("tokenizer")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError(
                f"tokenizer is an import path module:Class, e.g. "
                f"simulator.schema:EngineTokenizer, got {value!r}"
            )
        return value


Objective = Literal["preference", "min_cost", "min_energy", "min_carbon", "min_latency"]


class Canary(Strict):
    """A pool being rolled out on a route: it serves `weight` of the route's requests first."""

    pool: str
    weight: float = Field(ge=0, le=1)


class Route(Strict):
    """A rule: the requests it matches, the pools allowed in preference order, and the fallback.

    `shadow` lists the candidate pools that get a sampled copy; the noise floor (`noise`)
    measures the primary pool against itself so the candidates' diffs can be judged against it.
    """

    name: str = Field(min_length=1)
    match: Match = Match()
    pools: list[str] = Field(min_length=1)
    fallback: str | None = None
    objective: Objective = Field(
        default="preference",
        description="preference: the pools' order; min_cost / min_energy / min_carbon / "
        "min_latency: the learned cost model picks, among pools predicted to meet the SLO.",
    )
    explore: float = Field(
        default=0.0,
        ge=0,
        le=0.5,
        description="Share of requests served by the runner-up pool, when two meet the SLO: a "
        "pool the model stopped choosing still sends it evidence, so one that recovers from a "
        "slowdown is chosen again.",
    )
    shadow: list[ShadowTarget] = []
    noise_floor: NoiseFloor | None = Field(
        default=None,
        description="The A/A sample. A route with shadow targets has one even when this is not "
        f"given: share {DEFAULT_NOISE_SHARE}, the default budget, compared as its first target; "
        "share 0 turns it off.",
    )
    canary: Canary | None = Field(
        default=None,
        description="A candidate being rolled out: it serves this share of the route first.",
    )

    @property
    def noise(self) -> NoiseFloor | None:
        """Return the noise floor the route samples, or None when it has none.

        A route that shadows something has one unless its policy turns it off (`share: 0`):
        the policy's `noise_floor`, or else DEFAULT_NOISE_SHARE of its samples, measured with
        its first target's comparison settings so the floor measures what the candidates do.
        """
        if self.noise_floor is not None:
            return self.noise_floor if self.noise_floor.share > 0 else None
        if not self.shadow:
            return None
        return NoiseFloor(share=DEFAULT_NOISE_SHARE, compare=self.shadow[0].compare)


# The judge's former margins on shares of departing answers, and what replaced them.
RENAMED_MARGINS = {
    "quality_margin": "departure_margin",
    "sampled_quality_margin": "sampled_departure_margin",
}


class Promotion(Strict):
    """When shadow evidence promotes a candidate pool (see docs/promotion.md)."""

    departure_margin: float = Field(
        default=0.0008,
        ge=0,
        le=1,
        description="Departures in meaning per word at risk that temperature-0 answers may"
        " make beyond the noise floor's.",
    )
    sampled_departure_margin: float = Field(
        default=0.0009,
        ge=0,
        le=1,
        description="The same for sampled answers (temperature > 0).",
    )
    slo_margin: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of the candidate's copies meeting their SLO class's targets may be"
        " this much below the share of the primary's answers that do.",
    )
    failure_margin: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of requests whose copy failed (an error, a timeout, a broken stream,"
        " a null, empty or cut-short answer) may be this much above the share whose primary's"
        " answer did.",
    )
    max_error_rate: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Share of a canary's requests that may fail in a rollout step (errors, and"
        " failed answers in its reverse shadow sample).",
    )
    alpha: float = Field(default=0.05, gt=0, lt=1, description="Chance of a false promotion.")
    min_samples: int = Field(default=500, ge=1)
    min_window_days: float = Field(default=7.0, ge=0)
    rollout_steps: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default=[0.05, 0.25, 0.5, 1.0], min_length=1, description="Canary weights, in order."
    )
    step_minutes: PositiveFloat = Field(
        default=60.0, description="Time at each weight before its guards are checked."
    )
    guard_min_slo_attainment: float = Field(
        default=0.99, ge=0, le=1, description="Share of the canary's requests meeting the SLO."
    )
    guard_min_agreement: float = Field(
        default=0.95,
        ge=0,
        le=1,
        description="Share of reverse-shadow pairs that do not depart in meaning.",
    )
    guard_min_requests: int = Field(
        default=20, ge=1, description="Canary requests a step needs before it can advance."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_share_margins(cls, data: Any) -> Any:
        """Refuse the former share margins: their numbers mean something else per word."""
        if isinstance(data, dict):
            for old, new in RENAMED_MARGINS.items():
                if old in data:
                    raise PydanticCustomError(
                        "renamed",
                        "promotion.{old} (a share of departing answers) is no longer read: the"
                        " judge holds departures per word at risk to promotion.{new}"
                        " (docs/promotion.md)",
                        {"old": old, "new": new},
                    )
        return data


class RateLimit(Strict):
    """How much a tenant may send, summed over every replica; each bursts to a minute's worth."""

    requests_per_minute: PositiveFloat | None = None
    tokens_per_minute: PositiveFloat | None = Field(
        default=None,
        description="Prompt tokens plus the output a request may generate (its max_tokens).",
    )

    def describe(self) -> str:
        parts = []
        if self.requests_per_minute is not None:
            parts.append(f"{self.requests_per_minute:g} requests a minute")
        if self.tokens_per_minute is not None:
            parts.append(f"{self.tokens_per_minute:g} tokens a minute")
        return ", ".join(parts) or "unlimited"


class Tenant(Strict):
    """A client identity, recognised by the SHA-256 of its API key (never the key itself)."""

    name: str = Field(min_length=1)
    api_key_sha256: list[str] = []
    default_slo_class: str | None = Field(
        default=None, description="The class of this tenant's requests without x-slo-class."
    )
    slo_classes: list[str] = Field(
        default=[], description="Classes this tenant may ask for with x-slo-class; empty: any."
    )
    slo_overrides: bool = Field(
        default=True, description="Whether x-slo-ttft-ms / x-slo-tpot-ms are honoured."
    )
    rate_limit: RateLimit | None = Field(
        default=None, description="Requests and tokens a minute; past them, 429 with Retry-After."
    )

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, values: list[str]) -> list[str]:
        for value in values:
            if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
                raise ValueError(
                    f"api_key_sha256 entries are 64 lowercase hex digits, got {value!r}"
                )
        return values


class Policy(Strict):
    """The whole routing policy."""

    pools: dict[str, Pool] = Field(min_length=1)
    slo_classes: dict[str, SloClass] = Field(min_length=1)
    default_slo_class: str
    routes: list[Route] = Field(min_length=1)
    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description="Model sizes for the cost model's prior and the memory check.",
    )
    tariffs: dict[str, list[TariffWindow]] = Field(
        default_factory=dict,
        description="Time-of-use schedules pools name in `tariff`: windows of the day (UTC) "
        "with their electricity's price and carbon intensity.",
    )
    promotion: Promotion = Promotion()
    tenants: list[Tenant] = []
    require_tenant_key: bool = Field(
        default=False, description="Refuse requests whose key is not a known tenant's."
    )
    assumed_max_tokens: int = Field(
        default=256,
        gt=0,
        description=(
            "The output limit a request naming no max_tokens is given: written into the"
            " forwarded body, reserved and charged."
        ),
    )

    def tenant_for_key(self, api_key: str) -> Tenant | None:
        """Return the tenant whose key this is, or None."""
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        for tenant in self.tenants:
            if digest in tenant.api_key_sha256:
                return tenant
        return None

    def params_b(self, model: str) -> float:
        """Return a model's size in billions of parameters (DEFAULT_PARAMS_B when unlisted)."""
        spec = self.models.get(model)
        return spec.params_b if spec is not None else DEFAULT_PARAMS_B

    def kv_bytes_per_token(self, model: str) -> float:
        """Return the KV-cache bytes one token of this model holds."""
        spec = self.models.get(model)
        if spec is not None and spec.kv_bytes_per_token is not None:
            return spec.kv_bytes_per_token
        return KV_BYTES_PER_TOKEN_PER_B * self.params_b(model)

    def served_models(self) -> list[str]:
        """Return the models that live pools serve, in first-seen order."""
        seen: dict[str, None] = {}
        for pool in self.pools.values():
            if pool.live:
                seen.update(dict.fromkeys(pool.models))
        return list(seen)
