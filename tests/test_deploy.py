"""The deployment files agree with the code: compose, nginx, Prometheus, Grafana, Docker, make."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gateway.metrics import GatewayMetrics
from gateway.policy import load_policy
from gateway.routing.fleet import Fleet
from gateway.settings import Settings
from policies import fleet_policy

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def setting_names() -> set[str]:
    names = set()
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        names.update(getattr(alias, "choices", []))
    return names


def test_compose_has_the_whole_stack(compose: dict) -> None:
    assert {
        "postgres",
        "redis",
        "migrate",
        "gateway-1",
        "gateway-2",
        "lb",
        "sim-gpu-0",
        "sim-gpu-1",
        "sim-asic-0",
        "sim-cim-0",
        "prometheus",
        "grafana",
    } <= set(compose["services"])


def test_gateway_environment_uses_only_real_settings(compose: dict) -> None:
    known = setting_names()
    for name in ("gateway-1", "gateway-2", "migrate"):
        env = compose["services"][name]["environment"]
        assert set(env) <= known, set(env) - known
    env = compose["services"]["gateway-1"]["environment"]
    assert env["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["DATABASE_URL"] == compose["services"]["migrate"]["environment"]["DATABASE_URL"]
    assert "${GATEWAY_ADMIN_TOKEN:?" in env["GATEWAY_ADMIN_TOKEN"]  # no placeholder secret


def test_compose_policy_is_the_default_fleet_on_simulator_services(compose: dict) -> None:
    env = compose["services"]["gateway-1"]["environment"]
    path = ROOT / env["GATEWAY_POLICY"].removeprefix("/app/")
    compose_policy, default = load_policy(path), load_policy(ROOT / "policies/default.yaml")
    assert compose_policy.routes == default.routes
    assert compose_policy.slo_classes == default.slo_classes
    for name, pool in compose_policy.pools.items():
        assert pool.model_dump(exclude={"backends"}) == default.pools[name].model_dump(
            exclude={"backends"}
        )
        for backend in pool.backends:
            host, port = re.match(r"http://([\w-]+):(\d+)$", backend.url).groups()  # type: ignore[union-attr]
            command = compose["services"][host]["command"]
            assert command[command.index("--profile") + 1] == pool.kind
            assert command[command.index("--port") + 1] == port
            assert command[command.index("--host") + 1] == "0.0.0.0"


def test_load_balancer_and_prometheus_reach_every_replica(compose: dict) -> None:
    nginx = (ROOT / "deploy/nginx.conf").read_text()
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for s in job["static_configs"]
        for t in s["targets"]
    }
    port = compose["services"]["gateway-1"]["environment"]["GATEWAY_PORT"]
    for name in ("gateway-1", "gateway-2"):
        assert f"server {name}:{port}" in nginx
        assert f"{name}:{port}" in targets
    for name, service in compose["services"].items():
        if name.startswith("sim-"):
            sim_port = service["command"][service["command"].index("--port") + 1]
            assert f"{name}:{sim_port}" in targets
    assert compose["services"]["lb"]["ports"] == [f"{port}:{port}"]


def test_dashboard_queries_only_metrics_the_gateway_exports() -> None:
    metrics = GatewayMetrics()
    metrics.watch(lambda: Fleet(fleet_policy()))
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    exported = {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes[family.type]
    }
    dashboard = json.loads((ROOT / "dashboards/gateway.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    for expr in exprs:
        for name in re.findall(r"\b(gateway_[a-z_]+)", expr):
            assert name in exported, f"{name} in the dashboard is not exported"


def test_dockerfile_ships_what_the_gateway_reads_at_run_time() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for part in ("gateway", "simulator", "migrations", "policies", "pyproject.toml"):
        assert re.search(rf"^COPY .*\b{part}\b", dockerfile, re.M), part


def test_two_commands_lead_the_readme_and_ci_runs_make_test() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.S).group(1)  # type: ignore[union-attr]
    assert first_block.split() == ["make", "run", "make", "test"]
    assert "make test" in (ROOT / ".ci/run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
