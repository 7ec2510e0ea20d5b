"""Serving engines' load series, in the names and shapes each engine publishes them."""

from __future__ import annotations

import pytest
from llamacpp import captured

from gateway.fleet.state import Fleet
from gateway.policy.load import parse_policy
from gateway.upstream.engines import (
    KV_FULL,
    SLOTS_PATH,
    EngineLoad,
    EngineLoads,
    full_reason,
    read_engine,
    slot_tokens,
)
from policies import MODEL, pool, to_yaml


def test_vllm_is_read_by_its_current_kv_name_and_by_the_name_before_0_9() -> None:
    current = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="llama"} 5.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42\n'
    )
    assert read_engine(current, "vllm") == EngineLoad(5, 0, 0.42)
    older = current.replace("kv_cache_usage_perc", "gpu_cache_usage_perc")
    assert read_engine(older, "vllm") == EngineLoad(5, 0, 0.42)


def test_sglang_and_tgi_are_read_by_their_own_names() -> None:
    sglang = (
        'sglang:num_running_reqs{model_name="a"} 2\n'
        'sglang:num_running_reqs{model_name="b"} 1\n'
        'sglang:num_queue_reqs{model_name="a"} 4\n'
        'sglang:token_usage{model_name="a"} 0.5\n'
        'sglang:token_usage{model_name="b"} 0.25\n'  # a ratio: the fullest, not the sum
    )
    assert read_engine(sglang, "sglang") == EngineLoad(3, 4, 0.5)
    tgi = "tgi_batch_current_size 7\ntgi_queue_size 1\ntgi_batch_current_max_tokens 9000\n"
    assert read_engine(tgi, "tgi") == EngineLoad(7, 1, None)


def test_triton_is_read_by_the_labels_of_its_request_and_kv_block_series() -> None:
    text = (
        'nv_trt_llm_request_metrics{model="ensemble",request_type="active",version="1"} 6\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="max",version="1"} 64\n'
        'nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 2\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="e"} 4096\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="e"} 0.25\n'
    )
    assert read_engine(text, "triton") == EngineLoad(6, 2, 0.25)


def test_metrics_without_the_engines_series_report_nothing() -> None:
    dcgm_only = 'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 250\n'
    assert read_engine(dcgm_only, "vllm") is None
    assert read_engine("vllm:num_requests_running 1\n", "sglang") is None


@pytest.mark.parametrize(
    ("load", "full"),
    [
        (EngineLoad(3, 0, 0.5), ""),
        (EngineLoad(3, 0, None), ""),
        (EngineLoad(3, 1, 0.1), "its engine has 1 request waiting"),
        (EngineLoad(3, 0, KV_FULL), "its engine's KV cache is 95% full"),
        (EngineLoad(0, 0, 0.99), "its engine's KV cache is 99% full"),
    ],
)
def test_an_engine_that_queues_or_whose_kv_cache_is_full_has_no_room(
    load: EngineLoad, full: str
) -> None:
    assert full_reason(load) == full


def test_llamacpp_is_read_by_its_processing_and_deferred_requests_and_a_deferral_is_full() -> None:
    # Three answers in its three slots and a fourth deferred, as llama-server said it.
    load = read_engine(captured("metrics-busy.txt").decode(), "llamacpp")
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage) == (3, 1, None)
    assert full_reason(load) == "its engine has 1 request waiting"


def test_llamacpp_reports_its_prompt_caches_share_and_its_generation_speed() -> None:
    busy = read_engine(captured("metrics-busy.txt").decode(), "llamacpp")
    after = read_engine(captured("metrics-after.txt").decode(), "llamacpp")
    assert busy is not None and after is not None
    # Its prompt counter leaves the cached tokens out: the share is of both together.
    assert busy.cached_share == pytest.approx(93 / (99 + 93))
    assert busy.tokens_per_s == pytest.approx(689.951)
    assert after.cached_share == pytest.approx(310 / (106 + 310))
    assert (after.running, after.waiting, full_reason(after)) == (0, 0, "")


def test_a_llamacpp_window_without_a_finished_request_has_no_speed_and_a_fresh_one_no_share() -> (
    None
):
    fresh = (
        captured("metrics-after.txt")
        .decode()
        .replace("llamacpp:predicted_tokens_seconds 252.496", "llamacpp:predicted_tokens_seconds 0")
        .replace("prompt_tokens_total 106", "prompt_tokens_total 0")
        .replace("prompt_tokens_cached_total 310", "prompt_tokens_cached_total 0")
    )
    assert read_engine(fresh, "llamacpp") == EngineLoad(0, 0, None, None, None)


def test_vllm_reports_its_prefix_caches_share_by_the_names_before_and_since_0_10() -> None:
    current = (
        'vllm:num_requests_running{engine="0",model_name="llama"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 4000.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 3000.0\n'
    )
    load = read_engine(current, "vllm")
    assert load is not None and load.cached_share == pytest.approx(0.75)
    older = read_engine(current.replace("vllm:prefix_cache", "vllm:gpu_prefix_cache"), "vllm")
    assert older is not None and older.cached_share == pytest.approx(0.75)
    none_yet = read_engine(current.replace("4000.0", "0.0").replace("3000.0", "0.0"), "vllm")
    assert none_yet is not None and none_yet.cached_share is None


def test_llamacpps_slots_say_how_many_prompt_tokens_they_keep() -> None:
    assert slot_tokens(captured("slots.json").decode()) == 34  # one slot served, one did not
    assert slot_tokens("[]") == 0
    for unreadable in ("<html>", '{"error": "slots disabled"}', "[1, 2]"):
        assert slot_tokens(unreadable) is None


def llamacpp_fleet() -> Fleet:
    doc = {
        "default_slo_class": "interactive",
        "slo_classes": {"interactive": {"ttft_ms": 1000}},
        "pools": {
            "gpu": pool(
                "gpu", ["http://127.0.0.1:7"], [MODEL], slots_per_backend=4, engine="llamacpp"
            )
        },
        "routes": [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}],
    }
    return Fleet(parse_policy(to_yaml(doc), "llamacpp.yaml"))


def test_the_load_reader_asks_for_the_engine_and_its_slots_and_takes_both() -> None:
    fleet = llamacpp_fleet()
    woken: list[str] = []
    loads = EngineLoads(lambda: fleet, on_room=woken.append)
    (backend,) = fleet.pools["gpu"].backends
    wanted = loads.wanted()
    assert set(wanted) == {backend.engine_url, backend.url + SLOTS_PATH}
    blocks = list(range(1, 40))
    fleet.prefixes.sent(backend.name, blocks)
    busy = captured("metrics-busy.txt").decode()
    loads.read({backend.engine_url: (0.0, busy), backend.url + SLOTS_PATH: (0.0, "[]")})
    # Two more requests than the gateway sent fill the backend; its slots keep no prompt now.
    assert backend.external == read_engine(busy, "llamacpp").requests  # type: ignore[union-attr]
    assert fleet.prefixes.held(backend.name) == 0
    # Idle again: the others' requests are taken as gone once two scrapes agree, and the
    # pool's queue is woken; a slots answer missing leaves the bound as it was.
    idle = captured("metrics-after.txt").decode()
    for _ in range(2):
        loads.read({backend.engine_url: (0.0, idle), backend.url + SLOTS_PATH: (0.0, None)})
    assert backend.external == 0 and woken == ["gpu"]
