"""The shadow summary: candidates beside their route's noise floor, filtered by route and time,
read from the shadow minutes."""

from __future__ import annotations

import asyncio

import pytest
from rows import shadow_record

from gateway.db.connection import connect
from gateway.metrics import GatewayMetrics
from gateway.promotion.shadow_minutes import ShadowMinutes
from gateway.promotion.shadow_summary import summarize, summarize_rows
from gateway.shadow.records import ShadowWriter
from gateway.stats import SKETCH_RELATIVE_ERROR


def row(**fields: object) -> dict:
    return shadow_record(0, **fields).row()


def test_summary_reports_candidates_beside_their_routes_noise_floor() -> None:
    rows = [
        row(exact_match=True, similarity=1.0, primary_e2e_ms=10.0, candidate_e2e_ms=30.0),
        row(exact_match=False, similarity=0.5, primary_e2e_ms=20.0, candidate_e2e_ms=50.0),
        row(exact_match=None, similarity=None, candidate_status=None,
            candidate_error="upstream_timeout", candidate_e2e_ms=1500.0),
        row(sampled=True, temperature=0.8, exact_match=False, similarity=0.25),
        row(kind="noise", candidate_pool="gpu", exact_match=True, similarity=1.0),
        row(kind="noise", candidate_pool="gpu", sampled=True, exact_match=False,
            normalized_match=False, similarity=0.5),
        row(candidate_pool="asic", exact_match=True, similarity=1.0),
    ]  # fmt: skip
    drops = [
        {"route": "chat", "candidate_pool": "cim", "kind": "candidate", "count": 3},
        {"route": "chat", "candidate_pool": "cim", "kind": "candidate", "count": 2},
        {"route": "chat", "candidate_pool": "gpu", "kind": "noise", "count": 1},
    ]
    asic, cim = summarize_rows(rows, drops)
    assert (asic["candidate"], asic["samples"], asic["dropped"]) == ("asic", 1, 0)
    assert cim["route"] == "chat" and cim["candidate"] == "cim"
    assert (cim["samples"], cim["dropped"], cim["noise_dropped"]) == (4, 5, 1)
    assert cim["candidate_error_rate"] == 0.25
    assert cim["exact_match_rate"] == pytest.approx(1 / 3)  # the timed-out copy is no answer
    assert cim["mean_similarity"] == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert (cim["noise_samples"], cim["noise_exact_match_rate"]) == (2, 0.5)
    assert cim["noise_mean_similarity"] == 0.75
    # Both sides of the answered copies (10, 20 and 10; 30, 50 and 20), from their sketches.
    assert cim["primary_latency_p50_ms"] == pytest.approx(10.0, rel=SKETCH_RELATIVE_ERROR)
    assert cim["candidate_latency_p50_ms"] == pytest.approx(30.0, rel=SKETCH_RELATIVE_ERROR)
    assert cim["primary_energy_j"] is None  # unknown, not zero
    greedy, sampled = cim["greedy"], cim["sampled"]
    assert (greedy["samples"], greedy["exact_match_rate"], greedy["noise_exact_match_rate"]) == (
        3,
        0.5,
        1.0,
    )
    assert (sampled["samples"], sampled["exact_match_rate"], sampled["noise_samples"]) == (
        1,
        0.0,
        1,
    )


def test_the_noise_floor_is_reported_apart_for_greedy_and_sampled_copies() -> None:
    # On a single-backend pool the A/A copy is the same backend asked again: greedy answers
    # agree, sampled ones differ as a sampled candidate's would.
    same = {
        "kind": "noise",
        "candidate_pool": "asic",
        "primary_pool": "asic",
        "primary_backend": "asic-0",
        "candidate_backend": "asic-0",
    }
    rows = [
        row(exact_match=True, normalized_match=True, similarity=1.0),
        row(sampled=True, temperature=1.0, exact_match=False, normalized_match=False,
            similarity=0.4),
        row(**same, exact_match=True, normalized_match=True, similarity=1.0),
        row(**same, exact_match=True, normalized_match=True, similarity=1.0),
        row(**same, sampled=True, temperature=None, exact_match=False, normalized_match=True,
            similarity=0.6, near_tie=True, semantic_similarity=0.99, kl_divergence=0.02),
        row(**same, sampled=True, temperature=0.7, exact_match=False, normalized_match=False,
            similarity=0.4, near_tie=False, semantic_similarity=0.97),
        row(**same, sampled=True, temperature=0.7, exact_match=None, normalized_match=None,
            similarity=None, candidate_status=None, candidate_error="upstream_timeout"),
    ]  # fmt: skip
    (cim,) = summarize_rows(rows, [])
    floor = {k: v for k, v in cim.items() if k.startswith("noise_") and k != "noise_dropped"}
    assert floor == {
        "noise_samples": 5,
        "noise_exact_match_rate": 0.5,
        "noise_normalized_match_rate": 0.75,
        "noise_mean_similarity": 0.75,
        "noise_near_tie_rate": 0.5,
        "noise_mean_kl_divergence": 0.02,
        "noise_new_number_rate": None,  # none of these rows measured it
        "noise_mean_semantic_similarity": pytest.approx(0.98),
    }
    tolerance = (
        "near_tie_rate",
        "mean_kl_divergence",
        "new_number_rate",
        "mean_semantic_similarity",
    )
    for kind in ("greedy", "sampled"):
        for key in tolerance:
            assert cim[kind].pop(key) is None  # the candidate's copies measured none
    assert [cim["greedy"].pop(f"noise_{key}") for key in tolerance] == [None] * 4
    assert [cim["sampled"].pop(f"noise_{key}") for key in tolerance] == [
        0.5,
        0.02,
        None,
        pytest.approx(0.98),
    ]
    assert cim["greedy"] == {
        "samples": 1,
        "exact_match_rate": 1.0,
        "normalized_match_rate": 1.0,
        "mean_similarity": 1.0,
        "noise_samples": 2,
        "noise_exact_match_rate": 1.0,
        "noise_normalized_match_rate": 1.0,
        "noise_mean_similarity": 1.0,
    }
    assert cim["sampled"] == {
        "samples": 1,
        "exact_match_rate": 0.0,
        "normalized_match_rate": 0.0,
        "mean_similarity": 0.4,
        "noise_samples": 3,  # the timed-out copy was sent, but measured nothing
        "noise_exact_match_rate": 0.0,
        "noise_normalized_match_rate": 0.5,
        "noise_mean_similarity": pytest.approx(0.5),
    }


def test_summary_filters_by_route_candidate_and_time(database: str) -> None:
    db = connect(database)
    writer = ShadowWriter(db, GatewayMetrics(), summaries=ShadowMinutes(lambda _: None))
    writer.add(shadow_record(1, ts=1_000.0))
    writer.add(shadow_record(2, route="other"))
    writer.add(shadow_record(3, candidate_pool="asic"))
    writer.add(shadow_record(4, kind="noise", candidate_pool="gpu"))
    writer.add(shadow_record(5, ts=1_090.0))
    asyncio.run(writer.stop())
    everything = summarize(db)
    assert [(s["route"], s["candidate"]) for s in everything] == [
        ("chat", "asic"),
        ("chat", "cim"),
        ("other", "cim"),
    ]
    (cim,) = summarize(db, route="chat", candidate="cim")
    assert (cim["samples"], cim["noise_samples"]) == (2, 1)
    # Whole minutes from `since`: the copy of the minute from 1,080 s.
    (cim,) = summarize(db, since=1_003.5)
    assert (cim["candidate"], cim["samples"], cim["noise_samples"]) == ("cim", 1, 0)
