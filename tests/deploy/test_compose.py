"""The deployment files agree with the code: compose, nginx, Prometheus, Grafana, Docker, make."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from shadowworld import ROOMY, shadow_rows

from gateway.db.connection import MIGRATIONS
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import Policy
from gateway.policy.load import load_policy, parse_policy, to_yaml
from gateway.settings import variables
from harness.gateways import GatewayServer, run_gateway
from harness.metrics import parse_metrics
from policies import BIG, EMBED, MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


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
        "sim-gpu-70b-0",
        "sim-asic-0",
        "sim-cim-0",
        "prometheus",
        "grafana",
    } <= set(compose["services"])


def test_gateway_environment_uses_only_real_settings(compose: dict) -> None:
    known = set(variables())
    for name in ("gateway-1", "gateway-2", "migrate"):
        env = compose["services"][name]["environment"]
        assert set(env) <= known, set(env) - known
    env = compose["services"]["gateway-1"]["environment"]
    assert env["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["DATABASE_URL"] == compose["services"]["migrate"]["environment"]["DATABASE_URL"]
    assert "${GATEWAY_ADMIN_TOKEN:?" in env["GATEWAY_ADMIN_TOKEN"]  # no placeholder secret
    # Redis takes a password, and the replicas give it.
    redis = compose["services"]["redis"]["command"]
    password = redis[redis.index("--requirepass") + 1]
    assert password.startswith("${REDIS_PASSWORD:?")
    assert env["REDIS_URL"].startswith(f"redis://:{password}@redis:")


def test_the_load_balancer_waits_for_replicas_that_answer_readiness(compose: dict) -> None:
    from gateway.app import create_app
    from gateway.settings import Settings

    ops = create_app(Settings()).ops.app.routes
    paths = {getattr(route, "path", None) for route in ops}
    port = compose["services"]["gateway-1"]["environment"]["GATEWAY_PORT"]
    for name in ("gateway-1", "gateway-2"):
        check = " ".join(compose["services"][name]["healthcheck"]["test"])
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", check)
        assert url is not None and url.group(1) == port and url.group(2) in paths
        assert url.group(2) == "/readyz"
        assert compose["services"]["lb"]["depends_on"][name] == {"condition": "service_healthy"}


def test_compose_mounts_only_files_the_repository_has(compose: dict) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"


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
            engine = command[command.index("--engine") + 1] if "--engine" in command else None
            assert engine == pool.engine, f"{host} publishes the load series of {engine}"


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


# The dashboard ------------------------------------------------------------------------------

# Labels a query may use that the gateway does not export: Prometheus adds the scrape target's.
TARGET_LABELS = {"instance", "job"}
# Series that appear only after events the traffic below does not cause; their label names are
# checked against the declared metrics instead.
RARE = {
    "gateway_queue_wait_seconds_bucket": "a request waited for a slot",
    "gateway_cost_model_mape": "a retrained cost model scored on held-out requests",
    "gateway_policy_reloads_total": "a replica switched policy versions",
    "gateway_rate_limited_total": "a tenant went over its rate limit",
}


def dashboard_panels() -> list[dict]:
    """Return the dashboard's panels, rows and the panels of collapsed rows included."""
    dashboard = json.loads((ROOT / "dashboards/gateway.json").read_text())
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def gateway_series(expr: str) -> set[str]:
    return set(re.findall(r"\b(gateway_[a-z_]+)", expr))


def query_labels(expr: str) -> set[str]:
    """Return the label names a query groups by or selects on."""
    names = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        names.update(n.strip() for n in group.split(",") if n.strip())
    for selector in re.findall(r"\{([^}]*)\}", expr):
        names.update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return names - {"le"} - TARGET_LABELS


def declared_series() -> dict[str, set[str]]:
    """Return each series name the metrics module declares, with its label names."""
    # prometheus_client keeps a metric's type, name and label names only in attributes with
    # an underscore; a series without samples yet shows them nowhere else.
    metrics = GatewayMetrics()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    series = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for suffix in suffixes[metric._type]:
                series[metric._name + suffix] = set(metric._labelnames)
    return series


def test_dashboard_groups_its_panels_in_rows_covering_each_concern() -> None:
    panels = dashboard_panels()
    assert panels[0]["type"] == "row", "the first panel must open a row"
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert len(rows) == len(set(rows)) >= 6
    queries = dashboard_queries()
    grouped = {(name, frozenset(query_labels(q))) for q in queries for name in gateway_series(q)}
    for name, labels in [
        ("gateway_requests_total", {"route"}),
        ("gateway_requests_total", {"pool"}),
        ("gateway_errors_total", {"route"}),
        ("gateway_errors_total", {"pool", "code"}),
        ("gateway_time_to_first_token_seconds_bucket", {"pool"}),
        ("gateway_time_per_output_token_seconds_bucket", {"pool"}),
        ("gateway_request_duration_seconds_bucket", {"pool"}),
        ("gateway_overhead_seconds_bucket", {"route"}),
        ("gateway_energy_joules_total", {"pool"}),
        ("gateway_cost_usd_total", {"pool"}),
        ("gateway_shadow_exact_matches_total", {"route", "candidate", "kind"}),
        ("gateway_shadow_dropped_total", {"candidate", "kind", "reason"}),
        ("gateway_slo_requests_total", {"slo_class", "result"}),
        ("gateway_cost_model_observed_over_predicted_bucket", {"pool", "target"}),
        ("gateway_cost_model_mape", {"pool", "target"}),
    ]:
        assert (name, frozenset(labels)) in grouped, f"no panel shows {name} by {sorted(labels)}"


def shipped_fleet(sims) -> Policy:
    """Return policies/default.yaml on the test simulators, copying what the test needs."""
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for kind, pool in doc["pools"].items():
        pool["backends"] = [{"url": url} for url in sims.urls(kind)]
    routes = {route["name"]: route for route in doc["routes"]}
    for route in routes.values():
        for target in route.get("shadow", []):
            target.update(sample_rate=1.0, budget=ROOMY)
        if "noise_floor" in route:
            route["noise_floor"].update(share=1.0, budget=ROOMY)
    # One copy of short chat to the CIM part, then drops: the bucket holds one and barely refills.
    (cim,) = routes["chat-8b-short"]["shadow"]
    cim["budget"] = {**ROOMY, "max_per_second": 0.001}
    return parse_policy(to_yaml(doc), "default-on-sims.yaml")


def serve_every_kind_of_request(gw: GatewayServer, sims) -> int:
    """Send chat, streams, embeddings, errors, failovers and a long prompt; return the count."""
    client = gw.client()
    chat = [{"role": "user", "content": "What does a shadow copy measure?"}]
    asks: list[dict] = [
        {"model": MODEL, "messages": chat},  # the ASIC, copied to the CIM part
        {"model": MODEL, "messages": chat, "stream": True},  # its copy is dropped
        {"model": BIG, "messages": chat, "stream": True},
        {"model": MODEL, "messages": chat, "stream": True, "extra_headers": {"x-slo-ttft-ms": "1"}},
    ]
    for ask in asks:
        reply = client.chat.completions.create(max_tokens=8, **ask)
        if ask.get("stream"):
            list(reply)
    client.embeddings.create(model=EMBED, input=["a"])
    with gw.http() as http:
        unknown = {"model": "no-such-model", "messages": chat}
        assert http.post("/v1/chat/completions", json=unknown).status_code == 404
    sims.asic[0].set_faults(error_rate=1.0)
    # The GPU; its copy to the failing ASIC fails, its A/A copy to the other GPU is compared.
    long = [{"role": "user", "content": "word " * 3000}]
    client.chat.completions.create(model=MODEL, messages=long, max_tokens=8)
    for _ in range(3):  # retried on the GPU, until the ASIC is ejected
        client.chat.completions.create(model=MODEL, messages=chat, max_tokens=8)
    return len(asks) + 6


def test_dashboard_queries_series_a_running_gateway_exports_with_their_labels(
    sims, tmp_path: Path
) -> None:
    with run_gateway(shipped_fleet(sims), tmp_path, power_scrape_interval_s=0.2) as gw:
        sent = serve_every_kind_of_request(gw, sims)
        gw.records(sent)  # written once their energy is measured
        shadow_rows(gw, 4)
        text = gw.http().get("/metrics").text
    exported: dict[str, set[str]] = {}
    for name, labels, _ in parse_metrics(text):
        exported.setdefault(name, set()).update(labels)
    declared = declared_series()
    assert set(RARE) <= set(declared), "RARE names series that are not declared"
    queries = dashboard_queries()
    for name in {n for q in queries for n in gateway_series(q)}:
        assert name in exported or name in RARE, f"{name} is queried but not in /metrics"
    for query in queries:
        for name in gateway_series(query):
            labels = exported[name] if name in exported else declared[name]
            missing = query_labels(query) - labels
            assert not missing, f"{query!r}: {name} has no label {sorted(missing)}"


def test_dockerfile_ships_what_the_gateway_reads_at_run_time() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for part in ("gateway", "simulator", "policies", "pyproject.toml"):
        assert re.search(rf"^COPY .*\b{part}\b", dockerfile, re.M), part
    # The migrations `gateway db upgrade` runs are part of the package.
    assert MIGRATIONS.is_relative_to(ROOT / "gateway") and (MIGRATIONS / "env.py").is_file()


def test_two_commands_lead_the_readme_and_ci_runs_make_test() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.S).group(1)  # type: ignore[union-attr]
    assert first_block.split() == ["make", "run", "make", "test"]
    assert "make test" in (ROOT / ".ci/run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
