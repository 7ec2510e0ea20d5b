"""Promotion evaluations from stored shadow records: gather, judge, store, list, serve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
from rows import shadow_record

from gateway.db.connection import connect
from gateway.db.schema import promotion_evaluations, shadow_records
from gateway.policy.load import load_policy
from gateway.promotion.evidence import evaluate, latest
from gateway.promotion.judge import HOLD, PROMOTE, REJECT
from harness.gateways import run_gateway
from policies import fleet_policy

ROOT = Path(__file__).resolve().parents[2]
NOW = 10 * 86400.0


def shadow_history(
    db: sa.Engine,
    n: int,
    *,
    agree_every: int = 0,
    route: str = "chat",
    cheaper: bool = True,
    now: float = NOW,
) -> None:
    """Store n temperature-0 candidate copies over 9 days, with a same-size A/A noise sample."""
    rows = []
    for i in range(n):
        ts = now - 9 * 86400 + i * (9 * 86400 / n)
        disagrees = agree_every and i % agree_every == 0
        common = {
            "route": route,
            "ts": ts,
            "primary_ttft_ms": 80.0 + i % 40,
            "candidate_ttft_ms": 80.0 + i % 40,
            "primary_e2e_ms": 2000.0 + i % 400,
            "candidate_e2e_ms": 2000.0 + i % 400,
            "primary_cost_usd": 1e-4,
            "candidate_cost_usd": 5e-5 if cheaper else 2e-4,
        }
        rows.append(shadow_record(2 * i, exact_match=not disagrees, **common).row())
        rows.append(
            shadow_record(
                2 * i + 1, kind="noise", candidate_pool="gpu", exact_match=True, **common
            ).row()
        )
    with db.begin() as conn:
        conn.execute(shadow_records.insert(), rows)


def test_evaluations_are_judged_stored_and_listed(database: str) -> None:
    db = connect(database)
    policy = load_policy(ROOT / "policies/default.yaml")
    # Non-inferiority within 0.2 points needs thousands of pairs on each side.
    shadow_history(db, 8000)
    shadow_history(db, 3000, agree_every=10, route="worse")
    verdicts = {v.route: v for v in evaluate(db, policy, now=NOW)}
    assert verdicts["chat"].outcome == PROMOTE, verdicts["chat"].reason
    assert verdicts["worse"].outcome == REJECT
    assert "temperature-0 answers depart in meaning" in verdicts["worse"].reason
    listed = {entry["route"]: entry for entry in latest(db)}
    assert listed["chat"]["outcome"] == PROMOTE
    assert {c["name"] for c in listed["worse"]["checks"]} >= {"quality", "ttft_p95", "errors"}
    with db.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(promotion_evaluations))
        assert stored.scalar() == 2
    db.dispose()


def test_a_candidate_that_costs_more_is_not_promoted(database: str) -> None:
    db = connect(database)
    shadow_history(db, 3000, cheaper=False)
    (verdict,) = evaluate(db, load_policy(ROOT / "policies/default.yaml"), now=NOW)
    db.dispose()
    assert verdict.outcome == REJECT and "not cheaper than the primary" in verdict.reason


def test_cli_and_admin_api_show_the_verdicts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "-m", "gateway", "db", "upgrade"], env=env, check=True, capture_output=True
    )
    db = connect(url)
    shadow_history(db, 600, now=time.time())
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "promote", "evaluate", "--json"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    (verdict,) = json.loads(result.stdout)
    assert verdict["outcome"] == HOLD  # 600 samples: not enough to tell a 0.2-point margin
    assert verdict["samples_needed"] is None or verdict["samples_needed"] > 0
    with run_gateway(fleet_policy(), tmp_path, admin_token="t") as gw, gw.http() as http:
        listed = http.get("/admin/promotions", headers={"authorization": "Bearer t"}).json()
        fresh = http.get(
            "/admin/promotions",
            params={"evaluate": "true"},
            headers={"authorization": "Bearer t"},
        ).json()
    assert [v["outcome"] for v in listed] == [HOLD]
    assert fresh[0]["evaluated_at"] >= listed[0]["evaluated_at"]
    db.dispose()
