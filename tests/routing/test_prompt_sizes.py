"""Honest prompt sizes end to end: estimated by script, and a prompt a backend refuses as too long
for its context is served by a pool with a larger one."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import sqlalchemy as sa
import yaml
from waiting import wait_for

from gateway.db.schema import request_records
from gateway.policy.load import parse_policy
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

ROOT = Path(__file__).resolve().parents[2]
CHINESE = "能源效率的硬件路由网关把每个请求发送到合适的后端。" * 320  # 8,000 characters


def default_policy(sims):
    """The shipped default policy, its pools pointed at the simulators."""
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for kind in ("gpu", "asic", "cim"):
        doc["pools"][kind]["backends"] = [{"url": u} for u in sims.urls(kind)]
    return parse_policy(yaml.safe_dump(doc), "default.yaml")


def test_an_8000_character_chinese_prompt_is_served_by_the_gpu(sims, tmp_path: Path) -> None:
    assert len(CHINESE) == 8000
    with run_gateway(default_policy(sims), tmp_path) as gw:
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": CHINESE}], max_tokens=16
        )
        counted = raw.parse().usage.prompt_tokens

        def recorded():
            with gw.gateway.db.connect() as conn:
                return conn.execute(
                    sa.select(request_records.c.prompt_tokens_estimated)
                ).scalar_one_or_none()

        estimated = wait_for(recorded)
    # By characters / 4 it would be 2,000 tokens, short enough for the ASIC's route.
    assert (raw.headers["x-gateway-route"], raw.headers["x-gateway-pool"]) == ("chat-8b", "gpu")
    assert counted > 6000
    assert estimated == pytest.approx(counted, rel=0.15)


def policy_with_a_context_the_asic_does_not_have(sims, *, fallback: bool):
    # The ASIC card's real context is 8,192 tokens; its pool here claims twice that.
    route = {"name": "chat", "match": {"models": [MODEL]}, "pools": ["asic"]}
    if fallback:
        route["fallback"] = "gpu"
    return fleet_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        asic_extra={"max_context": 16384},
        routes=[route],
    )


def test_a_prompt_refused_as_too_long_goes_to_a_pool_with_a_larger_context(
    sims, tmp_path: Path
) -> None:
    long = [{"role": "user", "content": "word " * 10_000}]
    policy = policy_with_a_context_the_asic_does_not_have(sims, fallback=True)
    with run_gateway(policy, tmp_path) as gw:
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=long, max_tokens=8
        )
        fallbacks = gw.gateway.metrics.registry.get_sample_value(
            "gateway_fallbacks_total",
            {"route": "chat", "from_pool": "asic", "to_pool": "gpu", "reason": "context_overflow"},
        )
    assert raw.http_response.status_code == 200 and raw.headers["x-gateway-pool"] == "gpu"
    assert fallbacks == 1


def test_the_refusal_reaches_the_client_only_when_no_larger_pool_exists(
    sims, tmp_path: Path
) -> None:
    long = [{"role": "user", "content": "word " * 10_000}]
    policy = policy_with_a_context_the_asic_does_not_have(sims, fallback=False)
    with run_gateway(policy, tmp_path) as gw, pytest.raises(openai.BadRequestError) as refused:
        gw.client().chat.completions.create(model=MODEL, messages=long, max_tokens=8)
    assert "maximum context length" in str(refused.value)
