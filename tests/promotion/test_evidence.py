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
from rows import request_record, shadow_record, store_shadow_minutes

from gateway.db.connection import connect
from gateway.db.schema import promotion_evaluations, request_records, shadow_records
from gateway.policy.load import load_policy
from gateway.promotion.evidence import evaluate, gather, latest, slo_targets
from gateway.promotion.judge import HOLD, PROMOTE, REJECT, Criteria, Evidence, judge
from harness.gateways import run_gateway
from policies import fleet_policy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = load_policy(ROOT / "policies/default.yaml")
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
        copy = shadow_record(
            first + 2 * i,
            exact_match=not disagrees,
            first_divergence=5 if disagrees else None,
            reference_words=40,
            **common,
        )
        rows.append(copy.row())
        rows.append(
            shadow_record(
                first + 2 * i + 1,
                kind="noise",
                candidate_pool="gpu",
                exact_match=True,
                reference_words=40,
                **common,
            ).row()
        )
        if slo_class is not None:
            request = dataclasses.replace(
                request_record(i, copy.decision_id), ts=copy.ts, route=route, slo_class=slo_class
            )
            requests.append(request.row())
    with db.begin() as conn:
        conn.execute(shadow_records.insert(), rows)
        if requests:
            conn.execute(request_records.insert(), requests)
    # The minutes the writer folds as the copies are recorded, under the default policy.
    store_shadow_minutes(db, slo_targets(DEFAULT), since=rows[0]["ts"], route=route)


def test_departures_are_counted_per_word_at_risk_and_records_without_the_length_left_out() -> None:
    def row(n: int, kind: str = "candidate", **measures: object) -> dict:
        pool = "gpu" if kind == "noise" else "cim"
        fields = {"similarity": None, **measures}
        record = shadow_record(n, kind=kind, candidate_pool=pool, **fields)
        return {**record.row(), "slo_class": None}

    rows = [
        row(1, exact_match=True, reference_words=30),  # every word at risk, none departed
        row(2, exact_match=False, first_divergence=9, similarity=0.5, reference_words=30),
        row(3, exact_match=True),  # stored before the length was measured
        row(4, "noise", exact_match=True, reference_words=30),
        row(5, "noise", exact_match=True, reference_words=25),
        row(6, "noise", exact_match=False, first_divergence=2, similarity=0.5),
    ]
    (e,) = gather(rows, lambda _: None).values()
    a = e.greedy
    # The differing pair put its words up to and including the first that differs at risk.
    assert (a.compared, a.departed, a.words) == (2, 1, 30 + 10)
    assert (a.noise_compared, a.noise_departed, a.noise_words) == (2, 0, 55)
    assert a.unmeasured == 2
    (quality,) = [c for c in judge(e, Criteria(), now=NOW).checks if c.name == "quality"]
    assert quality.estimate == pytest.approx(1 / 40)
    assert "1 of 2 temperature-0 pairs depart in meaning, 25 per 1,000 of their 40 words" in (
        quality.detail
    )
    assert "2 pairs stored before the primary's length in words was measured are left out" in (
        quality.detail
    )


def row(n: int, kind: str = "candidate", **fields: object) -> dict:
    pool = "gpu" if kind == "noise" else "cim"
    record = shadow_record(n, kind=kind, candidate_pool=pool, **{"similarity": None, **fields})
    return {**record.row(), "slo_class": None}


def test_an_answer_without_usage_is_held_to_its_slo_by_its_time() -> None:
    # Interactive: 500 ms to the first token and 50 ms a token. A 25 s whole answer whose engine
    # sent no usage is held to the budget of the primary's answer to the same request.
    policy = fleet_policy()
    rows = [
        row(1, exact_match=True, reference_words=30, primary_e2e_ms=900.0, candidate_e2e_ms=25e3,
            primary_completion_tokens=20, candidate_completion_tokens=None),
    ]  # fmt: skip
    (e,) = gather(rows, slo_targets(policy)).values()
    assert (e.slo.primary_met, e.slo.candidate_met, e.slo.only_primary) == (1, 0, 1)


def test_a_failed_copy_counts_against_the_candidate_and_a_failed_primary_for_it() -> None:
    rows = [
        row(1, exact_match=False, first_divergence=0, reference_words=30, failure="empty"),
        row(
            2,
            exact_match=None,
            candidate_error="upstream_timeout",
            candidate_status=None,
            failure="timeout",
        ),
        row(3, exact_match=False, first_divergence=0, reference_words=30, primary_failure="null"),
        row(4, exact_match=True, reference_words=30),
        row(5, "noise", exact_match=True, reference_words=30),
    ]
    (e,) = gather(rows, lambda _: None).values()
    f = e.failures
    assert (f.pairs, f.only_candidate, f.only_primary) == (4, 2, 1)
    assert f.kinds == {"empty": 1, "timeout": 1}
    # Both failed copies depart at their first word; the primary's failure is left out.
    assert (e.greedy.compared, e.greedy.departed, e.greedy.words) == (3, 2, 1 + 1 + 30)
    assert (e.slo.only_primary, e.slo.only_candidate) == (2, 1)


def test_a_handful_of_odd_noise_floor_pairs_cannot_turn_a_reject_into_a_promote() -> None:
    """An analog part: one answer in 25 a changed fact, 0.6 alike to the primary's in meaning
    and in words, the rest matching; 2,500 A/A pairs match, but for one or a handful at 0.45.
    Rejected whether the embedding model declares a paraphrase figure (0.83) or not, and
    judged on meaning or on words alone: the odd pairs loosen no tolerance."""
    criteria = Criteria()
    for embedded in (True, False):
        meaning = 0.6 if embedded else None
        candidate = [
            row(i, exact_match=i % 25 != 0, first_divergence=3, reference_words=12,
                near_tie=None if i % 25 else False, similarity=None if i % 25 else 0.6,
                semantic_similarity=None if i % 25 else meaning, ts=i * 300.0)
            for i in range(3000)
        ]  # fmt: skip
        floor = [
            row(10_000 + i, "noise", exact_match=True, reference_words=12) for i in range(2500)
        ]
        odd = [
            row(20_000 + i, "noise", exact_match=False, first_divergence=1, reference_words=12,
                near_tie=False, similarity=0.45, semantic_similarity=0.45 if embedded else None)
            for i in range(5)
        ]  # fmt: skip
        for paraphrase in (0.83, None):
            for noise in (floor, [*floor[:-1], odd[0]], [*floor[:-5], *odd]):
                figure = lambda _, declared=paraphrase: declared  # noqa: E731
                (e,) = gather([*candidate, *noise], lambda _: None, figure).values()
                start = "semantic similarity below 0.830" if paraphrase else "below 0.980"
                assert start in e.greedy.tolerance and "ROUGE-L below 0.950" in e.greedy.tolerance
                assert judge(e, criteria, now=NOW).outcome == REJECT, (embedded, paraphrase)


def test_the_judge_counts_a_confident_change_and_not_a_flip_at_a_near_tie() -> None:
    # One answer in 25 parts from the primary's at a near tie and goes on far in meaning (0.6):
    # at a KL of 0.002 a benign flip (the Q8_0 part's), at 0.5 an analog part's.
    def evidence(kl: float) -> Evidence:
        rows = [
            row(i, exact_match=i % 25 != 0, first_divergence=3, reference_words=12,
                near_tie=True, kl_divergence=kl, semantic_similarity=None if i % 25 else 0.6,
                ts=i * 300.0)
            for i in range(3000)
        ]  # fmt: skip
        floor = [
            row(10_000 + i, "noise", exact_match=True, reference_words=12) for i in range(2500)
        ]
        (e,) = gather([*rows, *floor], lambda _: None, lambda route: 0.83).values()
        return e

    benign, moved = evidence(0.002), evidence(0.5)
    assert (benign.greedy.departed, moved.greedy.departed) == (0, 120)
    assert judge(moved, Criteria(), now=NOW).outcome == REJECT
    assert judge(benign, Criteria(), now=NOW).outcome != REJECT


def test_evaluations_are_judged_stored_and_listed(database: str) -> None:
    db = connect(database)
    policy = load_policy(ROOT / "policies/default.yaml")
    # A departure in one answer of ten, each of 40 words, is 2.7 per 1,000 words at risk.
    shadow_history(db, 8000)
    shadow_history(db, 3000, agree_every=10, route="worse")
    verdicts = {v.route: v for v in evaluate(db, policy, now=NOW)}
    assert verdicts["chat"].outcome == PROMOTE, verdicts["chat"].reason
    assert verdicts["worse"].outcome == REJECT
    assert "temperature-0 answers depart in meaning" in verdicts["worse"].reason
    listed = {entry["route"]: entry for entry in latest(db)}
    assert listed["chat"]["outcome"] == PROMOTE
    assert {c["name"] for c in listed["worse"]["checks"]} >= {"quality", "slo", "failures"}
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
    assert verdict["outcome"] == HOLD  # 600 samples: too few to decide the SLO's 1-point margin
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
