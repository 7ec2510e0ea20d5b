"""The running gateway's life: starting before its database, readiness."""

from __future__ import annotations

from pathlib import Path

import httpx
from waiting import wait_for

from gateway.db.connection import upgrade
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy


def test_a_gateway_started_before_its_database_is_migrated_becomes_ready_once_it_is(
    sims, tmp_path: Path
) -> None:
    later = f"sqlite:///{tmp_path / 'migrated-later.db'}"
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, database_url=later) as gw, gw.http() as http:
        before = http.get("/readyz")
        # Not ready, but it answers from the policy file meanwhile.
        gw.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        upgrade(later)

        def ready() -> httpx.Response | None:
            answer = http.get("/readyz")
            return answer if answer.status_code == 200 else None

        after = wait_for(ready, message=lambda: f"never ready: {http.get('/readyz').json()}")
        # The policy file is stored by the next policy sync, which readiness does not wait for.
        version = wait_for(lambda: gw.gateway.policy_version)
    assert before.status_code == 503 and before.json()["database"] is False
    assert after.json()["database"] is True
    assert version == 1  # the policy file became the first stored version
