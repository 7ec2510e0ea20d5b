"""Upstream credentials: named by the policy, read from the environment, sent to one backend."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import httpx
import pytest
import yaml
from shadowworld import shadow_rows
from waiting import wait_for

from gateway.errors import PolicyError
from gateway.fleet.state import BackendState, Fleet
from gateway.policy import versions
from gateway.policy.credentials import Access
from gateway.policy.load import parse_policy, render_policy
from gateway.runtime import Gateway
from gateway.settings import Settings
from harness.gateways import run_gateway
from harness.metrics import metric_value
from policies import (
    EMBED,
    LOOPBACK_KEY_HOSTS,
    MODEL,
    UPSTREAM_KEYS,
    fleet_policy,
    keyed,
    loopback_access,
)

GPU_KEY = "GATEWAY_UPSTREAM_KEY_GPU"
ASIC_KEY = "GATEWAY_UPSTREAM_KEY_ASIC"
OLD_KEY = "GATEWAY_UPSTREAM_KEY_OLD"
NEW_KEY = "GATEWAY_UPSTREAM_KEY_NEW"
MISSING_KEY = "GATEWAY_UPSTREAM_KEY_MISSING"
ELSEWHERE_KEY = "GATEWAY_UPSTREAM_KEY_ELSEWHERE"
NOT_HERE_KEY = "GATEWAY_UPSTREAM_KEY_NOT_HERE"

TOKEN = "credentials-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
VARIABLES = dict(zip(("gpu", "asic", "cim"), UPSTREAM_KEYS, strict=True))


def test_the_policy_names_a_variable_and_never_quotes_a_pasted_key() -> None:
    with pytest.raises(PolicyError) as refused:
        keyed(fleet_policy(), {"asic": "sk-live-0123456789"})
    (problem,) = refused.value.problems
    assert problem.path == "pools.asic.backends.0.api_key_env"
    assert "names an environment variable" in problem.message
    assert "sk-live-0123456789" not in str(refused.value)


def test_each_backend_carries_its_own_key_and_metrics_get_it_on_its_origin_only() -> None:
    policy = keyed(
        fleet_policy(gpu=["http://127.0.0.1:1"]),
        {"gpu": GPU_KEY, "asic": ASIC_KEY},
    )
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    doc["pools"]["asic"]["backends"][0]["metrics_url"] = "http://127.0.0.1:9400/metrics"
    policy = parse_policy(yaml.safe_dump(doc))
    fleet = Fleet(
        policy,
        loopback_access({GPU_KEY: "g-secret", ASIC_KEY: "a-secret"}),
    )
    gpu, asic, cim = (fleet.pools[name].backends[0] for name in ("gpu", "asic", "cim"))

    assert gpu.headers == {"content-type": "application/json", "authorization": "Bearer g-secret"}
    assert gpu.shadow_headers == gpu.headers | {"x-gateway-shadow": "1"}
    assert gpu.auth == gpu.metrics_auth == {"authorization": "Bearer g-secret"}
    assert asic.auth == {"authorization": "Bearer a-secret"}
    assert asic.metrics_auth == {}, "a separate exporter must not receive the backend's key"
    assert "authorization" not in cim.headers and cim.auth == {}
    assert "secret" not in repr(gpu) + repr(asic)
    # Simulations and tests build fleets without an environment: no credentials at all.
    assert Fleet(policy).pools["gpu"].backends[0].auth == {}


def test_a_reload_keeps_live_state_and_takes_the_new_key() -> None:
    environ = {OLD_KEY: "old", NEW_KEY: "new"}
    fleet = Fleet(keyed(fleet_policy(), {"gpu": OLD_KEY}), loopback_access(environ))
    backend = fleet.pools["gpu"].backends[0]
    backend.in_flight = 3
    after = fleet.reconfigure(keyed(fleet_policy(), {"gpu": NEW_KEY}))
    assert after.pools["gpu"].backends[0] is backend and backend.in_flight == 3
    assert backend.auth == {"authorization": "Bearer new"} and backend.api_key_env == NEW_KEY


def test_a_policy_naming_an_unset_variable_is_refused_before_anything_changes() -> None:
    fleet = Fleet(
        keyed(fleet_policy(), {"gpu": GPU_KEY}),
        loopback_access({GPU_KEY: "g"}),
    )
    backend = fleet.pools["gpu"].backends[0]
    with pytest.raises(PolicyError) as refused:
        fleet.reconfigure(
            keyed(
                fleet_policy(),
                {"gpu": GPU_KEY, "asic": MISSING_KEY},
            )
        )
    assert "backend 'asic-0' of pool 'asic' takes its key from GATEWAY_UPSTREAM_KEY_MISSING" in str(
        refused.value
    )
    assert refused.value.problems[0].path == "pools.asic.backends.0.api_key_env"
    assert backend.name == "gpu-0" and backend.auth == {"authorization": "Bearer g"}
    with pytest.raises(PolicyError, match=MISSING_KEY):
        Fleet(
            keyed(fleet_policy(), {"asic": MISSING_KEY}),
            Access({MISSING_KEY: ""}),
        )


def test_a_gateway_does_not_start_on_a_policy_naming_an_unset_variable(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'gateway.db'}")
    with pytest.raises(PolicyError, match=MISSING_KEY):
        Gateway(settings, keyed(fleet_policy(), {"asic": MISSING_KEY}), environ={})


def test_the_admin_api_refuses_an_unset_key_and_a_replica_without_it_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GPU_KEY, "g-secret")
    first = keyed(fleet_policy(), {"gpu": GPU_KEY})
    lacking = render_policy(
        keyed(
            fleet_policy(),
            {"gpu": GPU_KEY, "asic": ELSEWHERE_KEY},
        )
    )
    with (
        run_gateway(
            first,
            tmp_path,
            admin_token=TOKEN,
            policy_poll_interval_s=0.1,
            upstream_key_hosts={GPU_KEY: ["127.0.0.1"], ELSEWHERE_KEY: ["127.0.0.1"]},
        ) as gw,
        gw.http() as http,
    ):
        checked = http.post("/admin/policy/validate", json={"yaml": lacking}, headers=AUTH).json()
        assert checked["valid"] is False
        (error,) = checked["errors"]
        assert error["path"] == "pools.asic.backends.0.api_key_env"
        assert (
            "GATEWAY_UPSTREAM_KEY_ELSEWHERE, which is not set in this gateway's environment"
            in error["message"]
        )
        assert error["location"].startswith("<request>:")
        put = http.put("/admin/policy", json={"yaml": lacking, "message": "x"}, headers=AUTH)
        assert put.status_code == 422 and put.json()["errors"] == [error]

        # A replica that has the key applied it; this one must not serve it half-keyed.
        versions.record(gw.gateway.db, lacking, "elsewhere", "asic needs a key")
        reloads = "gateway_policy_reloads_total"
        wait_for(
            lambda: metric_value(http.get("/metrics").text, reloads, result="invalid") >= 1,
            message="the replica never looked at version 2",
        )
        assert gw.gateway.policy_version == 1
        assert http.get("/admin/policy", headers=AUTH).json()["version"] == 1


def test_the_cli_warns_of_an_unset_variable_it_cannot_see(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    path = tmp_path / "keyed.yaml"
    path.write_text(render_policy(keyed(fleet_policy(), {"asic": NOT_HERE_KEY})))
    assert main(["policy", "validate", str(path)]) == 0
    assert main(["policy", "validate", str(path), "--strict"]) == 1
    (warning,) = [line for line in capsys.readouterr().out.splitlines() if "NOT_HERE" in line][:1]
    assert f"{path}:" in warning and "pools.asic.backends.0.api_key_env" in warning
    assert f"{NOT_HERE_KEY}, which is not set here" in warning


class BackgroundRounds:
    """Which backends the gateway's health checker probed, and its power scrape rounds, from
    when this is made on."""

    def __init__(self, gateway: Gateway) -> None:
        self.probed: set[str] = set()
        self.scrapes = 0
        probe, scrape = gateway.upstream.probe, gateway.scrape.round

        async def probing(backend: BackendState) -> bool:
            ok = await probe(backend)
            self.probed.add(backend.url)
            return ok

        async def scraping() -> None:
            await scrape()
            self.scrapes += 1

        gateway.upstream.probe = probing  # type: ignore[method-assign]
        gateway.scrape.round = scraping  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"probed {sorted(self.probed)}, {self.scrapes} scrape rounds"


def test_the_key_reaches_every_call_to_a_backend_that_requires_it(
    keyed_sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, key in UPSTREAM_KEYS.items():
        monkeypatch.setenv(variable, key)
    route = {
        "name": "chat",
        "match": {"models": [MODEL]},
        "pools": ["asic", "gpu"],
        # Room for every copy at once: on a busy machine they overlap, and none may be dropped.
        "shadow": [
            {
                "pool": "cim",
                "sample_rate": 1.0,
                "budget": {"max_concurrent": 8, "max_slot_share": 1.0},
            }
        ],
        # Every request's A/A copy too: the ASIC, the pool's only backend, is asked again.
        "noise_floor": {"share": 1.0, "budget": {"max_concurrent": 8, "max_slot_share": 1.0}},
    }
    embed = {"name": "embed", "match": {"models": [EMBED]}, "pools": ["gpu"]}
    policy = keyed(
        fleet_policy(
            keyed_sims.urls("gpu"),
            keyed_sims.urls("asic"),
            keyed_sims.urls("cim"),
            routes=[route, embed],
        ),
        VARIABLES,
    )
    settings = {"power_scrape_interval_s": 0.1, "upstream_key_hosts": LOOPBACK_KEY_HOSTS}
    with run_gateway(policy, tmp_path, **settings) as gw:
        with gw.client() as client:
            for _ in range(3):
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                assert raw.headers["x-gateway-pool"] == "asic"
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            client.embeddings.create(model=EMBED, input="hi")
        records = gw.records(5)
        copies = shadow_rows(gw, 8)
        # Health probes and power scrapes go on meanwhile: wait for a round of each from now.
        background = BackgroundRounds(gw.gateway)
        wait_for(
            lambda: (
                background.probed >= {b.url for b in gw.gateway.fleet.backends()}
                and background.scrapes > 0
            ),
            message=lambda: f"no round of probes and scrapes followed: {background}",
        )
        metrics = httpx.get(gw.url + "/metrics").text
    assert all(r["status"] == 200 and r["attempts"] == 1 for r in records), records
    assert not any(r["energy_estimated"] for r in records), "power scrapes were refused"
    # Each copy was answered by the shadow pool or the ASIC again, each taking only its own key.
    assert (
        sorted((c["kind"], c["candidate_backend"]) for c in copies)
        == [("candidate", "cim-0")] * 4 + [("noise", "asic-0")] * 4
    )
    assert [(c["candidate_status"], c["candidate_error"]) for c in copies] == [(200, None)] * 8
    assert metric_value(metrics, "gateway_backend_ejections_total") == 0
    for sim in keyed_sims.all():
        assert metric_value(sim.metrics(), "sim_unauthorized_requests_total") == 0, sim.url


def test_a_refused_key_is_an_upstream_failure_not_the_clients(
    keyed_sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(GPU_KEY, UPSTREAM_KEYS[GPU_KEY])
    monkeypatch.setenv(ASIC_KEY, "sk-not-the-asic-key")
    routes = [
        {"name": "chat", "match": {"models": [MODEL]}, "pools": ["asic", "gpu"]},
        {"name": "embed", "match": {"models": [EMBED]}, "pools": ["asic"]},
    ]
    policy = keyed(
        fleet_policy(
            keyed_sims.urls("gpu"), keyed_sims.urls("asic"), keyed_sims.urls("cim"), routes=routes
        ),
        {"gpu": GPU_KEY, "asic": ASIC_KEY},
    )
    asic = keyed_sims.asic[0]
    before = asic.metrics()
    caplog.set_level(logging.WARNING, logger="gateway.upstream.client")
    with (
        run_gateway(policy, tmp_path, upstream_key_hosts=LOOPBACK_KEY_HOSTS) as gw,
        gw.http() as http,
    ):
        # The client's own key, even the one the ASIC wants, is never passed upstream.
        asic_key = {"authorization": f"Bearer {UPSTREAM_KEYS['GATEWAY_UPSTREAM_KEY_ASIC']}"}
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        served = http.post("/v1/chat/completions", json=chat, headers=asic_key)
        assert served.status_code == 200 and served.headers["x-gateway-pool"] == "gpu"
        failed = http.post("/v1/embeddings", json={"model": EMBED, "input": "hi"}, headers=asic_key)
        assert failed.status_code == 502, failed.text
        error = failed.json()["error"]
        assert error["code"] == "upstream_error"
        assert "refused the gateway's credentials (401)" in error["message"]
        records = gw.records(2)

        def refused(path: str) -> bool:
            now = metric_value(asic.metrics(), "sim_unauthorized_requests_total", path=path)
            return now > metric_value(before, "sim_unauthorized_requests_total", path=path)

        wait_for(  # health probes and power scrapes, with the wrong key too
            lambda: refused("/health") and refused("/metrics"),
            message="the ASIC never refused a probe and a scrape",
        )
    chat_record = next(r for r in records if r["route"] == "chat")
    assert (chat_record["attempts"], chat_record["pool"]) == (2, "gpu"), chat_record
    assert "refused the key from GATEWAY_UPSTREAM_KEY_ASIC (401)" in caplog.text
    after = asic.metrics()
    for path in ("/v1/chat/completions", "/v1/embeddings", "/health", "/metrics"):
        refused = metric_value(after, "sim_unauthorized_requests_total", path=path)
        assert refused > metric_value(before, "sim_unauthorized_requests_total", path=path), path


@pytest.mark.parametrize("variable", ["DATABASE_URL", "GATEWAY_ADMIN_TOKEN", "OPENAI_API_KEY"])
def test_a_policy_may_take_a_key_only_from_a_gateway_upstream_key_variable(variable: str) -> None:
    with pytest.raises(PolicyError) as refused:
        keyed(fleet_policy(), {"gpu": variable})
    (problem,) = refused.value.problems
    assert problem.path == "pools.gpu.backends.0.api_key_env"
    assert "GATEWAY_UPSTREAM_KEY_" in problem.message and variable in problem.message


def test_a_key_goes_only_to_the_hosts_it_is_bound_to() -> None:
    policy = keyed(fleet_policy(), {"gpu": GPU_KEY, "asic": GPU_KEY})  # asic at 127.0.0.1:2
    bound = Access({GPU_KEY: "g"}, key_hosts={GPU_KEY: ["127.0.0.1:1"]})
    with pytest.raises(PolicyError) as refused:
        Fleet(policy, bound)
    (problem,) = refused.value.problems
    assert problem.path == "pools.asic.backends.0.api_key_env"
    assert "http://127.0.0.1:2" in problem.message and "127.0.0.1:1" in problem.message
    # Bound to the host on any port, both backends may have it.
    anywhere_here = Access({GPU_KEY: "g"}, key_hosts={GPU_KEY: ["127.0.0.1"]})
    assert Fleet(policy, anywhere_here).pools["asic"].backends[0].auth
    # `*` sends it wherever the policy says; bound to no host, it goes nowhere.
    assert Fleet(policy, Access({GPU_KEY: "g"}, key_hosts={GPU_KEY: ["*"]}))
    with pytest.raises(PolicyError) as unbound:
        Fleet(policy, Access({GPU_KEY: "g"}))
    assert {p.path for p in unbound.value.problems} == {
        "pools.gpu.backends.0.api_key_env",
        "pools.asic.backends.0.api_key_env",
    }
    assert (
        "binds to no host: bind it to the hosts it may be sent to, e.g. "
        '{"GATEWAY_UPSTREAM_KEY_GPU": ["127.0.0.1"]}' in str(unbound.value)
    )


def test_with_an_allow_list_every_backend_and_exporter_must_be_on_its_hosts() -> None:
    doc = fleet_policy().model_dump(mode="json", exclude_defaults=True)
    doc["pools"]["gpu"]["backends"][0]["metrics_url"] = "http://exporter.internal:9400/metrics"
    policy = parse_policy(yaml.safe_dump(doc))
    allowed = Access({}, hosts=["127.0.0.1", "*.internal:9400"])
    assert Fleet(policy, allowed)
    with pytest.raises(PolicyError) as refused:
        Fleet(policy, Access({}, hosts=["127.0.0.1:1", "127.0.0.1:2"]))
    paths = {p.path for p in refused.value.problems}
    assert paths == {"pools.gpu.backends.0.metrics_url", "pools.cim.backends.0.url"}


def test_a_policy_applied_through_the_api_cannot_send_a_key_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(GPU_KEY, "g-secret")
    first = keyed(fleet_policy(), {"gpu": GPU_KEY})
    with socket.socket() as elsewhere:  # a server the key must never reach
        elsewhere.bind(("127.0.0.1", 0))
        elsewhere.listen()
        elsewhere.setblocking(False)
        doc = first.model_dump(mode="json", exclude_defaults=True)
        doc["pools"]["asic"]["backends"] = [
            {"url": f"http://127.0.0.1:{elsewhere.getsockname()[1]}", "api_key_env": GPU_KEY}
        ]
        stealing = yaml.safe_dump(doc)
        settings = {"admin_token": TOKEN, "upstream_key_hosts": {GPU_KEY: ["127.0.0.1:1"]}}
        with run_gateway(first, tmp_path, **settings) as gw, gw.http() as http:
            put = http.put("/admin/policy", json={"yaml": stealing, "message": "x"}, headers=AUTH)
            assert put.status_code == 422, put.text
            (error,) = put.json()["errors"]
            assert error["path"] == "pools.asic.backends.0.api_key_env"
            assert http.get("/admin/policy", headers=AUTH).json()["version"] == 1
        with pytest.raises(BlockingIOError):
            elsewhere.accept()  # nothing ever connected


def test_a_policy_applied_through_the_api_keeps_to_the_hosts_backends_may_be_on(
    tmp_path: Path,
) -> None:
    first = fleet_policy()  # every backend on 127.0.0.1
    doc = first.model_dump(mode="json", exclude_defaults=True)
    doc["pools"]["asic"]["backends"] = [{"url": "http://inference.example.com:8000"}]
    doc["pools"]["gpu"]["backends"][0]["engine_metrics_url"] = "http://elsewhere.example:9/m"
    settings = {"admin_token": TOKEN, "upstream_hosts": ["127.0.0.1"]}
    with run_gateway(first, tmp_path, **settings) as gw, gw.http() as http:
        put = http.put(
            "/admin/policy", json={"yaml": yaml.safe_dump(doc), "message": "x"}, headers=AUTH
        )
        version = http.get("/admin/policy", headers=AUTH).json()["version"]
    assert put.status_code == 422, put.text
    assert {e["path"] for e in put.json()["errors"]} == {
        "pools.asic.backends.0.url",
        "pools.gpu.backends.0.engine_metrics_url",
    }
    assert version == 1
