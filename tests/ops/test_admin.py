"""The admin API: the token guard, and the shadow summary filled by real traffic."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from shadowworld import PROMPT, settle, shadow_policy, shadow_rows

from gateway.report.period import SINCE, parse_since
from harness.gateways import run_gateway
from harness.metrics import parse_metrics
from policies import MODEL, fleet_policy

TOKEN = "s3cret-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
REQUIRED = {
    "route",
    "candidate",
    "samples",
    "dropped",
    "candidate_error_rate",
    "exact_match_rate",
    "normalized_match_rate",
    "mean_similarity",
    "noise_samples",
    "noise_exact_match_rate",
    "noise_mean_similarity",
    "primary_latency_p50_ms",
    "primary_latency_p95_ms",
    "candidate_latency_p50_ms",
    "candidate_latency_p95_ms",
    "primary_energy_j",
    "candidate_energy_j",
}


def test_without_a_token_configured_the_admin_api_is_off(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path) as gw, gw.http() as http:
        response = http.get("/admin/shadow/summary", headers=AUTH)
    assert response.status_code == 403
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "admin_disabled" and "GATEWAY_ADMIN_TOKEN" in error["message"]


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN])
def test_a_missing_or_wrong_token_is_401(tmp_path: Path, auth: str | None) -> None:
    headers = {} if auth is None else {"authorization": auth}
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        response = http.get("/admin/shadow/summary", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_admin_token"


def test_since_takes_seconds_iso_times_and_ages() -> None:
    now = 1_000_000.0
    read = {
        "12.5": 12.5,
        "24h": now - 86_400,
        "1970-01-02T00:00:00": 86_400,
        "1970-01-02T01:00:00+01:00": 86_400,
        "1970-01-02 01:00+0100": 86_400,
    }
    for value, start in read.items():
        assert parse_since(value, now) == start
        assert re.fullmatch(SINCE, value), f"the API's pattern refuses {value!r}"
    assert parse_since(None, now) is None


def test_a_malformed_since_is_a_400_naming_it(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:

        def since(value: str) -> httpx.Response:
            return http.get("/admin/shadow/summary", params={"since": value}, headers=AUTH)

        # Refused by the pattern the description states, before it is read: dates that are
        # none too.
        unlike = ("last week", "1e5", "-5", " 24h", "24 h", "2026-13-45", "2026-02-29T10:00")
        refused = [since(value) for value in unlike]
        accepted = [since(value) for value in ("", "12.5", "24h", "2026-11-23T10:00:00Z")]
    for response in refused:
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "query.since"
    assert [r.status_code for r in accepted] == [200] * 4


def test_traffic_fills_the_shadow_summary(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=1.0)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        client = gw.client()
        for temperature in (0, 0, 0, 0.8):
            client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=30, temperature=temperature
            )
        settle(gw)
        shadow_rows(gw, 8)
        gw.records(4)
        summary = http.get("/admin/shadow/summary", headers=AUTH).json()
        by_candidate = http.get(
            "/admin/shadow/summary", params={"candidate": "asic"}, headers=AUTH
        ).json()
        later = http.get("/admin/shadow/summary", params={"since": "2999-01-01"}, headers=AUTH)
        metrics = http.get("/metrics").text
    (entry,) = summary
    assert set(entry) >= REQUIRED
    assert (entry["route"], entry["candidate"], entry["samples"], entry["dropped"]) == (
        "chat",
        "cim",
        4,
        0,
    )
    assert entry["candidate_error_rate"] == 0
    assert entry["noise_samples"] == 4 and entry["greedy"]["noise_exact_match_rate"] == 1.0
    assert (entry["greedy"]["samples"], entry["sampled"]["samples"]) == (3, 1)
    assert 0 <= entry["mean_similarity"] <= 1
    assert entry["primary_latency_p50_ms"] > 0 and entry["candidate_latency_p95_ms"] > 0
    # Copies are metered like requests: their energy is the candidate's, not the primaries'.
    assert entry["primary_energy_j"] > 0 and entry["candidate_energy_j"] > 0
    assert by_candidate == [] and later.json() == []
    assert 'gateway_shadow_sent_total{candidate="cim",kind="candidate",route="chat"} 4.0' in metrics
    assert 'gateway_shadow_compared_total{candidate="gpu",kind="noise",route="chat"} 4.0' in metrics


# The serving engine and its version beside the driver and firmware (vLLM's series are not
# published by these simulators: its load is the gateway's own bookkeeping).
VERSIONS = {
    "driver": "550.90.07",
    "engine": "vllm",
    "engine_version": "0.6.3",
    "firmware": "96.00.99.00.01",
}


def test_a_pools_versions_are_in_explain_and_in_its_backends_metric_labels(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), gpu_extra=VERSIONS)
    body = {"model": MODEL, "max_tokens": 8, "messages": PROMPT}
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        explained = http.post("/admin/explain", json={"body": body}, headers=AUTH).json()
        metrics = parse_metrics(http.get("/metrics").text)
    # chat-8b-short: the ASIC first, the GPU as its second pool and fallback.
    pools = {name: dict(entry) for name, entry in explained["pools"].items()}
    backends = {name: entry.pop("backends") for name, entry in pools.items()}
    # No tariff: the price of the policy's pool entry is in force, at the carbon it gives.
    assert {name: (entry.pop("tariff"), entry.pop("rate")) for name, entry in pools.items()} == {
        name: (None, {"usd_per_kwh": 0.12, "g_co2_per_kwh": 0.0}) for name in ("asic", "gpu")
    }
    assert pools == {
        "asic": {
            "kind": "asic",
            "precision": "bf16",
            "engine": None,
            "driver": None,
            "engine_version": None,
            "firmware": None,
        },
        "gpu": {"kind": "gpu", "precision": "bf16", **VERSIONS},
    }
    # Each backend's load now, as the decision saw it: nothing in flight, every slot free.
    assert [(b["backend"], b["free_slots"]) for b in backends["gpu"]] == [
        ("gpu-0", 32),
        ("gpu-1", 32),
    ]
    info = {
        labels["backend"]: labels for name, labels, _ in metrics if name == "gateway_backend_info"
    }
    assert set(info) == {"gpu-0", "gpu-1", "asic-0", "cim-0"}
    assert info["gpu-0"] == {
        "pool": "gpu",
        "backend": "gpu-0",
        "kind": "gpu",
        "precision": "bf16",
        **VERSIONS,
    }
    assert "runtime" not in info["asic-0"]
    assert [info["asic-0"][k] for k in ("engine", "engine_version", "driver")] == ["", "", ""]
