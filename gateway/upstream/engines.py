"""Serving engines' own load signals: requests running and waiting, KV-cache use, and the
prompt cache and generation speed of the engines that report them.

A backend shared with other clients, or behind a load balancer, carries load the gateway did
not send. The engines say how loaded they are in their Prometheus series, which the metrics
scrape (gateway/upstream/scrape.py) reads for a pool whose policy names its `engine`:

- vllm: `vllm:num_requests_running`, `vllm:num_requests_waiting`, and the KV cache in use
  (0-1) as `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` before 0.9; with prefix
  caching, the prompt tokens looked up in it and those found (`vllm:prefix_cache_queries_total`
  and `vllm:prefix_cache_hits_total`, `vllm:gpu_prefix_cache_*` before 0.10);
- sglang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`;
- tgi: `tgi_batch_current_size`, `tgi_queue_size` (TGI reports no KV-cache share);
- triton (TensorRT-LLM): `nv_trt_llm_request_metrics` with `request_type` `active` and
  `waiting`, and `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`;
- llamacpp (llama.cpp's `llama-server --metrics`): `llamacpp:requests_processing` and
  `llamacpp:requests_deferred` (requests waiting for a free slot); no KV-cache share. It also
  counts the prompt tokens it computed (`llamacpp:prompt_tokens_total`, which leaves out the
  cached ones) and those it took from its prompt cache (`llamacpp:prompt_tokens_cached_total`),
  and reports its generation speed (`llamacpp:predicted_tokens_seconds`: the tokens a second
  of each request's decoding, over the requests that finished since the last scrape, 0 when
  none did; every scrape of the endpoint starts a new window).

Request counts are summed over their series (one per model or engine); the KV-cache share,
a ratio, is the largest of its series. An engine that queues, or whose KV cache is nearly
full, takes no more requests: `full_reason` says so.

llama.cpp keeps one prompt per slot for the next request that starts like it, and says per slot
how long it is (`GET /slots`: `n_prompt_tokens`, once the slot has served): `slot_tokens` adds
them up, what the backend keeps of past prompts now, which bounds the gateway's estimate of it
(gateway/fleet/prefixes.py `bound`).

The cached share is of every prompt token since the engine started, a ratio of two counters:
llama.cpp prints its counters with six significant digits, so the difference of two scrapes is
lost in rounding once they pass a million, while their ratio keeps its precision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from gateway.fleet.engine_blocks import BLOCK_TOKENS
from gateway.fleet.state import BackendState, Fleet
from gateway.upstream import exposition

# Scrapes an engine may miss before its figures are dropped and the gateway's own count rules.
MISSES_BEFORE_FORGETTING = 3
SLOTS_PATH = "/slots"  # llama.cpp's slots, on the server's own port

# Past this share of its KV cache an engine preempts or queues what it is sent next.
KV_FULL = 0.95


@dataclass(frozen=True, slots=True)
class Series:
    """One metric, restricted to the samples whose labels include `where`."""

    name: str
    where: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """Where an engine reports its load; of each tuple, the first series present is read."""

    running: tuple[Series, ...]
    waiting: tuple[Series, ...]
    kv_usage: tuple[Series, ...] = ()
    prompt_computed: tuple[Series, ...] = ()  # prompt tokens computed, the cached left out
    prompt_cached: tuple[Series, ...] = ()  # prompt tokens taken from the prompt cache
    prompt_queried: tuple[Series, ...] = ()  # prompt tokens looked up, the cached among them
    tokens_per_s: tuple[Series, ...] = ()  # generation speed, 0 when not measured


ENGINES: dict[str, EngineSeries] = {
    "vllm": EngineSeries(
        running=(Series("vllm:num_requests_running"),),
        waiting=(Series("vllm:num_requests_waiting"),),
        kv_usage=(Series("vllm:kv_cache_usage_perc"), Series("vllm:gpu_cache_usage_perc")),
        prompt_cached=(
            Series("vllm:prefix_cache_hits_total"),
            Series("vllm:gpu_prefix_cache_hits_total"),
        ),
        prompt_queried=(
            Series("vllm:prefix_cache_queries_total"),
            Series("vllm:gpu_prefix_cache_queries_total"),
        ),
    ),
    "sglang": EngineSeries(
        running=(Series("sglang:num_running_reqs"),),
        waiting=(Series("sglang:num_queue_reqs"),),
        kv_usage=(Series("sglang:token_usage"),),
    ),
    "tgi": EngineSeries(
        running=(Series("tgi_batch_current_size"),),
        waiting=(Series("tgi_queue_size"),),
    ),
    "triton": EngineSeries(
        running=(Series("nv_trt_llm_request_metrics", {"request_type": "active"}),),
        waiting=(Series("nv_trt_llm_request_metrics", {"request_type": "waiting"}),),
        kv_usage=(
            Series("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
        ),
    ),
    "llamacpp": EngineSeries(
        running=(Series("llamacpp:requests_processing"),),
        waiting=(Series("llamacpp:requests_deferred"),),
        prompt_computed=(Series("llamacpp:prompt_tokens_total"),),
        prompt_cached=(Series("llamacpp:prompt_tokens_cached_total"),),
        tokens_per_s=(Series("llamacpp:predicted_tokens_seconds"),),
    ),
}


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reported in one scrape."""

    running: int
    waiting: int
    kv_usage: float | None = None  # share of its KV cache in use, when it reports one
    cached_share: float | None = None  # of its prompt tokens since it started, from its cache
    tokens_per_s: float | None = None  # its generation speed lately, when it measured one

    @property
    def requests(self) -> int:
        return self.running + self.waiting


def read_engine(text: str, engine: str) -> EngineLoad | None:
    """Return the load an engine's metrics report, or None when they carry none of its series."""
    series = ENGINES[engine]
    running = _first(text, series.running, exposition.total)
    waiting = _first(text, series.waiting, exposition.total)
    kv = _first(text, series.kv_usage, exposition.largest)
    if running is None and waiting is None:
        return None
    cached = _first(text, series.prompt_cached, exposition.total)
    prompts = _first(text, series.prompt_queried, exposition.total)
    if prompts is None:
        prompts = (_first(text, series.prompt_computed, exposition.total) or 0.0) + (cached or 0.0)
    speed = _first(text, series.tokens_per_s, exposition.largest)
    return EngineLoad(
        round(running or 0),
        round(waiting or 0),
        kv,
        cached_share=(cached or 0.0) / prompts if prompts > 0 else None,
        # 0: no request finished since the last scrape, which is not measured, not a speed
        tokens_per_s=speed if speed is not None and speed > 0 else None,
    )


def full_reason(load: EngineLoad) -> str:
    """Say why an engine should be sent nothing more now, or return '' when it has room."""
    if load.waiting > 0:
        plural = "s" if load.waiting != 1 else ""
        return f"its engine has {load.waiting} request{plural} waiting"
    if load.kv_usage is not None and load.kv_usage >= KV_FULL:
        return f"its engine's KV cache is {load.kv_usage:.0%} full"
    return ""


def _first(
    text: str,
    series: tuple[Series, ...],
    read: Callable[[str, str, dict[str, str]], float | None],
) -> float | None:
    for one in series:
        value = read(text, one.name, one.where)
        if value is not None:
            return value
    return None


def slot_tokens(text: str) -> int | None:
    """Return the prompt tokens llama.cpp's slots keep (its `GET /slots`), or None where the
    answer is not a list of slots."""
    try:
        slots = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        return None
    held = (s.get("n_prompt_tokens", 0) for s in slots)
    return sum(n for n in held if type(n) is int and n > 0)


class EngineLoads:
    """Read the load series of the pools that name their serving `engine`, into their backends.

    Requests the engine runs or queues beyond the gateway's own take the backend's slots
    (`BackendState.external`), and an engine that queues or whose KV cache is full takes nothing
    more (`engine_full`) until a scrape sees it has room again, when its pool's queue is woken
    (`on_room`). The prompt cache's share and the generation speed an engine reports (llama.cpp)
    are kept for the fleet's views and gauges: a speed holds until the engine measures another,
    as it measures none in a window where no request finished.
    """

    def __init__(
        self, fleet: Callable[[], Fleet], on_room: Callable[[str], None] = lambda pool: None
    ):
        self._fleet = fleet
        self._on_room = on_room
        self._misses: dict[str, int] = {}
        # Each backend's own count as the round began: requests on their way to the engine.
        self._ours: dict[str, int] = {}

    def wanted(self) -> Mapping[str, Mapping[str, str]]:
        """Return the engine endpoints to read: every backend of a pool naming its engine, and
        llama.cpp's slots, which say what they keep of past prompts."""
        engined = [
            (b, pool.spec.engine)
            for pool in self._fleet().pools.values()
            if pool.spec.engine is not None
            for b in pool.backends
        ]
        self._ours = {b.url: b.gateway_load for b, _ in engined}
        wanted = {b.engine_url: b.engine_auth for b, _ in engined}
        return wanted | {b.url + SLOTS_PATH: b.auth for b, name in engined if name == "llamacpp"}

    def read(self, readings: Mapping[str, tuple[float, str | None]]) -> None:
        """Take a round's texts: each backend's load, and which pools have room again."""
        fleet = self._fleet()
        roomier: set[str] = set()
        for state in fleet.pools.values():
            name = state.spec.engine
            if name is None:  # a reload took its engine away: its figures go too
                for kept in state.backends:
                    kept.engine_cached_share = kept.engine_tokens_per_s = None
                    if kept.external or kept.engine_full:
                        kept.external = kept.external_seen = 0
                        kept.engine_full = ""
                        roomier.add(state.name)
                continue
            for backend in state.backends:
                before = backend.free_slots
                _, text = readings.get(backend.engine_url, (0.0, None))
                load = None if text is None else read_engine(text, name)
                self._take(backend, load)
                if backend.free_slots > before:
                    roomier.add(backend.pool)
                if name == "llamacpp":  # what its slots keep bounds the prefix estimate
                    _, text = readings.get(backend.url + SLOTS_PATH, (0.0, None))
                    tokens = None if text is None else slot_tokens(text)
                    blocks = None if tokens is None else tokens // BLOCK_TOKENS
                    fleet.prefixes.bound(backend.name, blocks)
        for pool in roomier:
            self._on_room(pool)

    def _take(self, backend: BackendState, load: EngineLoad | None) -> None:
        if load is None:
            # A busy engine is the one likeliest to answer its scrape late: its last figures
            # hold for a few misses; then the gateway's own bookkeeping decides.
            misses = self._misses.get(backend.url, 0) + 1
            self._misses[backend.url] = misses
            if misses >= MISSES_BEFORE_FORGETTING:
                backend.external = backend.external_seen = 0
                backend.engine_full = ""
                backend.engine_cached_share = backend.engine_tokens_per_s = None
            return
        self._misses[backend.url] = 0
        # A request of ours on its way to the engine is in our count, not yet in its: the
        # estimate of the others' falls for a moment. It falls only once a second scrape
        # agrees, and ours is the smaller of the counts around the scrape.
        gateway = min(self._ours.get(backend.url, backend.gateway_load), backend.gateway_load)
        seen = max(0, load.requests - gateway)
        backend.external = max(seen, backend.external_seen)
        backend.external_seen = seen
        backend.engine_full = full_reason(load)
        backend.engine_cached_share = load.cached_share
        if load.tokens_per_s is not None:
            backend.engine_tokens_per_s = load.tokens_per_s
