"""Serving engines' own load signals: requests running and waiting, and KV-cache use.

A backend shared with other clients, or behind a load balancer, carries load the gateway did
not send. The engines say how loaded they are in their Prometheus series, which the metering
scrape reads for a pool whose policy names its `engine`:

- vllm: `vllm:num_requests_running`, `vllm:num_requests_waiting`, and the KV cache in use
  (0-1) as `vllm:kv_cache_usage_perc`, or `vllm:gpu_cache_usage_perc` before 0.9;
- sglang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`;
- tgi: `tgi_batch_current_size`, `tgi_queue_size` (TGI reports no KV-cache share);
- triton (TensorRT-LLM): `nv_trt_llm_request_metrics` with `request_type` `active` and
  `waiting`, and `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`.

Request counts are summed over their series (one per model or engine); the KV-cache share,
a ratio, is the largest of its series. An engine that queues, or whose KV cache is nearly
full, takes no more requests: `full_reason` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.upstream import exposition

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


ENGINES: dict[str, EngineSeries] = {
    "vllm": EngineSeries(
        running=(Series("vllm:num_requests_running"),),
        waiting=(Series("vllm:num_requests_waiting"),),
        kv_usage=(Series("vllm:kv_cache_usage_perc"), Series("vllm:gpu_cache_usage_perc")),
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
}


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reported in one scrape."""

    running: int
    waiting: int
    kv_usage: float | None = None  # share of its KV cache in use, when it reports one

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
    return EngineLoad(round(running or 0), round(waiting or 0), kv)


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
