"""Energy on request records: measured from the pools' DCGM counters, or estimated."""

from __future__ import annotations

import contextlib
import socket
import statistics
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from waiting import wait_for

from gateway.db.connection import connect
from gateway.db.schema import backend_energy
from harness.gateways import run_gateway
from harness.metrics import metric_value
from harness.simulators import start_simulator
from policies import BIG, MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Summarise the roofline model in a few sentences."}]


def counter_j(sim) -> float:
    return metric_value(sim.metrics(), "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") / 1000


def test_records_carry_measured_energy_that_grows_with_work(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu")[:1], sims.urls("asic"), sims.urls("cim"))
    gpu = sims.gpu[0]
    with run_gateway(policy, tmp_path, power_scrape_interval_s=0.25) as gw:
        before = counter_j(gpu)
        client = gw.client()
        for max_tokens in [2, 120] * 4:
            client.chat.completions.create(
                model=BIG, messages=PROMPT, max_tokens=max_tokens, temperature=0
            )
    rows = gw.records(8)
    after = counter_j(gpu)
    assert len(rows) == 8
    assert all(r["energy_j"] > 0 and r["cost_usd"] > 0 for r in rows)
    assert not any(r["energy_estimated"] for r in rows)
    short = [r["energy_j"] for r in rows if r["completion_tokens"] <= 2]
    long = [r["energy_j"] for r in rows if r["completion_tokens"] > 20]
    # Boundaries between readings blur single requests a little; medians do not move.
    assert statistics.median(long) > 4 * statistics.median(short)
    # Attribution never invents energy: the records hold at most what the counter measured.
    assert sum(r["energy_j"] for r in rows) <= after - before


def test_a_record_is_written_when_its_request_ends_and_its_energy_lands_after(
    sims, tmp_path: Path
) -> None:
    """No reading after the request: its record is in the database without energy while the
    gateway serves, and gets its measured energy from the last reading, taken as it stops."""
    policy = fleet_policy(sims.urls("gpu")[:1], sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, power_scrape_interval_s=3600) as gw:
        gw.client().chat.completions.create(model=BIG, messages=PROMPT, max_tokens=20)
        (written,) = gw.records(1, settled=False)
        assert written["status"] == 200 and written["pool"] == "gpu"
        assert written["energy_j"] is None and written["energy_estimated"] is None
    (settled,) = gw.records(1)
    assert settled["energy_estimated"] is False
    assert settled["energy_j"] > 0 and settled["cost_usd"] > 0


def test_energy_and_cost_counters_add_up_to_the_measured_records(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, power_scrape_interval_s=0.2) as gw:
        client = gw.client()
        for model in (BIG, MODEL, BIG):  # the 70B model only fits the GPU; the 8B goes to the ASIC
            client.chat.completions.create(model=model, messages=PROMPT, max_tokens=20)
        rows = gw.records(3)
        text = gw.http().get("/metrics").text
    assert not any(r["energy_estimated"] for r in rows)
    for pool in ("gpu", "asic"):
        served = [r for r in rows if r["pool"] == pool]
        assert served, pool
        energy = metric_value(text, "gateway_energy_joules_total", pool=pool)
        cost = metric_value(text, "gateway_cost_usd_total", pool=pool)
        assert energy == pytest.approx(sum(r["energy_j"] for r in served), rel=1e-5)
        assert cost == pytest.approx(sum(r["cost_usd"] for r in served), rel=1e-9)
        assert cost > 0


def test_concurrent_requests_share_one_interval_by_their_work(sims, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    policy = fleet_policy(sims.urls("gpu")[:1], sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, power_scrape_interval_s=0.5) as gw:
        client = gw.client()

        def ask(max_tokens: int) -> None:
            client.chat.completions.create(
                model=BIG, messages=PROMPT, max_tokens=max_tokens, temperature=0
            )

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(ask, [3, 3, 3, 150, 150, 150]))
    rows = gw.records(6)
    short = [r["energy_j"] for r in rows if r["completion_tokens"] <= 3]
    long = [r["energy_j"] for r in rows if r["completion_tokens"] > 20]
    assert sum(long) > 2 * sum(short)
    assert not any(r["energy_estimated"] for r in rows)


def test_pool_without_power_metrics_gets_estimated_energy(sims, tmp_path: Path) -> None:
    policy = fleet_policy(
        sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), asic_extra={"power_metrics": None}
    )
    with run_gateway(policy, tmp_path) as gw:
        gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)
    (row,) = gw.records(1)
    assert row["pool"] == "asic"
    assert row["energy_estimated"] is True
    assert row["energy_j"] > 0 and row["cost_usd"] > 0


def test_unreachable_power_endpoint_falls_back_to_estimates(sims, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    policy = fleet_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        asic_extra={"backends": [{"url": sims.urls("asic")[0], "metrics_url": dead}]},
    )
    with run_gateway(policy, tmp_path, power_scrape_interval_s=0.05) as gw:
        gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)
        (row,) = gw.records(1)
        metrics = gw.http().get("/metrics").text
    assert row["energy_estimated"] is True
    assert "gateway_power_scrape_failures_total" in metrics


def test_the_fleet_draw_holds_every_joule_the_meter_read_idle_included(
    sims, tmp_path: Path
) -> None:
    """Per backend and minute (backend_energy): the GPU's counter between the gateway's first
    and last readings, idle between requests included; the ASIC, which reports no power,
    estimated and flagged so."""
    policy = fleet_policy(
        sims.urls("gpu")[:1],
        sims.urls("asic"),
        sims.urls("cim"),
        asic_extra={"power_metrics": None},
    )
    gpu = sims.gpu[0]
    outside = (counter_j(gpu), time.time())
    with run_gateway(policy, tmp_path, power_scrape_interval_s=0.1) as gw:
        inside = (counter_j(gpu), time.time())
        client = gw.client()
        for model in (BIG, MODEL, BIG):
            client.chat.completions.create(model=model, messages=PROMPT, max_tokens=20)
        records = gw.records(3)
        inside = (counter_j(gpu) - inside[0], time.time() - inside[1])
    outside = (counter_j(gpu) - outside[0], time.time() - outside[1])
    db = connect(f"sqlite:///{tmp_path / 'gateway.db'}")
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(backend_energy))]
    db.dispose()
    mine = {pool: [r for r in rows if r["pool"] == pool] for pool in ("gpu", "asic", "cim")}
    energy = sum(r["energy_j"] for r in mine["gpu"])
    on_s = sum(r["on_s"] for r in mine["gpu"])
    assert inside[0] <= energy <= outside[0]
    assert inside[1] <= on_s <= outside[1]
    assert not any(r["estimated_j"] or r["parked_s"] for r in mine["gpu"])
    # The requests' attributed energy leaves out the idle draw between them.
    served = sum(r["energy_j"] for r in records if r["pool"] == "gpu")
    assert 0 < served < energy
    asic_on = sum(r["on_s"] for r in mine["asic"])
    asic_j = sum(r["energy_j"] for r in mine["asic"])
    assert inside[1] <= asic_on <= outside[1]
    assert asic_j == pytest.approx(sum(r["estimated_j"] for r in mine["asic"]))
    # Its nominal idle draw while on, and its request's estimate above it.
    (asked,) = (r for r in records if r["pool"] == "asic")
    assert 100 * asic_on < asic_j < 100 * asic_on + asked["energy_j"]


def test_a_parked_backend_counts_what_its_meter_read_asleep_and_nothing_more(
    tmp_path: Path,
) -> None:
    """Two GPUs of the test's own, one parked by vLLM's sleep mode while the gateway runs: its
    minutes hold its time parked and its counter's energy, asleep included, none estimated."""
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(start_simulator("gpu", seed=s)) for s in (1, 2)]
        policy = fleet_policy(
            gpu=[s.url for s in sims],
            routes=[{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"]}],
            gpu_extra={"slots_per_backend": 2, "parking": {"hook": "vllm", "wake_s": 0.4}},
        )
        outside = {s.url: counter_j(s) for s in sims}
        with run_gateway(policy, tmp_path, power_scrape_interval_s=0.1) as gw:
            inside = {s.url: counter_j(s) for s in sims}
            planner = gw.gateway.parker.planner  # windows a test can wait for
            planner.window_s, planner.short_s, planner.hold_s = 3.0, 1.0, 1.0
            gw.gateway.parker.drain_grace_s = 0.3
            gw.gateway.parker.periodic.interval_s = 0.2
            gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8)
            backends = gw.gateway.fleet.pools["gpu"].backends
            parked = wait_for(
                lambda: next((b for b in backends if b.parking == "parked"), None),
                message="no backend was parked",
            )
            inside = {s.url: counter_j(s) - inside[s.url] for s in sims}
        outside = {s.url: counter_j(s) - outside[s.url] for s in sims}
    db = connect(f"sqlite:///{tmp_path / 'gateway.db'}")
    with db.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(backend_energy))]
    db.dispose()
    for b in backends:
        mine = [r for r in rows if r["backend"] == b.name]
        assert inside[b.url] <= sum(r["energy_j"] for r in mine) <= outside[b.url], b.name
        assert not any(r["estimated_j"] for r in mine)
    asleep = sum(r["parked_s"] for r in rows if r["backend"] == parked.name)
    assert asleep > 0
    assert not any(r["parked_s"] for r in rows if r["backend"] != parked.name)
