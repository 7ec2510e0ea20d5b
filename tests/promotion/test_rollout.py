"""Progressive rollout: a candidate takes a route step by step, and a breach takes it back."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from rows import request_record, shadow_record

from gateway.db.connection import connect
from gateway.db.schema import request_records, shadow_minutes, shadow_records
from gateway.policy.load import load_policy
from gateway.promotion.rollout import Guards, guards, next_move, promoted, with_canary
from gateway.promotion.shadow_minutes import compact, summarize
from harness.gateways import GatewayServer, run_gateway
from policies import MODEL, fleet_policy
from realfleet.shim import Shim

TOKEN = "rollout-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PROMPT = [{"role": "user", "content": "Describe a compute-in-memory crossbar."}]
PROMOTION = {
    "rollout_steps": [0.5, 1.0],
    "step_minutes": 0.005,  # 0.3 s per step
    "guard_min_requests": 4,
    "guard_min_slo_attainment": 0.5,
}


def world(sims):
    routes = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}]
    return fleet_policy(
        sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), routes=routes, promotion=PROMOTION
    )


def rollout_state(gw: GatewayServer) -> dict:
    with gw.http() as http:
        return http.get("/admin/rollouts", headers=AUTH).json()[-1]


def drive(gw: GatewayServer, until: str, seconds: float = 60.0) -> dict[str, int]:
    """Send requests until the rollout reaches a state; return which pools served them."""
    client, pools = gw.client(), {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=4
            )
            pool = raw.headers["x-gateway-pool"]
            pools[pool] = pools.get(pool, 0) + 1
        except Exception:
            pools["error"] = pools.get("error", 0) + 1
        if rollout_state(gw)["state"] == until:
            return pools
    raise AssertionError(f"the rollout did not reach {until}: {rollout_state(gw)}")


def test_guards_decide_advance_wait_and_rollback() -> None:
    policy = load_policy(Path(__file__).resolve().parents[2] / "policies/default.yaml")
    ok = Guards(requests=100, errors=0, slo_met=100, compared=50, agreed=49)
    assert next_move(ok, policy, elapsed_s=3600)[0] == "advance"
    assert next_move(ok, policy, elapsed_s=60)[0] == "wait"
    failing = Guards(requests=100, errors=5, slo_met=95, compared=0, agreed=0)
    assert next_move(failing, policy, elapsed_s=60) == ("rollback", "error rate 0.050 > 0.01")
    slow = Guards(requests=100, errors=0, slo_met=80, compared=0, agreed=0)
    assert next_move(slow, policy, elapsed_s=3600)[0] == "rollback"
    drifting = Guards(requests=100, errors=0, slo_met=100, compared=40, agreed=30)
    assert "agreement" in next_move(drifting, policy, elapsed_s=3600)[1]
    quiet = Guards(requests=3, errors=0, slo_met=3, compared=0, agreed=0)
    assert next_move(quiet, policy, elapsed_s=3600)[0] == "wait"


def test_guards_judge_each_canary_request_by_its_endpoint(database: str) -> None:
    # Interactive: 500 ms to the first token and 50 ms per token after it.
    policy = fleet_policy()
    served = [
        ("embeddings", False, None, None, 30.0, None),  # met: its whole answer within 500 ms
        ("embeddings", False, None, None, 800.0, None),  # missed
        ("chat", False, None, None, 1_400.0, 20),  # met: within 500 + 19 × 50
        ("chat", False, None, None, 1_400.0, 2),  # missed: past 500 + 50
        ("chat", True, 120.0, 20.0, 1_400.0, 20),  # met: streamed, first token and per token
    ]
    rows = [
        dataclasses.replace(
            request_record(n),
            route="chat",
            pool="asic",
            first_pool="asic",
            endpoint=endpoint,
            stream=stream,
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=e2e,
            completion_tokens=tokens,
        ).row()
        for n, (endpoint, stream, ttft, tpot, e2e, tokens) in enumerate(served)
    ]
    db = connect(database)
    with db.begin() as conn:
        conn.execute(request_records.insert(), rows)
    measured = guards(db, policy, "chat", "asic", since=0.0)
    db.dispose()
    assert (measured.requests, measured.errors, measured.slo_met) == (5, 0, 3)


def store_copies(db: sa.Engine, copies: list[dict[str, Any]], *, records: bool) -> None:
    """Store reverse copies as the shadow writer leaves them once settled: their minutes (and,
    with `records`, the shadow records they were folded from)."""
    with db.begin() as conn:
        if records:
            conn.execute(shadow_records.insert(), copies)
        minutes = summarize(({**c, "slo_class": None} for c in copies), lambda _: None)
        conn.execute(shadow_minutes.insert(), [m.row() for m in minutes])


def reverse_copy(n: int, **fields: Any) -> dict[str, Any]:
    """A copy of a canary's (asic's) request to the former primary (gpu), which matched."""
    values: dict[str, Any] = {"exact_match": True, "similarity": 1.0, "reference_words": 40}
    values.update(fields)
    return shadow_record(n, primary_pool="asic", candidate_pool="gpu", **values).row()


def test_the_agreement_guard_forgives_a_benign_flip_and_not_a_confident_one(database: str) -> None:
    # The canary (asic) is the primary of its reverse copies to the former primary (gpu).
    flips = [
        (True, 0.0),  # a near tie the distributions reached alike: agrees
        (True, 10.0),  # a near tie after the distributions moved: departs
        (False, 0.0),  # a confident token replaced: departs
    ]
    rows = [
        reverse_copy(
            n,
            exact_match=False,
            near_tie=tie,
            kl_divergence=kl,
            similarity=0.5,
            semantic_similarity=0.3,
            first_divergence=2,
        )
        for n, (tie, kl) in enumerate(flips)
    ]
    db = connect(database)
    store_copies(db, rows, records=True)
    # Settled: read from the shadow minutes; within the last minutes: from the records.
    settled = guards(db, fleet_policy(), "chat", "asic", since=0.0)
    recent = guards(db, fleet_policy(), "chat", "asic", since=0.0, now=1_000.0 + 10)
    db.dispose()
    assert (settled.compared, settled.agreed) == (recent.compared, recent.agreed) == (3, 1)


def test_a_bad_canary_trips_the_guards_read_from_the_shadow_minutes(database: str) -> None:
    """The reverse sample is read from the shadow minutes alone (no shadow record is stored):
    a canary whose answers fail, or depart from the former primary's, is rolled back; the
    former primary's own failures are not held against it."""
    policy = fleet_policy()
    since = 1_000.0
    requests = [
        dataclasses.replace(
            request_record(n), ts=since + n, route="chat", pool="asic", first_pool="asic"
        ).row()
        for n in range(40)
    ]
    healthy = [reverse_copy(n) for n in range(40)]
    failing = [  # the canary answered empty on one request in eight
        reverse_copy(n, primary_failure="empty" if n % 8 == 0 else None) for n in range(40)
    ]
    departing = [  # a confident change of meaning on one copy in four
        reverse_copy(n, exact_match=False, similarity=0.2, semantic_similarity=0.3)
        if n % 4 == 0
        else reverse_copy(n)
        for n in range(40)
    ]
    former_failing = [  # the former primary answered empty: not the canary's doing
        reverse_copy(n, failure="empty" if n % 8 == 0 else None) for n in range(40)
    ]
    moves = {}
    for name, copies in (
        ("healthy", healthy),
        ("failing", failing),
        ("departing", departing),
        ("former_failing", former_failing),
    ):
        db = connect(database)
        with db.begin() as conn:
            conn.execute(request_records.delete())
            conn.execute(shadow_minutes.delete())
            conn.execute(request_records.insert(), requests)
        store_copies(db, copies, records=False)
        measured = guards(db, policy, "chat", "asic", since=since)
        # Compacted into the hour and the day that began before the step, they are its still.
        compact(db, since + 3600 + 600)
        assert guards(db, policy, "chat", "asic", since=since) == measured, name
        compact(db, since + 3 * 86400)
        assert guards(db, policy, "chat", "asic", since=since) == measured, name
        db.dispose()
        assert measured.requests == 40 and measured.copies == 40, name
        moves[name] = next_move(measured, policy, elapsed_s=3600)
    assert moves["healthy"] == ("advance", "guards pass")
    assert moves["failing"] == ("rollback", "error rate 0.125 > 0.01")
    assert moves["departing"] == ("rollback", "agreement 0.750 < 0.95")
    assert moves["former_failing"] == ("advance", "guards pass")


def test_policy_edits_add_the_canary_and_finish_the_promotion() -> None:
    doc = {
        "pools": {"gpu": {"live": True}, "cim": {"live": False}},
        "routes": [
            {"name": "chat", "pools": ["gpu"], "shadow": [{"pool": "cim", "sample_rate": 0.2}]}
        ],
    }
    with_canary(doc, "chat", "cim", 0.05)
    route = doc["routes"][0]
    assert route["canary"] == {"pool": "cim", "weight": 0.05}
    assert {"pool": "gpu", "sample_rate": 0.1} in route["shadow"]  # the reverse sample
    promoted(doc, "chat", "cim")
    assert route["pools"] == ["cim", "gpu"] and "canary" not in route
    assert doc["pools"]["cim"]["live"] is True
    assert [s["pool"] for s in route["shadow"]] == ["gpu"]


def test_a_healthy_candidate_steps_up_to_all_of_the_route(sims, tmp_path: Path) -> None:
    with (
        run_gateway(
            world(sims),
            tmp_path,
            admin_token=TOKEN,
            rollout_check_interval_s=0.1,
            policy_poll_interval_s=0.1,
        ) as gw,
        gw.http() as http,
    ):
        started = http.post(
            "/admin/promotions/apply",
            json={"route": "chat", "candidate": "asic", "force": True},
            headers=AUTH,
        )
        assert started.status_code == 200, started.text
        assert started.json()["weight"] == 0.5
        served = drive(gw, "complete")
        after = drive_pools(gw, 5)
        history = rollout_state(gw)["history"]
        versions = http.get("/admin/policy/versions", headers=AUTH).json()
    assert served.get("asic", 0) > 0 and "error" not in served
    assert after == {"asic": 5}
    assert [h["event"] for h in history] == ["started", "advance", "promoted"]
    # Seed, 50%, 100%, promoted: every step is an audited policy version.
    assert versions["active"] == 4 and len(versions["versions"]) == 4


def drive_pools(gw: GatewayServer, n: int) -> dict[str, int]:
    pools: dict[str, int] = {}
    for _ in range(n):
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=4
        )
        pools[raw.headers["x-gateway-pool"]] = pools.get(raw.headers["x-gateway-pool"], 0) + 1
    return pools


def test_a_failing_candidate_is_rolled_back_and_the_reason_recorded(sims, tmp_path: Path) -> None:
    sims.asic[0].set_faults(error_rate=1.0)
    with (
        run_gateway(
            world(sims),
            tmp_path,
            admin_token=TOKEN,
            rollout_check_interval_s=0.1,
            policy_poll_interval_s=0.1,
            # Probes failing too would eject the canary before any request reached it, and a
            # canary given no requests waits: the guards must see the canary's own failures.
            health_check_interval_s=3600,
        ) as gw,
        gw.http() as http,
    ):
        http.post(
            "/admin/promotions/apply",
            json={"route": "chat", "candidate": "asic", "force": True},
            headers=AUTH,
        )
        served = drive(gw, "rolled_back")
        state = rollout_state(gw)
        after = drive_pools(gw, 4)
    assert "error" not in served  # the fallback kept every client answered meanwhile
    assert state["weight"] == 0.0
    assert state["history"][-1]["event"] == "rollback"
    assert "error rate" in state["history"][-1]["reason"]
    assert after == {"gpu": 4}


def test_a_rollout_needs_a_promote_verdict_unless_forced(sims, tmp_path: Path) -> None:
    with run_gateway(world(sims), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        refused = http.post(
            "/admin/promotions/apply", json={"route": "chat", "candidate": "asic"}, headers=AUTH
        )
    assert refused.status_code == 409
    assert "not 'promote'" in refused.json()["error"]["message"]


@pytest.fixture(autouse=True)
def _no_leftover_faults(sims):
    yield
    for sim in sims.all():
        sim.reset_faults()


def test_a_canary_answering_empty_is_rolled_back_on_its_reverse_sample(
    sims, tmp_path: Path
) -> None:
    # The canary answers every request with status 200 and no text: no error for the request
    # records to count, but its reverse shadow sample shows the answers failed.
    promotion = {**PROMOTION, "guard_min_requests": 40}
    with Shim(sims.urls("asic")[0], "empty", share=1.0).running() as shim:
        routes = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}]
        policy = fleet_policy(
            sims.urls("gpu"), [shim.url], sims.urls("cim"), routes=routes, promotion=promotion
        )
        with (
            run_gateway(
                policy,
                tmp_path,
                admin_token=TOKEN,
                rollout_check_interval_s=0.1,
                policy_poll_interval_s=0.1,
            ) as gw,
            gw.http() as http,
        ):
            http.post(
                "/admin/promotions/apply",
                json={"route": "chat", "candidate": "asic", "force": True},
                headers=AUTH,
            )
            drive(gw, "rolled_back")
            state = rollout_state(gw)
    assert shim.failed > 0
    assert state["history"][-1]["event"] == "rollback"
    assert "error rate" in state["history"][-1]["reason"]
