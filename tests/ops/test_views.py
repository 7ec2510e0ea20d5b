"""What the console reads from the admin API: the fleet, traffic, sampled pairs and a what-if,
filled by real traffic through the gateway and the simulators."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
from rows import request_record, shadow_record
from shadowworld import serve, shadow_policy

from gateway.compare.measures import MEASURES
from gateway.db.schema import (
    BackendEnergy,
    backend_energy,
    request_minutes,
    request_records,
    shadow_records,
)
from gateway.policy.load import to_yaml
from gateway.records.minutes import summarize, targets_of
from gateway.stats import SKETCH_RELATIVE_ERROR
from harness.gateways import run_gateway
from harness.metrics import metric_value
from policies import EMBED, MODEL, fleet_policy

TOKEN = "s3cret-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_the_fleet_traffic_and_pairs_views_show_what_the_traffic_did(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=0.0)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        serve(gw, 4)
        fleet = http.get("/admin/fleet", headers=AUTH).json()
        hour = http.get("/admin/traffic", params={"window": "hour"}, headers=AUTH).json()
        bad_window = http.get("/admin/traffic", params={"window": "week"}, headers=AUTH)
        pairs = http.get(
            "/admin/shadow/pairs", params={"route": "chat", "candidate": "cim"}, headers=AUTH
        ).json()
        none = http.get(
            "/admin/shadow/pairs", params={"route": "chat", "candidate": "gpu"}, headers=AUTH
        ).json()

    pools = {p["pool"]: p for p in fleet}
    assert set(pools) == set(policy.pools)
    gpu, cim = pools["gpu"], pools["cim"]
    assert (gpu["kind"], gpu["live"], cim["live"]) == ("gpu", True, False)
    assert gpu["healthy"] == len(gpu["backends"]) == len(sims.urls("gpu"))
    assert gpu["slots"] == sum(b["slots"] for b in gpu["backends"]) > 0
    assert gpu["in_use"] == 0 and gpu["queued"] == 0  # every answer has ended
    # The requests' energy, attributed today, is the GPU pool's: it served them all.
    assert gpu["energy_today_j"] > 0 and cim["energy_today_j"] is None

    (route,) = hour
    assert route["route"] == "chat" and route["requests"] == 4
    assert route["pool_shares"] == {"gpu": 1.0}
    assert route["slo_attainment"] == 1.0
    assert route["energy_j_per_request"] > 0
    assert len(route["series"]) == 12 and sum(b["requests"] for b in route["series"]) == 4
    assert bad_window.status_code == 400 and bad_window.json()["error"]["param"] == "query.window"

    assert len(pairs) == 4 and none == []
    assert all(p["primary_text"] and p["candidate_pool"] == "cim" for p in pairs)
    assert [p["ts"] for p in pairs] == sorted((p["ts"] for p in pairs), reverse=True)


def test_traffic_judges_embeddings_and_unstreamed_chat_on_their_whole_answer(
    sims, tmp_path: Path
) -> None:
    # Interactive: 500 ms to the first token, 50 ms per token after it, no end-to-end target.
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        client = gw.client()
        for _ in range(3):  # fast: a few milliseconds each, well within 500
            client.embeddings.create(model=EMBED, input="how fast is an embedding")
        gw.records(3)
        for sim in sims.all():
            sim.set_faults(added_latency_ms=700)
        client.embeddings.create(model=EMBED, input="and a slow one")  # past 500 ms
        # Not streamed, 700 ms in all: within 500 + 19 × 50 for 20 tokens, past 500 + 50 for 2.
        for tokens in (20, 2):
            answer = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Say something."}],
                max_tokens=tokens,
                extra_body={"ignore_eos": True},
            )
            assert answer.usage is not None and answer.usage.completion_tokens == tokens
        records = gw.records(6)
        routes = {
            r["route"]: r
            for r in http.get("/admin/traffic", params={"window": "hour"}, headers=AUTH).json()
        }
        text = http.get("/metrics").text

    assert all(r["status"] == 200 and r["ttft_ms"] is None for r in records)
    embeddings, chat = routes["embeddings"], routes["chat-8b-short"]
    assert embeddings["requests"] == 4 and embeddings["slo_attainment"] == 0.75
    assert chat["requests"] == 2 and chat["slo_attainment"] == 0.5
    # What the SLO was judged on is shown: the whole answer's time, none to a first token.
    assert embeddings["ttft_p50_ms"] is None and chat["ttft_p50_ms"] is None
    assert 0 < embeddings["e2e_p50_ms"] < 500 < embeddings["e2e_p95_ms"]
    # Read from the minutes' latency sketches, within their stated error.
    assert 700 * (1 - SKETCH_RELATIVE_ERROR) <= chat["e2e_p50_ms"] <= chat["e2e_p95_ms"]
    # The live metric judges by the same rule.
    labels = {"route": "chat-8b-short", "slo_class": "interactive"}
    assert metric_value(text, "gateway_slo_requests_total", result="met", **labels) == 1
    assert metric_value(text, "gateway_slo_requests_total", result="missed", **labels) == 1
    labels["route"] = "embeddings"
    assert metric_value(text, "gateway_slo_requests_total", result="met", **labels) == 3


def test_a_pair_marks_where_its_answers_part_in_each_text(tmp_path: Path) -> None:
    far = shadow_policy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], ["http://127.0.0.1:3"])
    with run_gateway(far, tmp_path, admin_token=TOKEN) as gw:
        row = shadow_record(
            1,
            route="chat",
            candidate_pool="cim",
            primary_text="The cat sat on the mat.",
            candidate_text="The cat sat, as cats do, on a mat.",
            text_expires_at=time.time() + 3600,  # as the mirror sets it beside stored texts
            exact_match=False,
            first_divergence=3,  # the 4th word token: "on" against ","
            json_diff={"changed": ["/a"]},
            measures={"bleu": 0.25},
        ).row()
        with gw.gateway.db.begin() as conn:
            conn.execute(shadow_records.insert(), [row])
        with gw.http() as http:
            (pair,) = http.get(
                "/admin/shadow/pairs", params={"route": "chat", "candidate": "cim"}, headers=AUTH
            ).json()
    assert pair["divergence_offsets"] == [12, 11]
    assert pair["primary_text"][12:].startswith("on") and pair["candidate_text"][11] == ","
    # Every measure a shadow record holds, as the comparators wrote it.
    assert list(pair["diff"]) == list(MEASURES)
    assert pair["diff"]["first_divergence"] == 3 and pair["diff"]["exact_match"] is False
    assert pair["diff"]["json_diff"] == {"changed": ["/a"]}
    assert pair["diff"]["measures"] == {"bleu": 0.25}


def test_what_if_replays_recorded_traffic_under_a_proposed_policy(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=0.0)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        serve(gw, 6)
        doc = policy.model_dump(mode="json", exclude_defaults=True)
        doc["routes"][0]["pools"] = ["asic", "gpu"]  # the ASIC first
        proposed = to_yaml(doc)
        run = http.post(
            "/admin/policy/simulate", json={"yaml": proposed, "days": 1}, headers=AUTH, timeout=300
        )
        invalid = http.post(
            "/admin/policy/simulate", json={"yaml": "pools: {}\n"}, headers=AUTH, timeout=60
        )
        unchanged = http.get("/admin/policy", headers=AUTH).json()
    assert run.status_code == 200, run.text
    result = run.json()
    assert result["requests"] == 6
    # The answer names its sample: all six, out of the period's six, the period replayed whole.
    assert result["sample"]["requests"] == result["sample"]["period_requests"] == 6
    assert result["sample"]["whole"] and result["sample"]["windows"] == 1
    shares = result["change"]["pool_shares"]
    # The route serves from the GPU now; proposed, every request goes to the ASIC.
    assert shares == {"active": {"gpu": 1.0, "asic": 0.0}, "proposed": {"gpu": 0.0, "asic": 1.0}}
    assert {"energy_j_per_request", "cost_usd_per_1k_tokens", "slo_attainment"} <= set(
        result["change"]
    )
    # An invalid policy is refused with its errors where they are, and nothing is applied.
    assert invalid.status_code == 422 and invalid.json()["errors"][0]["location"]
    assert unchanged["version"] == gw.gateway.policy_version


def test_advancing_rollouts_now_moves_only_a_step_that_is_due(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=0.0)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        idle = http.post("/admin/promotions/advance", headers=AUTH)
        started = http.post(
            "/admin/promotions/apply",
            json={"route": "chat", "candidate": "cim", "force": True,
                  "override_precision_gate": True},
            headers=AUTH,
        )  # fmt: skip
        early = http.post("/admin/promotions/advance", headers=AUTH)
        rollouts = http.get("/admin/rollouts", headers=AUTH).json()
    assert idle.status_code == 200 and idle.json() == []
    assert started.status_code == 200, started.text
    # Its first step has only just begun: nothing is due, so nothing moves.
    assert early.status_code == 200 and early.json() == []
    (rollout,) = rollouts
    assert (rollout["route"], rollout["candidate"], rollout["state"]) == ("chat", "cim", "rolling")
    assert rollout["weight"] > 0


def draw_minutes(until: float) -> list[dict]:
    """Half an hour of the GPU on at 200 W in the last hour, ten minutes the hour before; ten
    minutes' margin at each edge, so a minute passing while the test runs changes nothing."""
    rows = [
        BackendEnergy(until - 3000 + 60 * m, "gpu", "gpu-0", 60.0, 0.0, 60 * 200.0, 0.0).row()
        for m in range(30)
    ]
    rows += [
        BackendEnergy(until - 6600 + 60 * m, "gpu", "gpu-0", 60.0, 0.0, 60 * 200.0, 0.0).row()
        for m in range(10)
    ]
    return rows


def test_fleet_energy_is_the_reports_headline_over_the_last_hour(tmp_path: Path) -> None:
    far = fleet_policy()  # no backend answers: only the rows stored here count
    # A scrape round an hour apart: the gateway's own draw ends no minute while the test runs.
    with run_gateway(far, tmp_path, admin_token=TOKEN, power_scrape_interval_s=3600) as gw:
        until = math.floor(time.time() / 60) * 60
        requests = [dataclasses.replace(request_record(n), ts=until - 1800 + n) for n in range(4)]
        with gw.gateway.db.begin() as conn:
            conn.execute(backend_energy.insert(), draw_minutes(until))
            conn.execute(request_records.insert(), [r.row() for r in requests])
            # Their minutes, as the writer writes them beside the records.
            rows = summarize([r.row() for r in requests], targets_of(far))
            conn.execute(request_minutes.insert(), [m.row() for m in rows])
        with gw.http() as http:
            hour = http.get("/admin/fleet/energy", params={"window": "hour"}, headers=AUTH).json()
            week = http.get("/admin/fleet/energy", params={"window": "week"}, headers=AUTH)
    energy = 1800 * 200.0
    assert hour["energy_j"] == pytest.approx(energy)
    assert hour["energy_j_per_request"] == pytest.approx(energy / 4)
    assert hour["device_hours"] == pytest.approx(0.5)
    # fleet_policy's GPU: $2.50 an hour, $0.12 per kWh, no carbon intensity.
    assert hour["cost_usd"] == pytest.approx(0.5 * 2.5 + energy * 0.12 / 3.6e6)
    assert hour["carbon_g"] is None
    assert hour["change"]["energy_j"] == {"previous": 600 * 200.0, "change": energy - 120_000}
    assert hour["change"]["energy_j_per_request"]["previous"] is None  # no request then
    assert [p["pool"] for p in hour["pools"]] == ["gpu"]
    assert week.status_code == 400
