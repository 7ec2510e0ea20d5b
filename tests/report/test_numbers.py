"""The report's numbers, recounted here from the rows a constructed week stored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from reportworld import MODEL, build

from gateway.compare.measures import SHOWN
from gateway.costmodel.predict import CostModel
from gateway.db.connection import connect
from gateway.promotion.evidence import evaluate
from gateway.report import generate
from gateway.report.numbers import fleet_draw, fleet_headline
from gateway.report.period import Period
from gateway.stats import SKETCH_RELATIVE_ERROR
from policies import fleet_policy


@pytest.fixture(scope="module")
def written(module_database: str, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A constructed week and its report, read (never written) by the tests that take it."""
    db = connect(module_database)
    world = build(db)
    out = tmp_path_factory.mktemp("report")
    generate(db, world.policy, world.period, out, now=world.period.until + 3600)
    report = json.loads((out / "report.json").read_text())
    yield world, report, db
    db.dispose()


def in_week(world, rows):
    return [r for r in rows if world.period.since <= r["ts"] < world.period.until]


def test_fleet_numbers_are_sums_of_the_weeks_requests(written) -> None:
    world, report, _ = written
    week = in_week(world, world.requests)
    fleet = report["fleet"]
    assert fleet["requests"] == len(week) == 60
    assert fleet["errors"] == sum(r["status"] != 200 for r in week)
    pools = {p["pool"]: p for p in fleet["pools"]}
    gpu = [r for r in week if r["pool"] == "gpu"]
    assert pools["gpu"]["requests"] == len(gpu)
    assert pools["gpu"]["energy_j"] == pytest.approx(
        sum(r["energy_j"] for r in gpu if r["energy_j"] is not None)
    )
    priced = [r for r in gpu if r["cost_usd"] is not None]
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in priced)
    assert pools["gpu"]["cost_usd_per_1k_tokens"] == pytest.approx(
        sum(r["cost_usd"] for r in priced) / tokens * 1000
    )
    # The week before had 5 requests, all on the ASIC.
    assert fleet["change"]["requests"] == {"previous": 5, "change": 55}


def test_the_fleet_section_says_what_each_pool_runs_on(written, tmp_path: Path) -> None:
    world, report, db = written
    assert [(h["pool"], h["kind"], h["driver"]) for h in report["fleet"]["hardware"]] == [
        ("gpu", "gpu", None),
        ("gpu-70b", "gpu", None),
        ("asic", "asic", None),
        ("cim", "cim", None),
    ]
    versions = {"driver": "550.90.07", "engine_version": "0.6.3", "firmware": "96.00.99.00.01"}
    pools = dict(world.policy.pools)
    pools["gpu-70b"] = pools["gpu-70b"].model_copy(update={"engine": "vllm", **versions})
    policy = world.policy.model_copy(update={"pools": pools})
    out = tmp_path / "versions"
    generate(db, policy, world.period, out, now=world.period.until + 3600)
    hardware = {
        h["pool"]: h for h in json.loads((out / "report.json").read_text())["fleet"]["hardware"]
    }
    assert hardware["gpu-70b"] == {
        "pool": "gpu-70b",
        "kind": "gpu",
        "live": True,
        "backends": 1,
        "precision": "bf16",
        "memory_gb": 320,
        "engine": "vllm",
        **versions,
    }
    assert hardware["cim"]["live"] is False and hardware["cim"]["precision"] == "analog-int4"
    row = "| gpu-70b | gpu | 1 | bf16 | 320 GB | vllm 0.6.3 | 550.90.07 | 96.00.99.00.01 |"
    assert row in (out / "report.md").read_text()
    assert "<td>vllm 0.6.3</td><td>550.90.07</td>" in (out / "report.html").read_text()
    assert "| asic | asic | 1 | int8 | 32 GB | – | – | – |" in (out / "report.md").read_text()


def test_slo_attainment_counts_successes_within_every_measured_target(written) -> None:
    world, report, _ = written
    week = in_week(world, world.requests)
    slo = {s["slo_class"]: s for s in report["fleet"]["slo"]}
    interactive = [r for r in week if r["slo_class"] == "interactive"]
    streamed = [
        r
        for r in interactive
        if r["status"] == 200 and r["stream"] and r["ttft_ms"] <= 500 and r["tpot_ms"] <= 50
    ]
    # Not streamed: the whole answer by when a stream meeting the class would have ended.
    whole = [
        r
        for r in interactive
        if r["status"] == 200
        and not r["stream"]
        and r["e2e_ms"] <= 500 + 50 * (r["completion_tokens"] - 1)
    ]
    unstreamed = [r for r in interactive if r["status"] == 200 and not r["stream"]]
    assert 0 < len(whole) < len(unstreamed)  # the world has some that miss
    assert slo["interactive"]["requests"] == len(interactive)
    assert slo["interactive"]["met"] == len(streamed) + len(whole)
    batch = [r for r in week if r["slo_class"] == "batch"]
    batch_met = [r for r in batch if r["status"] == 200 and r["e2e_ms"] <= 120_000]
    assert slo["batch"]["met"] == len(batch_met) < len(batch)


def test_cost_model_error_is_the_mean_absolute_percentage_error(written) -> None:
    world, report, _ = written
    gpu = [r for r in in_week(world, world.requests) if r["pool"] == "gpu" and r["status"] == 200]
    expected = np.mean([abs(r["e2e_ms"] - r["predicted_e2e_ms"]) / r["e2e_ms"] for r in gpu])
    observed = {(o["pool"], o["target"]): o for o in report["fleet"]["cost_model"]["observed"]}
    assert observed[("gpu", "e2e")]["mape"] == pytest.approx(expected)
    assert observed[("gpu", "e2e")]["requests"] == len(gpu)


def test_candidate_volume_latency_accuracy_and_errors(written) -> None:
    world, report, _ = written
    (c,) = report["candidates"]
    assert (c["route"], c["candidate"]) == ("chat-8b", "cim")
    shadows = in_week(world, world.shadows)
    sent = [r for r in shadows if r["kind"] == "candidate"]
    answered = [r for r in sent if r["candidate_error"] is None]
    assert c["volume"] == {
        "requests": sum(r["route"] == "chat-8b" for r in in_week(world, world.requests)),
        "shadow_samples": 70,
        "answered": len(answered),
        "dropped": 8,
        "dropped_by_reason": {"concurrency": 5, "rate": 3},
        "noise_samples": 20,
    }
    # Both sides over the answered copies, read from the minutes' sketches within their error.
    for q in (50, 95, 99):
        assert c["latency"]["e2e"]["primary"][f"p{q}"] == pytest.approx(
            np.percentile([r["primary_e2e_ms"] for r in answered], q), rel=SKETCH_RELATIVE_ERROR
        )
        assert c["latency"]["ttft"]["candidate"][f"p{q}"] == pytest.approx(
            np.percentile([r["candidate_ttft_ms"] for r in answered], q),
            rel=SKETCH_RELATIVE_ERROR,
        )
    greedy = [r for r in answered if not r["sampled"]]
    assert c["accuracy"]["greedy"]["exact_match_rate"] == pytest.approx(
        sum(r["exact_match"] for r in greedy) / len(greedy)
    )
    assert c["accuracy"]["greedy"]["noise_exact_match_rate"] == pytest.approx(18 / 20)
    assert c["errors"] == {
        "count": len(sent) - len(answered),
        "rate": pytest.approx((len(sent) - len(answered)) / len(sent)),
        "by_code": {"upstream_timeout": len(sent) - len(answered)},
    }
    daily = c["accuracy"]["daily"]
    assert daily[0]["date"] == "2026-11-23" and len(daily) == 7
    assert sum(d["samples"] for d in daily) == len(answered)


def test_the_accuracy_shows_every_measure_declared_shown_as_declared(written) -> None:
    """Each measure Diff declares shown over pairs is in the report, a rate or a mean of the
    greedy answered copies that have it, beside the floor's."""
    world, report, _ = written
    (c,) = report["candidates"]
    greedy = c["accuracy"]["greedy"]
    copies = [
        r
        for r in in_week(world, world.shadows)
        if r["kind"] == "candidate" and r["candidate_error"] is None and not r["sampled"]
    ]
    assert {"exact_match", "kl_divergence", "semantic_similarity"} <= {n for n, _ in SHOWN}
    for name, shown in SHOWN:
        values = [float(r[name]) for r in copies if r[name] is not None]
        expected = sum(values) / len(values) if values else None
        assert greedy[shown.key(name)] == pytest.approx(expected), name
        assert shown.key(name) == (f"{name}_rate" if shown.rate else f"mean_{name}")
        assert f"noise_{shown.key(name)}" in greedy


def test_energy_and_cost_per_1k_tokens_of_each_side(written) -> None:
    world, report, _ = written
    (c,) = report["candidates"]
    answered = [
        r
        for r in in_week(world, world.shadows)
        if r["kind"] == "candidate" and r["candidate_error"] is None
    ]
    tokens = sum(r["candidate_prompt_tokens"] + r["candidate_completion_tokens"] for r in answered)
    assert c["energy"]["candidate"]["j_per_1k_tokens"] == pytest.approx(
        sum(r["candidate_energy_j"] for r in answered) / tokens * 1000
    )
    assert c["energy"]["primary"]["j_per_request"] == pytest.approx(50.0)
    assert c["cost"]["candidate"]["usd_per_1k_tokens"] == pytest.approx(
        4e-5 * len(answered) / tokens * 1000
    )


def test_worst_disagreements_are_least_similar_and_carry_no_text(written) -> None:
    world, report, _ = written
    (c,) = report["candidates"]
    answered = [
        r
        for r in in_week(world, world.shadows)
        if r["kind"] == "candidate" and r["candidate_error"] is None and not r["exact_match"]
    ]
    least = sorted(answered, key=lambda r: r["similarity"])[:5]
    worst = c["worst_disagreements"]
    assert [w["decision_id"] for w in worst] == [r["decision_id"] for r in least]
    assert not any("primary_text" in w or "candidate_text" in w for w in worst)


def test_projected_savings_price_the_weeks_traffic_on_the_candidate(written) -> None:
    world, report, _ = written
    (c,) = report["candidates"]
    model = CostModel(world.policy)
    servable = [
        r
        for r in in_week(world, world.requests)
        if r["route"] == "chat-8b"
        and r["status"] == 200
        and r["prompt_tokens"] + r["completion_tokens"] <= 4096
    ]
    primary = sum(
        model.predict(
            r["pool"], MODEL, r["prompt_tokens"], r["completion_tokens"], r["concurrent"]
        ).cost_usd
        for r in servable
    )
    candidate = sum(
        model.predict(
            "cim", MODEL, r["prompt_tokens"], r["completion_tokens"], min(r["concurrent"], 4)
        ).cost_usd
        for r in servable
    )
    saved = c["projected_savings"]
    assert saved["requests"] == len(servable)
    assert saved["not_servable"] == 1
    assert saved["cost_usd_saved"] == pytest.approx(primary - candidate)


def test_verdict_is_the_judges_at_the_end_of_the_week_and_said_in_words(written) -> None:
    world, report, db = written
    (c,) = report["candidates"]
    (stored,) = evaluate(db, world.policy, now=world.period.until)
    assert c["verdict"]["outcome"] == stored.outcome
    assert c["verdict"]["reason"] == stored.reason
    plain = {check["name"]: check["plain"] for check in c["verdict"]["checks"]}
    assert plain["failures"].startswith("Failed answers") and "copies failed" in plain["failures"]
    assert "noise floor" in plain["quality"]


def test_change_against_the_previous_week(written) -> None:
    _, report, _ = written
    (c,) = report["candidates"]
    moved = c["change"]["measures"]
    assert moved["shadow_samples"] == {"previous": 10, "change": 60}
    assert moved["exact_match_rate"]["previous"] == 1.0
    assert moved["exact_match_rate"]["change"] == pytest.approx(
        c["accuracy"]["greedy"]["exact_match_rate"] - 1.0
    )
    assert moved["candidate_e2e_p95_ms"]["previous"] == pytest.approx(
        120.0, rel=SKETCH_RELATIVE_ERROR
    )


def test_parking_shows_backends_on_and_parked_by_day_wake_ups_and_energy_saved(
    database: str, tmp_path: Path
) -> None:
    from gateway.db.schema import ParkingEvent, parking_events

    db = connect(database)
    world = build(db)
    day, since = 86400.0, world.period.since
    gpu = len(world.policy.pools["gpu"].backends)
    events = [
        # Parked since the day before the week, woken on its second day, parked on its last.
        ParkingEvent(since - day - 5, "gpu", "gpu-1", "drain", "forecast 0.0"),
        ParkingEvent(since - day, "gpu", "gpu-1", "parked", "forecast 0.0", seconds=5.0),
        ParkingEvent(since + day, "gpu", "gpu-1", "wake", "forecast 30.0", 86400, 1000.0),
        ParkingEvent(since + day + 0.4, "gpu", "gpu-1", "ready", "forecast 30.0", 0.4),
        ParkingEvent(since + 6 * day, "gpu", "gpu-1", "parked", "forecast 0.0", seconds=3.0),
        ParkingEvent(since + 6 * day + 9, "gpu", "gpu-0", "failed", "park: exited 1"),
    ]
    with db.begin() as conn:
        conn.execute(parking_events.insert(), [e.row() for e in events])
    generate(db, world.policy, world.period, tmp_path, now=world.period.until + 3600)
    report = json.loads((tmp_path / "report.json").read_text())
    db.dispose()

    (pool,) = report["parking"]["pools"]
    assert pool["pool"] == "gpu" and pool["backends"] == gpu
    assert [d["parked"] for d in pool["daily"]] == pytest.approx([1, 0, 0, 0, 0, 0, 1])
    assert [d["active"] for d in pool["daily"]] == pytest.approx([gpu - 1] + [gpu] * 5 + [gpu - 1])
    assert pool["parked_mean"] == pytest.approx(2 / 7)
    assert (pool["parks"], pool["wakeups"], pool["failures"]) == (1, 1, 1)
    assert pool["saved_j"] == pytest.approx(1000.0)
    assert pool["wakeup_s_p50"] == pytest.approx(0.4)
    assert [w["reason"] for w in report["parking"]["wakeups"]] == ["forecast 30.0"]
    markdown = (tmp_path / "report.md").read_text()
    assert "## Parking" in markdown and "gpu/gpu-1: forecast 30.0" in markdown
    assert "Wake-ups (1" in (tmp_path / "report.html").read_text()


# The fleet's headline -----------------------------------------------------------------------


def test_the_fleet_leads_with_energy_idle_included_and_cost_as_device_hours_plus_energy(
    written,
) -> None:
    """A week of each day an hour of the GPU on at 150 W, the ASIC parked at 5 W, the CIM part
    estimated at its idle draw (reportworld.draw_rows), priced by policies/default.yaml."""
    world, report, _ = written
    headline = report["fleet"]["headline"]
    kwh = 0.12 / 3.6e6  # USD per joule
    gpu, asic, cim = 7 * 3600 * 150.0, 7 * 3600 * 5.0, 7 * 3600 * 8.0
    assert headline["energy_j"] == pytest.approx(gpu + asic + cim)
    assert headline["energy_j"] == pytest.approx(
        sum(r["energy_j"] for r in in_week(world, world.draw))
    )
    assert headline["estimated_j"] == pytest.approx(cim)
    assert headline["energy_j_per_request"] == pytest.approx((gpu + asic + cim) / 60)
    assert (headline["on_hours"], headline["parked_hours"]) == pytest.approx((14.0, 7.0))
    assert headline["device_hours"] == pytest.approx(21.0)
    hours_usd = 7 * 2.50 + 7 * 0.60 + 7 * 0.20  # a parked device's hours are paid
    assert headline["hours_usd"] == pytest.approx(hours_usd)
    assert headline["cost_usd"] == pytest.approx(hours_usd + (gpu + asic + cim) * kwh)
    assert headline["cost_usd_per_request"] == pytest.approx(headline["cost_usd"] / 60)
    assert headline["carbon_g"] == pytest.approx((gpu + asic + cim) * 390 / 3.6e6)
    pools = {p["pool"]: p for p in headline["pools"]}
    assert pools["asic"]["energy_j"] == pytest.approx(asic)  # parked: only what its meter read
    assert pools["asic"]["cost_usd"] == pytest.approx(7 * 0.60 + asic * kwh)
    assert (pools["asic"]["on_hours"], pools["asic"]["parked_hours"]) == pytest.approx((0, 7))
    # The week before: half an hour of the GPU, over its five requests.
    before = 1800 * 150.0
    change = headline["change"]
    assert change["energy_j"]["previous"] == pytest.approx(before)
    assert change["energy_j"]["change"] == pytest.approx(gpu + asic + cim - before)
    assert change["energy_j_per_request"]["previous"] == pytest.approx(before / 5)
    assert change["cost_usd"]["previous"] == pytest.approx(0.5 * 2.50 + before * kwh)
    assert change["device_hours"]["previous"] == pytest.approx(0.5)
    # Requests' attributed energy, the diagnostic, is far below what the fleet drew.
    assert report["fleet"]["energy_j"] < headline["energy_j"] / 10


def minute(ts: float, pool: str = "gpu", on_s: float = 60.0, j: float = 6000.0, **more) -> dict:
    return {"ts": ts, "pool": pool, "backend": f"{pool}-0", "on_s": on_s, "parked_s": 0.0,
            "energy_j": j, "estimated_j": 0.0} | more  # fmt: skip


def test_energy_is_priced_at_the_tariff_window_in_force_when_it_was_drawn() -> None:
    peak = [
        {"start": "00:00", "end": "14:00", "usd_per_kwh": 0.08, "g_co2_per_kwh": 120},
        {"start": "14:00", "end": "20:00", "usd_per_kwh": 0.40, "g_co2_per_kwh": 650},
    ]
    policy = fleet_policy(tariffs={"site": peak}, asic_extra={"tariff": "site"})
    day = 1_790_035_200.0  # a midnight, UTC
    rows = [minute(day + 14 * 3600 - 60, "asic", j=3.6e6), minute(day + 14 * 3600, "asic", j=3.6e6)]
    figures = fleet_draw(rows, 4, policy, Period(day, day + 86400, "a day"))
    assert figures["energy_usd"] == pytest.approx(0.08 + 0.40)
    assert figures["cost_usd"] == pytest.approx(2 / 60 * 2.5 + 0.08 + 0.40)
    assert figures["carbon_g"] == pytest.approx(120 + 650)
    assert figures["carbon_g_per_request"] == pytest.approx(770 / 4)


def test_a_policy_without_carbon_intensity_has_no_fleet_carbon() -> None:
    day = 1_790_035_200.0
    figures = fleet_draw([minute(day)], 1, fleet_policy(), Period(day, day + 86400, "a day"))
    assert figures["carbon_g"] is None and figures["carbon_g_per_request"] is None
    assert figures["cost_usd"] == pytest.approx(2.5 / 60 + 6000 * 0.12 / 3.6e6)


def test_a_minute_two_replicas_both_recorded_counts_once_and_a_restart_adds_up() -> None:
    day = 1_790_035_200.0
    rows = [
        minute(day, j=6000.0),  # two replicas read the same counter over the same minute
        minute(day, j=6100.0),
        minute(day + 60, on_s=25.0, j=2500.0),  # a replica stopped 25 s in, started again
        minute(day + 60, on_s=35.0, j=3500.0),
        minute(day + 120, on_s=0.0, j=40.0),  # a late reading of a minute already written
    ]
    figures = fleet_draw(rows, 1, fleet_policy(), Period(day, day + 86400, "a day"))
    assert figures["energy_j"] == pytest.approx(6050.0 + 6000.0 + 40.0)
    assert figures["device_hours"] == pytest.approx(2 / 60)
    assert figures["recorded_share"] == pytest.approx(3 * 60 / 86400)


def test_a_period_without_draw_records_says_so_rather_than_zero() -> None:
    day = 1_790_035_200.0
    headline = fleet_headline([], 10, 0, fleet_policy(), Period(day, day + 86400, "a day"))
    assert headline["energy_j"] is None and headline["cost_usd"] is None
    assert headline["energy_j_per_request"] is None
    assert headline["change"]["energy_j"] == {"previous": None, "change": None}


def test_a_released_backends_parked_hours_are_not_paid_and_a_sleeping_ones_are() -> None:
    def parking(mode: str) -> dict:
        return {"parking": {"hook": "command", "mode": mode, "wake_s": 1,
                            "park_command": ["true"], "wake_command": ["true"]}}  # fmt: skip

    day = 1_790_035_200.0
    # An hour of the ASIC parked, its meter reading nothing.
    parked = [minute(day + 60 * m, "asic", on_s=0.0, parked_s=60.0, j=0.0) for m in range(60)]
    period = Period(day, day + 86400, "a day")
    asleep = fleet_draw(parked, 1, fleet_policy(asic_extra=parking("sleep")), period)
    released = fleet_draw(parked, 1, fleet_policy(asic_extra=parking("release")), period)
    assert asleep["parked_hours"] == released["parked_hours"] == pytest.approx(1.0)
    assert asleep["cost_usd"] == pytest.approx(2.5)  # fleet_policy's $2.50 an hour
    assert released["cost_usd"] == 0 and released["device_hours"] == 0
