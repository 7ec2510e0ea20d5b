"""Promotion evaluations from stored shadow records: gather, judge, store, list, serve."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from rows import request_record, shadow_record

from gateway.db.connection import connect
from gateway.db.schema import promotion_evaluations, request_records, shadow_records
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
    slower: float = 1.0,
    late_every: int = 0,
    slo_class: str | None = None,
    now: float = NOW,
) -> None:
    """Store n temperature-0 candidate copies over 9 days, with a same-size A/A noise sample.

    Each answer is 40 tokens, not streamed: under the default policy's interactive class
    (500 ms to the first token, 50 ms a token) it meets its SLO within 2,450 ms end to end.
    The candidate takes `slower` times the primary's time, and 3 s on every `late_every`-th.
    With `slo_class`, each primary has a request record naming that class.
    """
    rows, requests = [], []
    first = sum(map(ord, route)) * 10**6  # decision ids of their own, for the request records
    for i in range(n):
        ts = now - 9 * 86400 + i * (9 * 86400 / n)
        disagrees = agree_every and i % agree_every == 0
        late = late_every and i % late_every == 0
        common = {
            "route": route,
            "ts": ts,
            "primary_e2e_ms": 1000.0 + i % 400,
            "candidate_e2e_ms": 3000.0 if late else slower * (1000.0 + i % 400),
            "primary_completion_tokens": 40,
            "candidate_completion_tokens": 40,
            "primary_cost_usd": 1e-4,
            "candidate_cost_usd": 5e-5 if cheaper else 2e-4,
        }
        copy = shadow_record(first + 2 * i, exact_match=not disagrees, **common)
        rows.append(copy.row())
        rows.append(
            shadow_record(
                first + 2 * i + 1, kind="noise", candidate_pool="gpu", exact_match=True, **common
            ).row()
        )
        if slo_class is not None:
            request = dataclasses.replace(
                request_record(i, copy.decision_id), route=route, slo_class=slo_class
            )
            requests.append(request.row())
    with db.begin() as conn:
        conn.execute(shadow_records.insert(), rows)
        if requests:
            conn.execute(request_records.insert(), requests)


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
    assert {c["name"] for c in listed["worse"]["checks"]} >= {"quality", "slo", "errors"}
    with db.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(promotion_evaluations))
        assert stored.scalar() == 2
    db.dispose()


def test_latency_is_judged_against_the_requests_slo_class_not_the_primarys_p95(
    database: str,
) -> None:
    db = connect(database)
    policy = load_policy(ROOT / "policies/default.yaml")
    shadow_history(db, 8000, slower=1.4)  # 1.4x the primary's time, every copy within 2,450 ms
    shadow_history(db, 8000, late_every=20, route="late")  # 5 % of copies past it
    # The same copies of requests whose records name the batch class (120 s): all on time.
    shadow_history(db, 8000, late_every=20, route="late-batch", slo_class="batch")
    verdicts = {v.route: v for v in evaluate(db, policy, now=NOW)}
    db.dispose()
    slower, late = verdicts["chat"], verdicts["late"]
    assert slower.outcome == PROMOTE, slower.reason
    assert slower.latency["e2e_p95_ratio"] == pytest.approx(1.4, rel=0.05)
    assert late.outcome == REJECT
    (slo,) = [c for c in late.checks if c.name == "slo"]
    assert slo.estimate == pytest.approx(0.05, abs=0.001)
    assert "fewer of its copies meet the route's SLO" in late.reason
    assert verdicts["late-batch"].outcome == PROMOTE, verdicts["late-batch"].reason


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
