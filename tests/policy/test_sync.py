"""Hot reload on a live gateway: new policy versions take over with no failed request."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from waiting import wait_for

from gateway.policy import versions
from gateway.policy.apply import rollback
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, render_policy
from harness.gateways import GatewayServer, run_gateway
from policies import MODEL, fleet_policy, pool

TOKEN = "reload-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def chat_on(pools: list[str], policy: Policy) -> Policy:
    """Return the policy with every 8B chat request sent to `pools`, in that order."""
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    doc["routes"] = [
        {"name": "chat-8b", "match": {"models": [MODEL]}, "pools": pools},
        *[r for r in doc["routes"] if r["name"] not in ("chat-8b", "chat-8b-short")],
    ]
    return parse_policy(render_policy(Policy.model_validate(doc)))


def with_pool(policy: Policy, name: str, entry: dict) -> Policy:
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    doc["pools"][name] = entry
    return parse_policy(render_policy(Policy.model_validate(doc)))


class Traffic:
    """Threads sending chat requests until stopped, noting when each started and where it went."""

    def __init__(self, gw: GatewayServer, threads: int = 4):
        self.client = gw.client()
        self.served: list[tuple[float, str]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send) for _ in range(threads)]

    def _send(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
                raw.parse()
                self.served.append((started, raw.headers["x-gateway-pool"]))
            except Exception as exc:  # every failure is the test's finding
                self.failures.append(repr(exc))

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def pools_since(self, moment: float, count: int = 12) -> set[str]:
        """Wait for `count` requests started after `moment`; return the pools that served them."""

        def after() -> list[str]:
            pools = [p for t, p in list(self.served) if t > moment]
            return pools if len(pools) >= count else []

        return set(wait_for(after, message=f"fewer than {count} requests served after the change"))


def reloads(gw: GatewayServer, result: str) -> float:
    """Return how many policy reloads the gateway counted with this result."""
    value = gw.gateway.metrics.registry.get_sample_value(
        "gateway_policy_reloads_total", {"result": result}
    )
    return value or 0.0


def test_applies_and_rollbacks_under_load_fail_no_request_and_move_traffic(
    sims, tmp_path: Path
) -> None:
    base = fleet_policy(gpu=sims.urls("gpu")[:1], asic=sims.urls("asic"), cim=sims.urls("cim"))
    on_asic = chat_on(["asic"], base)
    on_gpu = chat_on(["gpu"], base)
    second_gpu = pool("gpu", sims.urls("gpu")[1:], [MODEL])
    on_new_pool = chat_on(["gpu-b"], with_pool(base, "gpu-b", second_gpu))

    with (
        run_gateway(on_asic, tmp_path, admin_token=TOKEN, policy_poll_interval_s=0.1) as gw,
        gw.http() as http,
        Traffic(gw) as traffic,
    ):
        assert traffic.pools_since(0) == {"asic"}
        for policy, expected in ((on_gpu, {"gpu"}), (on_new_pool, {"gpu-b"})):
            response = http.put(
                "/admin/policy",
                json={"yaml": render_policy(policy), "message": f"chat to {expected}"},
                headers=AUTH,
            )
            assert response.status_code == 200, response.text
            applied = time.monotonic()
            assert traffic.pools_since(applied) == expected

        # Another replica (or the CLI) rolls back through the database: polling picks it up.
        stored = rollback(gw.gateway.db, author="ops", version=2, message="to the GPU").version
        wait_for(
            lambda: gw.gateway.policy_version == stored.version,
            message=lambda: f"still on version {gw.gateway.policy_version}, not {stored.version}",
        )
        assert traffic.pools_since(time.monotonic()) == {"gpu"}

        response = http.post("/admin/policy/rollback", json={"version": 1}, headers=AUTH)
        assert response.status_code == 200, response.text
        assert traffic.pools_since(time.monotonic()) == {"asic"}

    assert traffic.failures == []
    assert len(traffic.served) > 50
    # Every slot taken under any version was given back to the state the last fleet holds.
    assert all(b.in_flight == 0 and b.kv_reserved == 0 for b in gw.gateway.fleet.backends())


def test_a_stored_version_this_gateway_cannot_load_is_refused_and_counted(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(gpu=sims.urls("gpu"), asic=sims.urls("asic"), cim=sims.urls("cim"))
    with run_gateway(policy, tmp_path, policy_poll_interval_s=0.05) as gw:
        before = gw.gateway.policy_version
        # Written past validation, as a replica running newer code might.
        versions.record(gw.gateway.db, "pools: {}\n", "future", "newer schema")
        refused = wait_for(
            lambda: reloads(gw, "invalid"), message="the gateway never looked at version 2"
        )
        assert refused == 1
        assert gw.gateway.policy_version == before == 1
        with gw.http() as http:
            assert http.get("/readyz").status_code == 200
        reply = gw.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.choices


@pytest.mark.parametrize("stored_first", [True, False])
def test_starts_from_the_active_version_else_stores_its_policy_as_version_1(
    sims, tmp_path: Path, stored_first: bool
) -> None:
    from gateway.db.connection import connect, upgrade

    on_gpu = chat_on(["gpu"], fleet_policy(gpu=sims.urls("gpu"), asic=sims.urls("asic")))
    on_asic = chat_on(["asic"], fleet_policy(gpu=sims.urls("gpu"), asic=sims.urls("asic")))
    if stored_first:
        url = f"sqlite:///{tmp_path / 'gateway.db'}"
        upgrade(url)
        versions.record(connect(url), render_policy(on_asic), "ops", "asic first")
    with run_gateway(on_gpu, tmp_path) as gw:
        reply = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.headers["x-gateway-pool"] == ("asic" if stored_first else "gpu")
        assert gw.gateway.policy_version == 1
        assert [v.version for v in versions.history(gw.gateway.db)] == [1]
        value = gw.gateway.metrics.registry.get_sample_value("gateway_policy_version")
        assert value == 1


def test_watch_applies_a_saved_valid_file_and_ignores_an_invalid_one(sims, tmp_path: Path) -> None:
    import yaml

    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    path = tmp_path / "policy.yaml"
    path.write_text(render_policy(policy))
    with run_gateway(
        policy, tmp_path, policy_path=path, watch_policy=True, policy_poll_interval_s=0.1
    ) as gw:
        gw.gateway.policy_file.periodic.interval_s = 0.05
        first = gw.gateway.policy_version
        path.write_text("pools: [not a mapping\n")  # a half-saved file
        wait_for(  # the watcher read it and refused it
            lambda: reloads(gw, "invalid"), message="the watcher never looked at the saved file"
        )
        assert gw.gateway.policy_version == first
        doc = yaml.safe_load(render_policy(policy))
        doc["routes"][0]["pools"] = ["gpu"]
        path.write_text(yaml.safe_dump(doc))
        wait_for(
            lambda: gw.gateway.policy_version != first, message="the valid file was never applied"
        )
        assert gw.gateway.policy_version == first + 1
        assert gw.gateway.policy.routes[0].pools == ["gpu"]
