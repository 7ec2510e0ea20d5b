"""Tariffs: a pool's electricity priced and its carbon counted by time of day, live and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.policy.load import parse_policy, to_yaml
from gateway.policy.tariffs import Rate, rate_at
from gateway.policy.versions import PolicyVersion
from gateway.runtime import Gateway
from gateway.settings import Settings
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

PEAK = [
    {"start": "00:00", "end": "14:00", "usd_per_kwh": 0.08, "g_co2_per_kwh": 120},
    {"start": "14:00", "end": "20:00", "usd_per_kwh": 0.40, "g_co2_per_kwh": 650},
]


def with_tariff(windows: list[dict], pool: str = "asic", **pool_extra: object):
    extra = {"tariff": "site", **pool_extra}
    return fleet_policy(
        tariffs={"site": windows}, asic_extra=extra if pool == "asic" else pool_extra
    )


def test_the_window_in_force_sets_the_rate_and_the_price_holds_outside_them() -> None:
    policy = with_tariff(
        PEAK, price={"usd_per_hour": 0.6, "usd_per_kwh": 0.2, "g_co2_per_kwh": 300}
    )
    at = lambda hhmm: rate_at(policy, "asic", int(hhmm[:2]) * 3600 + int(hhmm[3:]) * 60)  # noqa: E731
    assert at("00:00") == Rate(0.08, 120)
    assert at("13:59") == Rate(0.08, 120)
    assert at("14:00") == Rate(0.40, 650)  # a window starts where the last ends
    assert at("20:00") == Rate(0.2, 300)  # past every window: the pool's own price
    assert rate_at(policy, "asic", 86400 + 15 * 3600) == Rate(0.40, 650)  # the next day's
    assert rate_at(policy, "gpu", 15 * 3600) == Rate(0.12, 0.0)  # no tariff


@pytest.mark.parametrize(
    ("windows", "path", "words"),
    [
        ([{**PEAK[0], "end": "15:00"}, PEAK[1]], "tariffs.site.1.start", "overlap at 14:00"),
        ([{**PEAK[0], "start": "14:00", "end": "10:00"}], "tariffs.site.0.end", "not after"),
        ([{**PEAK[0], "start": "7am"}], "tariffs.site.0.start", "HH:MM"),
    ],
)
def test_a_schedule_that_is_no_day_is_refused_at_its_window(
    windows: list[dict], path: str, words: str
) -> None:
    with pytest.raises(PolicyError) as refused:
        with_tariff(windows)
    assert any(p.path == path and words in p.message for p in refused.value.problems), refused


def test_a_pool_naming_no_defined_tariff_is_refused() -> None:
    doc = fleet_policy().model_dump(mode="json", exclude_defaults=True)
    doc["pools"]["asic"]["tariff"] = "site-b"
    with pytest.raises(PolicyError) as refused:
        parse_policy(to_yaml(doc), "p.yaml")
    (problem,) = refused.value.problems
    assert (
        problem.path == "pools.asic.tariff" and "'site-b', which is not defined" in problem.message
    )


def test_a_live_router_prices_energy_at_the_tariff_in_force(sims, tmp_path: Path) -> None:
    """All day long the ASIC's site pays $200/kWh: the cost ranking sends chat to the GPU,
    explain shows the rate it used, and the answer carries its carbon estimate."""
    urls = (sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    routes = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"],
               "fallback": "gpu", "objective": "min_cost"}]  # fmt: skip
    expensive = [{"start": "00:00", "end": "24:00", "usd_per_kwh": 200.0, "g_co2_per_kwh": 800}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    served = {}
    card = {  # an efficient inference card, as the default policy describes it
        "power": {"idle_w": 25, "max_w": 150},
        "price": {"usd_per_hour": 0.6, "usd_per_kwh": 0.12},
        "precision": "int8",
    }
    for name, tariffs in (("cheap", {}), ("expensive", {"site": expensive})):
        extra = {"tariff": "site"} if tariffs else {}
        policy = fleet_policy(*urls, routes=routes, tariffs=tariffs, asic_extra=card | extra)
        (tmp_path / name).mkdir()
        with run_gateway(policy, tmp_path / name, admin_token="t") as gw, gw.http() as http:
            raw = gw.client().chat.completions.with_raw_response.create(**body)
            explained = http.post(
                "/admin/explain", json={"body": body}, headers={"authorization": "Bearer t"}
            ).json()
        served[name] = (raw.headers["x-gateway-pool"], float(raw.headers["x-gateway-carbon-g"]))
        assert explained["decision"]["pool"] == served[name][0]
        assert explained["pools"]["asic"]["tariff"] == (extra.get("tariff"))
        if tariffs:
            assert explained["pools"]["asic"]["rate"] == {
                "usd_per_kwh": 200.0,
                "g_co2_per_kwh": 800.0,
            }
    assert served["cheap"][0] == "asic" and served["expensive"][0] == "gpu"


def test_the_serving_gateway_prices_at_the_tariff_a_reloaded_policy_gives(tmp_path: Path) -> None:
    """A pool without a tariff keeps its price's rate until a policy version gives it one."""
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    plain = fleet_policy()
    gateway = Gateway(Settings(database_url=url, spill_dir=tmp_path / "spill"), plain)
    assert gateway.rate("asic") == rate_at(plain, "asic", 0) == Rate(0.12, 0.0)
    # A whole day in one window, so the rate does not hang on the hour the test runs at.
    day = [{"start": "00:00", "end": "24:00", "usd_per_kwh": 0.40, "g_co2_per_kwh": 650}]
    tariffed = with_tariff(day)
    gateway.use_policy(tariffed, PolicyVersion(2, "", "", "test", 0.0, "a tariff"))
    assert gateway.rate("asic") == Rate(0.40, 650)
    assert gateway.rate("gpu") == Rate(0.12, 0.0)
    with pytest.raises(KeyError):
        gateway.rate("tpu")
