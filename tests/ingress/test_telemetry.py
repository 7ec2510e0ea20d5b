"""Telemetry: what a finished request adds to the metrics, read from a gateway's /metrics."""

from __future__ import annotations

from pathlib import Path

from harness.gateways import GatewayServer, run_gateway
from harness.metrics import metric_value
from policies import MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Name three things a routing gateway measures."}]
SLO = "gateway_slo_requests_total"


def stream(gw: GatewayServer, **headers: str) -> None:
    chunks = gw.client().chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=8,
        stream=True,
        extra_headers=headers,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_slo_attainment_counts_each_request_against_its_own_targets(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        # Targets no simulated pool misses, then one no pool can meet: both are interactive.
        stream(gw, **{"x-slo-ttft-ms": "30000", "x-slo-tpot-ms": "5000"})
        stream(gw, **{"x-slo-ttft-ms": "0.001"})
        records = gw.records(2)
        text = gw.http().get("/metrics").text
    assert all(r["ttft_ms"] > 0.001 and r["status"] == 200 for r in records)
    labels = {"route": "chat-8b-short", "slo_class": "interactive"}
    assert metric_value(text, SLO, result="met", **labels) == 1
    assert metric_value(text, SLO, result="missed", **labels) == 1


def test_a_failed_request_misses_its_slo(sims, tmp_path: Path) -> None:
    sims.asic[0].set_faults(error_rate=1.0)
    # Only the ASIC may serve the route, so its failure reaches the client.
    routes = [{"name": "asic-only", "match": {"models": [MODEL]}, "pools": ["asic"]}]
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), routes=routes)
    with run_gateway(policy, tmp_path) as gw, gw.http() as http:
        body = {"model": MODEL, "messages": PROMPT, "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=body).status_code >= 500
        gw.records(1)
        text = http.get("/metrics").text
    # A request no backend answered carries no pool, as in gateway_requests_total.
    labels = {"route": "asic-only", "pool": "", "slo_class": "interactive"}
    assert metric_value(text, SLO, result="missed", **labels) == 1
    assert metric_value(text, SLO, result="met", **labels) == 0
