"""Security end to end: no secret leaks anywhere, only policy backends are reached, SLO headers
are honoured only as far as each tenant may use them."""

from __future__ import annotations

import hashlib
import http.server
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from shadowworld import shadow_rows
from threadserver import serving
from waiting import wait_for

from gateway.policy.definition import Policy
from gateway.report import generate, period
from harness.gateways import run_gateway
from policies import EMBED, LOOPBACK_KEY_HOSTS, MODEL, UPSTREAM_KEYS, fleet_policy, keyed

ADMIN_TOKEN = "adm-tok-90c1f7e2b4"
TENANT_KEYS = {"acme": "sk-tenant-acme-3b8e51", "nightly": "sk-tenant-nightly-e07d44"}
SECRETS = [*UPSTREAM_KEYS.values(), ADMIN_TOKEN, *TENANT_KEYS.values()]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
HELLO = [{"role": "user", "content": "hello"}]
ADMIN_READS = (
    "/admin/policy",
    "/admin/policy/versions",
    "/admin/shadow/summary",
    "/admin/promotions?evaluate=1",
    "/admin/rollouts",
    "/admin/reports",
)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TENANTS = [
    {"name": "acme", "api_key_sha256": [digest(TENANT_KEYS["acme"])]},
    {
        "name": "nightly",
        "api_key_sha256": [digest(TENANT_KEYS["nightly"])],
        "default_slo_class": "batch",
        "slo_classes": ["batch"],
        "slo_overrides": False,
    },
]


def tenant(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TENANT_KEYS[name]}"}


def audited_policy(gpu: list[str], asic: list[str], cim: list[str]) -> Policy:
    """Every backend keyed, tenant keys required, 8B chat shadowed to the CIM pool."""
    routes = [
        {
            "name": "chat",
            "match": {"models": [MODEL]},
            "pools": ["asic", "gpu"],
            "fallback": "gpu",
            "shadow": [{"pool": "cim", "sample_rate": 1.0, "compare": {"store_text": True}}],
        },
        {"name": "embed", "match": {"models": [EMBED]}, "pools": ["asic", "gpu"]},
    ]
    policy = fleet_policy(gpu, asic, cim, routes=routes, tenants=TENANTS, require_tenant_key=True)
    return keyed(policy, dict(zip(("gpu", "asic", "cim"), UPSTREAM_KEYS, strict=True)))


class Transcript:
    """Every status line, header and body the gateway sent back, as one searchable text."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def hook(self, response: httpx.Response) -> None:
        response.read()
        self.parts.append(f"{response.status_code} {response.headers.multi_items()}")
        self.parts.append(response.content.decode(errors="replace"))

    def client(self, url: str) -> httpx.Client:
        return httpx.Client(base_url=url, timeout=30, event_hooks={"response": [self.hook]})


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_no_secret_appears_in_responses_logs_metrics_records_or_reports(
    keyed_sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for variable, key in UPSTREAM_KEYS.items():
        monkeypatch.setenv(variable, key)
    caplog.set_level(logging.DEBUG)
    policy = audited_policy(keyed_sims.urls("gpu"), keyed_sims.urls("asic"), keyed_sims.urls("cim"))
    seen = Transcript()
    reports = tmp_path / "reports"
    with (
        run_gateway(
            policy,
            tmp_path,
            admin_token=ADMIN_TOKEN,
            reports_dir=reports,
            upstream_key_hosts=LOOPBACK_KEY_HOSTS,
        ) as gw,
        seen.client(gw.url) as http,
    ):
        chat = {"model": MODEL, "messages": HELLO, "max_tokens": 8}
        http.get("/v1/models", headers=tenant("acme"))
        assert http.post("/v1/chat/completions", json=chat, headers=tenant("acme")).is_success
        http.post("/v1/chat/completions", json=chat | {"stream": True}, headers=tenant("acme"))
        prompt = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
        http.post("/v1/completions", json=prompt, headers=tenant("nightly"))
        http.post("/v1/embeddings", json={"model": EMBED, "input": "hi"}, headers=tenant("acme"))
        # Refusals: no key, a wrong key, another tenant's class, bad bodies, unknown models.
        http.post("/v1/chat/completions", json=chat)
        http.post("/v1/chat/completions", json=chat, headers={"authorization": "Bearer sk-nope"})
        http.post(
            "/v1/chat/completions", json=chat, headers=tenant("nightly") | {"x-slo-class": "x"}
        )
        http.post("/v1/chat/completions", content=b"{oops", headers=tenant("acme"))
        http.post("/v1/chat/completions", json=chat | {"model": "gpt-x"}, headers=tenant("acme"))
        # Faults: the ASIC fails before the first byte, then cuts a stream after it.
        keyed_sims.asic[0].set_faults(error_rate=1.0)
        http.post("/v1/chat/completions", json=chat, headers=tenant("acme"))
        keyed_sims.asic[0].set_faults(reset=True, drop_after_tokens=2)
        http.post("/v1/chat/completions", json=chat | {"stream": True}, headers=tenant("acme"))
        keyed_sims.asic[0].reset_faults()
        # The admin API, with and without its token.
        for path in ADMIN_READS:
            assert http.get(path, headers=ADMIN).is_success, path
        http.get("/admin/policy", headers={"authorization": "Bearer wrong"})
        http.get("/admin/policy")
        active = http.get("/admin/policy", headers=ADMIN).json()["yaml"]
        http.post("/admin/policy/validate", json={"yaml": active}, headers=ADMIN)
        changed = yaml.safe_dump(yaml.safe_load(active) | {"assumed_max_tokens": 300})
        applied = http.put("/admin/policy", json={"yaml": changed, "message": "x"}, headers=ADMIN)
        assert applied.is_success, applied.text
        explained = {"endpoint": "chat", "body": chat, "headers": tenant("nightly")}
        assert http.post("/admin/explain", json=explained, headers=ADMIN).is_success
        denied = explained | {"headers": tenant("nightly") | {"x-slo-class": "interactive"}}
        http.post("/admin/explain", json=denied, headers=ADMIN)
        http.post("/admin/explain", json=explained | {"headers": {}}, headers=ADMIN)
        gw.records(10)
        shadow_rows(gw, 3)
        # The weekly report of this week, written where the admin API serves it from.
        label = period.week_label(time.time())
        generate(gw.gateway.db, gw.gateway.policy, period.week(label), reports / label)
        for entry in http.get("/admin/reports", headers=ADMIN).json():
            for url in entry["files"].values():
                assert http.get(url, headers=ADMIN).is_success
        http.get("/metrics")
    # The gateway has stopped: every record is written, so the files hold all there is.
    assert "api_key_env: GATEWAY_UPSTREAM_KEY_ASIC" in active

    stored = [
        path.read_bytes().decode(errors="replace")
        for path in tmp_path.rglob("*")
        if path.is_file()  # the database (and its journal), spill files, report files
    ]
    assert any(p.suffix == ".html" for p in reports.rglob("*")), "no report was written"
    logs = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert len(seen.parts) > 40
    assert any(r.name.startswith("gateway.") for r in caplog.records), "nothing was logged"
    found = {
        "responses": leaked("\n".join(seen.parts)),
        "logs": leaked(logs),
        "stored files": leaked("\n".join(stored)),
    }
    assert found == {"responses": [], "logs": [], "stored files": []}


@contextmanager
def trap() -> Iterator[tuple[str, list[bytes]]]:
    """Listen on a loopback port no policy names; collect what anything sends to it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    received: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    received.append(conn.recv(65536) or b"(connected)")
                except OSError:
                    received.append(b"(connected)")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", received
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


@contextmanager
def redirecting_backend(location: str) -> Iterator[tuple[str, list[str]]]:
    """A backend that answers every request with a redirect to `location`, but passes probes.

    Yields its URL and the paths of the GET requests (probes, power scrapes) it was sent.
    """
    gets: list[str] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(307)
            self.send_header("location", location + self.path)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            gets.append(self.path)
            body = b'{"status": "ok"}' if self.path == "/health" else b""
            self.send_response(200 if body else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}", gets


def test_the_gateway_connects_only_to_backends_of_its_policy(sims, tmp_path: Path) -> None:
    with (
        trap() as (elsewhere, received),
        redirecting_backend(f"http://{elsewhere}") as (redirect, gets),
    ):
        policy = fleet_policy(sims.urls("gpu"), [redirect], sims.urls("cim"))
        names = {b.name for pool in policy.pools.values() for b in pool.backends}
        address = f"http://{elsewhere}/v1"
        pointed = {
            "base_url": address,
            "api_base": address,
            "url": address + "/chat/completions",
            "endpoint": address,
            "extra_body": {"base_url": address},
        }
        with (
            run_gateway(policy, tmp_path, power_scrape_interval_s=0.2) as gw,
            gw.http() as http,
        ):
            chat = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **pointed}
            headers = {
                "host": elsewhere,
                "x-forwarded-host": elsewhere,
                "forwarded": f"host={elsewhere}",
                "x-original-url": address,
            }
            for body in (chat, chat | {"stream": True}):
                served = http.post("/v1/chat/completions", json=body, headers=headers)
                assert served.status_code == 200, served.text
                # The short-chat route prefers the ASIC, whose redirect is refused, not followed.
                assert served.headers["x-gateway-backend"] in names - {"asic-0"}
            embedded = http.post(
                "/v1/embeddings", json={"model": EMBED, "input": "hi", **pointed}, headers=headers
            )
            assert embedded.status_code == 200 and embedded.headers["x-gateway-pool"] == "gpu"
            # An absolute request target, as a client configured to use a proxy sends it.
            host, port = gw.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                body = orjson.dumps(chat)
                raw.sendall(
                    f"POST http://{elsewhere}/v1/chat/completions HTTP/1.1\r\n"
                    f"host: {elsewhere}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                    + body
                )
                answer = b""
                while chunk := raw.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
            # Probes and power scrapes go on meanwhile: wait for two more of each at the
            # redirecting backend, so that a whole round of them came after the requests.
            seen = {path: gets.count(path) for path in ("/health", "/metrics")}
            wait_for(
                lambda: all(gets.count(path) >= n + 2 for path, n in seen.items()),
                message=lambda: f"no round of probes and scrapes followed: {gets[-4:]}",
            )
    assert received == [], f"the gateway connected to {elsewhere}: {received[:2]}"


def test_slo_headers_are_honoured_only_as_far_as_the_tenant_may_use_them(
    sims, tmp_path: Path
) -> None:
    urls = (sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    policy = fleet_policy(*urls, tenants=TENANTS, require_tenant_key=True)
    chat = {"model": MODEL, "messages": HELLO, "max_tokens": 4}

    def send(who: str | None, **slo: str) -> httpx.Response:
        headers = (tenant(who) if who else {}) | {k.replace("_", "-"): v for k, v in slo.items()}
        return http.post("/v1/chat/completions", json=chat, headers=headers)

    with run_gateway(policy, tmp_path, admin_token=ADMIN_TOKEN) as gw, gw.http() as http:
        assert send("nightly").status_code == 200
        for slo in (
            {"x_slo_class": "interactive"},
            {"x_slo_ttft_ms": "50"},
            {"x_slo_tpot_ms": "5"},
        ):
            denied = send("nightly", **slo)
            assert denied.status_code == 403, (slo, denied.text)
            assert denied.json()["error"]["code"] == "slo_not_allowed"
            assert denied.json()["error"]["param"] == next(iter(slo)).replace("_", "-")
        assert send("acme", x_slo_class="batch").status_code == 200
        assert send("acme", x_slo_ttft_ms="800", x_slo_tpot_ms="40").status_code == 200
        # Without a key, headers buy nothing: the request is refused before they are read.
        assert send(None, x_slo_class="batch").status_code == 401
        # Explain applies the same limits.
        asked = tenant("nightly") | {"x-slo-class": "interactive"}
        denied = {"endpoint": "chat", "body": chat, "headers": asked}
        explained = http.post("/admin/explain", json=denied, headers=ADMIN).json()
        assert explained["status"] == 403 and explained["error"]["code"] == "slo_not_allowed"
        records = sorted(gw.records(7), key=lambda r: r["ts"])
    served = [(r["tenant"], r["slo_class"]) for r in records if r["status"] == 200]
    assert served == [("nightly", "batch"), ("acme", "batch"), ("acme", "interactive")]
