"""`GATEWAY_ROUTING_SEED`: a replica given the same requests in order explores alike."""

from __future__ import annotations

from pathlib import Path

from harness.gateways import run_gateway
from policies import MODEL, fleet_policy, ranked_route

PROMPT = [{"role": "user", "content": "Which pool answers this?"}]


def pools_chosen(sims, tmp_path: Path, seed: int, requests: int = 30) -> list[str]:
    """Send `requests` chats one at a time through a fresh gateway; return each one's pool."""
    tmp_path.mkdir()
    routes = [ranked_route(0.5)]
    policy = fleet_policy(sims.urls("gpu")[:1], sims.urls("asic"), sims.urls("cim"), routes=routes)
    with run_gateway(policy, tmp_path, routing_seed=seed) as gw:
        client = gw.client()
        return [
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=4, temperature=0
            ).headers["x-gateway-pool"]
            for _ in range(requests)
        ]


def test_the_same_seed_explores_the_same_requests(sims, tmp_path: Path) -> None:
    first = pools_chosen(sims, tmp_path / "a", seed=7)
    again = pools_chosen(sims, tmp_path / "b", seed=7)
    other = pools_chosen(sims, tmp_path / "c", seed=8)
    assert first == again
    assert len(set(first)) == 2  # half explore: both pools serve
    # Another seed explores other requests: the same 30 choices at 50% by chance is 2**-30.
    assert other != first
