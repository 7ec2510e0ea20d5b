"""The load series a serving engine publishes, as `--engine vllm|sglang|tgi|triton` asks.

Real pools run an engine whose `/metrics` says how loaded it is; the simulator publishes the
same names, labels and meanings from its devices, summed over the devices behind its port:

- vllm: `vllm:num_requests_running`, `vllm:num_requests_waiting` and
  `vllm:kv_cache_usage_perc` (0-1), labelled `engine` and `model_name`;
- sglang: `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (0-1),
  labelled `model_name`;
- tgi: `tgi_batch_current_size`, `tgi_queue_size`, unlabelled; TGI reports no KV-cache share;
- triton: `nv_trt_llm_request_metrics{request_type=active|waiting|max}` and
  `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}`, labelled `model`, `version`.

Running counts requests holding a slot, waiting those queued for one, KV-cache use the share
the running requests reserve. Requests of other clients (`--external-load`) count like any.
vLLM's prefix-cache counters follow, `vllm:prefix_cache_queries_total` (prompt tokens looked up)
and `vllm:prefix_cache_hits_total` (those the cache held), over the answered requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from simulator.device import Device

ENGINES = ("vllm", "sglang", "tgi", "triton")

# Engines with one series per model: (labels before the model's, [(name, help, figure)]).
PER_MODEL = {
    "vllm": (
        'engine="0",',
        [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                "running",
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv"),
        ],
    ),
    "sglang": (
        "",
        [
            ("sglang:num_running_reqs", "The number of running requests.", "running"),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "waiting"),
            ("sglang:token_usage", "The token usage.", "kv"),
        ],
    ),
}


PREFIX_CACHE = (
    (
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    ("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
)


def render(
    engine: str,
    devices: Sequence[Device],
    models: Sequence[str],
    prefix_cache: tuple[Mapping[str, int], Mapping[str, int]] = ({}, {}),
) -> list[str]:
    """Return the exposition lines of `engine`'s load series for these devices, and for vLLM its
    prefix cache's queried and hit tokens per model."""
    running: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    for device in devices:
        running.update(job.model.name for job in device.holding())
        waiting.update(job.model.name for job in device.waiting())
        # Other clients' requests are for the first chat model served.
        if models:
            running[models[0]] += device.external_running
            waiting[models[0]] += device.external_waiting
    kv = max(device.kv_usage for device in devices)
    lines: list[str] = []
    if engine in PER_MODEL:
        labels, series = PER_MODEL[engine]
        counts = {"running": running, "waiting": waiting}
        for name, help_text, figure in series:
            _family(lines, name, help_text)
            for model in models:
                value = kv if figure == "kv" else float(counts[figure][model])
                lines.append(f'{name}{{{labels}model_name="{model}"}} {value}')
        if engine == "vllm":
            for (name, help_text), tokens in zip(PREFIX_CACHE, prefix_cache, strict=True):
                _family(lines, name, help_text, "counter")
                for model in models:
                    lines.append(
                        f'{name}{{{labels}model_name="{model}"}} {float(tokens.get(model, 0))}'
                    )
    elif engine == "tgi":
        _family(lines, "tgi_batch_current_size", "Current batch size.")
        lines.append(f"tgi_batch_current_size {sum(running.values())}")
        _family(lines, "tgi_queue_size", "Current queue size.")
        lines.append(f"tgi_queue_size {sum(waiting.values())}")
    elif engine == "triton":
        requests = "nv_trt_llm_request_metrics"
        _family(lines, requests, "TRT LLM request metrics")
        for kind, count in (
            ("active", sum(running.values())),
            ("max", sum(device.slots for device in devices)),
            ("waiting", sum(waiting.values())),
        ):
            labels = f'model="ensemble",request_type="{kind}",version="1"'
            lines.append(f"{requests}{{{labels}}} {count}")
        blocks = "nv_trt_llm_kv_cache_block_metrics"
        _family(lines, blocks, "TRT LLM KV cache block metrics")
        labels = 'kv_cache_block_type="fraction",model="ensemble",version="1"'
        lines.append(f"{blocks}{{{labels}}} {kv}")
    else:
        raise ValueError(f"unknown engine {engine!r} (engines: {', '.join(ENGINES)})")
    return lines


def _family(lines: list[str], name: str, help_text: str, kind: str = "gauge") -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
