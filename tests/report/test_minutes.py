"""The report and the console read from request minutes equal a recount from every record of a
generated week: counts and sums exactly, percentiles within the sketch's stated error."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bench.records import generate
from gateway.db.connection import connect
from gateway.db.schema import request_records
from gateway.ops import views
from gateway.policy.load import load_policy
from gateway.records.slo import judged_on, record_meets_slo
from gateway.report import records
from gateway.report.period import week
from gateway.stats import SKETCH_RELATIVE_ERROR, percentile

ROOT = Path(__file__).resolve().parents[2]
WEEK = week("2026-W48")
EXACT = pytest.approx  # float sums: equal up to the order they were added in
PREDICTED = {"e2e": ("e2e_ms", "predicted_e2e_ms"), "energy": ("energy_j", "predicted_energy_j")}


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = f"sqlite:///{tmp_path_factory.mktemp('week') / 'week.db'}"
    policy = load_policy(ROOT / "policies" / "default.yaml")
    generate(url, 6000, 600, WEEK, policy, seed=5)
    db = connect(url)
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(request_records))]
    yield db, policy, rows
    db.dispose()


def test_the_weekly_reports_traffic_equals_the_recount_of_every_record(generated) -> None:
    db, policy, rows = generated
    report = records.collect(db, policy, WEEK, now=WEEK.until + 3600, model=None)
    week_rows = [r for r in rows if WEEK.since <= r["ts"] < WEEK.until]
    fleet = report["fleet"]
    assert fleet["requests"] == len(week_rows) == 6000
    assert fleet["errors"] == sum(r["status"] != 200 for r in week_rows)
    assert fleet["energy_j"] == EXACT(sum(r["energy_j"] or 0 for r in week_rows))
    for p in fleet["pools"]:
        mine = [r for r in week_rows if (r["pool"] or "(none)") == p["pool"]]
        known = [r for r in mine if r["energy_j"] is not None]
        tokened = [r for r in known if _tokens(r)]
        priced = [r for r in mine if r["cost_usd"] is not None and _tokens(r)]
        assert p["requests"] == len(mine)
        assert p["errors"] == sum(r["status"] != 200 for r in mine)
        assert p["prompt_tokens"] == sum(r["prompt_tokens"] or 0 for r in mine)
        assert p["completion_tokens"] == sum(r["completion_tokens"] or 0 for r in mine)
        if known:
            assert p["energy_j_per_request"] == EXACT(
                sum(r["energy_j"] for r in known) / len(known)
            )
            assert p["energy_j_per_1k_tokens"] == EXACT(
                sum(r["energy_j"] for r in tokened) / sum(map(_tokens, tokened)) * 1000
            )
            assert p["cost_usd_per_1k_tokens"] == EXACT(
                sum(r["cost_usd"] for r in priced) / sum(map(_tokens, priced)) * 1000
            )
        else:
            assert p["energy_j"] is None and p["energy_j_per_request"] is None
    for s in fleet["slo"]:
        mine = [
            r for r in week_rows if (r["slo_class"] or policy.default_slo_class) == s["slo_class"]
        ]
        spec = policy.slo_classes.get(s["slo_class"])
        assert (s["requests"], s["met"]) == (
            len(mine),
            sum(record_meets_slo(spec, r) for r in mine),
        )
    for o in fleet["cost_model"]["observed"]:
        observed, predicted = PREDICTED[o["target"]]
        errors = [
            abs(r[observed] - r[predicted]) / r[observed]
            for r in week_rows
            if r["pool"] == o["pool"] and r["status"] == 200 and r[observed]
            and r[predicted] is not None
        ]  # fmt: skip
        assert o["requests"] == len(errors)
        assert o["mape"] == EXACT(math.fsum(errors) / len(errors))
    for c in report["candidates"]:
        assert c["volume"]["requests"] == sum(r["route"] == c["route"] for r in week_rows)
        # Every request of the route was read: the projection is the whole week's.
        assert c["projected_savings"]["sampled"] == c["volume"]["requests"]


def test_the_consoles_traffic_equals_the_recount_within_the_sketchs_error(generated) -> None:
    db, policy, rows = generated
    now = WEEK.since + 3 * 86400  # a Thursday 00:00: the day before it is a weekday's traffic
    routes = {r["route"]: r for r in views.traffic(db, policy, now, 86400)}
    day = [r for r in rows if now - 86400 <= r["ts"] < now and r["route"] is not None]
    assert set(routes) == {r["route"] for r in day}
    for name, shown in routes.items():
        mine = [r for r in day if r["route"] == name]
        assert shown["requests"] == len(mine)
        pools: dict[str, int] = defaultdict(int)
        for r in mine:
            pools[r["pool"] or "none"] += 1
        assert shown["pool_shares"] == {p: n / len(mine) for p, n in sorted(pools.items())}
        met = sum(
            record_meets_slo(policy.slo_classes.get(r["slo_class"] or policy.default_slo_class), r)
            for r in mine
        )
        assert shown["slo_attainment"] == met / len(mine)
        energy = [r["energy_j"] for r in mine if r["energy_j"] is not None]
        assert shown["energy_j_per_request"] == EXACT(sum(energy) / len(energy))
        ttft = [r["ttft_ms"] for r in mine if r["ttft_ms"] is not None]
        whole = [
            r["e2e_ms"]
            for r in mine
            if judged_on(r["endpoint"], bool(r["stream"])) == "e2e" and r["status"] == 200
        ]
        for q in (50, 95):
            for figure, values in ((f"ttft_p{q}_ms", ttft), (f"e2e_p{q}_ms", whole)):
                exact = percentile(values, q)
                if exact is None:
                    assert shown[figure] is None
                else:
                    assert shown[figure] == pytest.approx(exact, rel=SKETCH_RELATIVE_ERROR)
        assert sum(b["requests"] for b in shown["series"]) == len(mine)


def _tokens(r: dict[str, Any]) -> int | None:
    if r["prompt_tokens"] is None and r["completion_tokens"] is None:
        return None
    return (r["prompt_tokens"] or 0) + (r["completion_tokens"] or 0)
