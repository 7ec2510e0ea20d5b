"""POST /admin/explain: the live decision for a request, with the fleet's current load."""

from __future__ import annotations

from pathlib import Path

from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

TOKEN = "explain-token"
ASIC = {"power": {"idle_w": 25, "max_w": 150}, "compute_tflops": 400, "bandwidth_gbs": 1200}
AUTH = {"authorization": f"Bearer {TOKEN}"}
BODY = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
ROUTES = [
    {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": ["gpu", "asic"],
        "fallback": "gpu",
        "objective": "min_energy",
    }
]


def test_explain_sees_live_load_and_sends_nothing(sims, tmp_path: Path) -> None:
    policy = fleet_policy(
        sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), routes=ROUTES, asic_extra=ASIC
    )
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        idle = http.post("/admin/explain", json={"body": BODY}, headers=AUTH).json()
        asic = gw.gateway.fleet.pools["asic"]
        for backend in asic.backends:
            backend.in_flight = backend.slots  # the ASIC is full right now
        full = http.post("/admin/explain", json={"body": BODY}, headers=AUTH).json()
        asic.waiters.extend([None] * 60)  # type: ignore[list-item]  # and 60 wait before it
        crowded = http.post("/admin/explain", json={"body": BODY}, headers=AUTH).json()
        asic.waiters.clear()
        for backend in asic.backends:
            backend.in_flight = 0
        denied = http.post("/admin/explain", json={"body": BODY})
    assert idle["decision"]["pool"] == "asic"
    # Full but freeing a slot soon: still the cheapest within the SLO, so the request waits.
    assert (full["decision"]["pool"], full["decision"]["backend"]) == ("asic", None)
    assert full["decision"]["queued_ms"] is not None
    assert any("full, but cheapest with its wait" in line for line in full["trace"])
    # Sixty ahead of it: the wait misses the SLO, and a free GPU slot serves.
    assert crowded["decision"]["pool"] == "gpu"
    assert "asic: predicted to miss the SLO: p90 ttft" in " ".join(crowded["trace"])
    assert idle["predictions"]["asic"]["marginal_energy_j"] > 0
    assert denied.status_code == 401
    assert gw.records(0) == []  # nothing was sent upstream, nothing recorded


def test_explain_returns_the_error_a_client_would_get(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        bad = http.post(
            "/admin/explain",
            json={"body": BODY, "headers": {"x-slo-class": "gold"}},
            headers=AUTH,
        ).json()
        malformed = http.post("/admin/explain", json={"endpoint": "images"}, headers=AUTH)
    assert bad["status"] == 400 and bad["error"]["param"] == "x-slo-class"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["param"] == "body.endpoint"
