"""The admin policy API: read, validate, apply, list and roll back versions on a live gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import apply as apply_module
from gateway.policy import sync, validation, versions
from gateway.policy.load import content_hash, render_policy
from harness.gateways import run_gateway
from policies import fleet_policy

TOKEN = "policy-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_policy_endpoints_apply_list_and_roll_back_versions(tmp_path: Path) -> None:
    first = fleet_policy()
    second = fleet_policy(assumed_max_tokens=512)
    with run_gateway(first, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        active = http.get("/admin/policy", headers=AUTH).json()
        assert active["version"] == 1 and active["hash"] == content_hash(active["yaml"])

        text = render_policy(second)
        applied = http.put(
            "/admin/policy", json={"yaml": text, "message": "longer outputs"}, headers=AUTH
        )
        assert applied.status_code == 200 and applied.json()["version"] == 2
        assert http.get("/admin/policy", headers=AUTH).json()["yaml"] == text
        assert gw.gateway.policy.assumed_max_tokens == 512

        listed = http.get("/admin/policy/versions", headers=AUTH).json()
        assert listed["active"] == 2
        assert [(v["version"], v["message"], v["author"]) for v in listed["versions"]] == [
            (2, "longer outputs", "admin-api"),
            (1, "initial policy from policies/default.yaml", listed["versions"][1]["author"]),
        ]

        rolled = http.post("/admin/policy/rollback", json={}, headers=AUTH)
        assert rolled.json() == {"version": 3, "restores": 1, "changed": True}
        assert gw.gateway.policy.assumed_max_tokens == 256
        assert http.get("/admin/policy", headers=AUTH).json()["hash"] == active["hash"]

        missing = http.post("/admin/policy/rollback", json={"version": 42}, headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "policy_version_not_found"


def test_an_invalid_policy_is_422_with_located_errors_and_changes_nothing(tmp_path: Path) -> None:
    text = render_policy(fleet_policy()).replace("fallback: gpu", "fallback: gpux", 1)
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        before = http.get("/admin/policy", headers=AUTH).json()
        response = http.put("/admin/policy", json={"yaml": text, "message": "x"}, headers=AUTH)
        assert response.status_code == 422
        (error,) = response.json()["errors"]
        assert error["path"] == "routes.0.fallback"
        assert "'gpux', which is not defined" in error["message"]
        assert error["location"].startswith("<request>:")
        assert http.get("/admin/policy", headers=AUTH).json() == before
        listed = http.get("/admin/policy/versions", headers=AUTH).json()
        assert [v["version"] for v in listed["versions"]] == [1]


def test_a_policy_naming_the_former_runtime_is_422_saying_what_to_write(tmp_path: Path) -> None:
    policy = fleet_policy(gpu_extra={"engine": "vllm"})
    text = render_policy(policy).replace("engine: vllm", "engine: vllm\n    runtime: vllm 0.6.3", 1)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        response = http.put("/admin/policy", json={"yaml": text, "message": "x"}, headers=AUTH)
        assert response.status_code == 422
        (error,) = response.json()["errors"]
        assert error["path"] == "pools.gpu.runtime"
        assert "is retired" in error["message"]
        assert "write engine_version: '0.6.3' instead" in error["message"]
        assert gw.gateway.policy_version == 1
        fixed = text.replace("runtime: vllm 0.6.3", "engine_version: 0.6.3")
        applied = http.put("/admin/policy", json={"yaml": fixed, "message": "x"}, headers=AUTH)
        assert (
            applied.status_code == 200 and gw.gateway.policy.pools["gpu"].engine_version == "0.6.3"
        )


def test_validate_reports_errors_and_warnings_without_applying(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        good = http.post(
            "/admin/policy/validate", json={"yaml": render_policy(fleet_policy())}, headers=AUTH
        ).json()
        assert good["valid"] is True and good["errors"] == []
        # chat-70b has no fallback, and no route uses the CIM pool.
        assert [w["path"] for w in good["warnings"]] == ["routes.2.fallback", "pools.cim"]
        bad = http.post("/admin/policy/validate", json={"yaml": "pools: ["}, headers=AUTH).json()
        assert bad["valid"] is False and "not valid YAML" in bad["errors"][0]["message"]
        assert gw.gateway.policy_version == 1


def test_policy_endpoints_need_the_admin_token(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        assert http.get("/admin/policy").status_code == 401
        put = http.put("/admin/policy", json={"yaml": "", "message": "x"})
        assert put.status_code == 401
        assert http.post("/admin/policy/rollback", json={}).status_code == 401
    (tmp_path / "off").mkdir()
    with run_gateway(fleet_policy(), tmp_path / "off") as gw, gw.http() as http:
        assert http.get("/admin/policy", headers=AUTH).status_code == 403


def test_a_rollback_to_a_version_that_no_longer_validates_is_422_and_changes_nothing(
    tmp_path: Path,
) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        # A version stored by an older release, before a rule it breaks: the 70B model and
        # the 8B one on a single 80 GB GPU.
        doc = yaml.safe_load(render_policy(fleet_policy()))
        doc["pools"]["gpu"]["memory_gb"] = 80
        versions.record(gw.gateway.db, yaml.safe_dump(doc), "old", "before the check")
        http.put(
            "/admin/policy", json={"yaml": render_policy(fleet_policy()), "message": "fits"},
            headers=AUTH,
        ).raise_for_status()  # fmt: skip
        before = http.get("/admin/policy", headers=AUTH).json()
        response = http.post("/admin/policy/rollback", json={}, headers=AUTH)
        assert response.status_code == 422
        (error,) = response.json()["errors"]
        assert error["path"] == "pools.gpu.memory_gb"
        assert error["location"].startswith("version 2:")
        assert http.get("/admin/policy", headers=AUTH).json() == before


def on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_policies_are_validated_and_parsed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validating a large policy takes the CPU for a while: never on the loop that serves."""
    seen: list[tuple[str, bool]] = []

    def probe(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def probed(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, on_a_loop()))
            return real(*args, **kwargs)

        return probed

    monkeypatch.setattr(validation, "validate", probe("validate", validation.validate))
    monkeypatch.setattr(apply_module, "validate", probe("apply", apply_module.validate))
    monkeypatch.setattr(sync, "parse_policy", probe("reload", sync.parse_policy))
    text = render_policy(fleet_policy(assumed_max_tokens=512))
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        http.post("/admin/policy/validate", json={"yaml": text}, headers=AUTH).raise_for_status()
        put = http.put("/admin/policy", json={"yaml": text, "message": "m"}, headers=AUTH)
        put.raise_for_status()
        assert gw.gateway.policy.assumed_max_tokens == 512
    assert {name for name, _ in seen} == {"validate", "apply", "reload"}
    assert [name for name, looped in seen if looped] == []


GATE = "override_precision_gate"
ROLLOUT = {"route": "chat-8b", "candidate": "asic"}
# Each a body whose form its model refuses: a boolean or integer written as a string is not
# one, and an empty policy text is none. method, path, body, the field named.
MALFORMED = [
    ("POST", "/admin/policy/rollback", {GATE: "yes"}, GATE),
    ("POST", "/admin/policy/rollback", {"version": "1"}, "version"),
    ("POST", "/admin/policy/rollback", {"version": True}, "version"),
    ("PUT", "/admin/policy", {"yaml": "x", "message": "m", GATE: 1}, GATE),
    ("PUT", "/admin/policy", {"yaml": "", "message": "m"}, "yaml"),
    ("POST", "/admin/policy/validate", {"yaml": ""}, "yaml"),
    ("POST", "/admin/policy/simulate", {"yaml": "x", "sample": "10"}, "sample"),
    ("POST", "/admin/promotions/apply", ROLLOUT | {"force": "true"}, "force"),
    ("POST", "/admin/promotions/apply", {"route": "chat-8b"}, "candidate"),
    ("POST", "/admin/promotions/rollback", {"route": ""}, "route"),
]


def test_a_body_of_the_wrong_form_is_a_400_naming_the_field_and_changes_nothing(
    tmp_path: Path,
) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        wrong = []
        for method, path, body, field in MALFORMED:
            response = http.request(method, path, json=body, headers=AUTH)
            error = response.json().get("error", {})
            if response.status_code != 400 or error.get("param") != f"body.{field}":
                wrong.append(f"{method} {path} {body}: {response.status_code} {response.text}")
        assert http.get("/admin/policy/versions", headers=AUTH).json()["active"] == 1
        assert http.get("/admin/rollouts", headers=AUTH).json() == []
    assert not wrong, "\n".join(wrong)


def test_what_the_gateways_state_refuses_is_a_409_conflict(tmp_path: Path) -> None:
    rollout = ROLLOUT | {"force": True}
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        first = http.post("/admin/policy/rollback", json={}, headers=AUTH)
        unjudged = http.post(
            "/admin/promotions/apply", json=rollout | {"force": False}, headers=AUTH
        )
        idle = http.post("/admin/promotions/rollback", json={"route": "chat-8b"}, headers=AUTH)
        http.post("/admin/promotions/apply", json=rollout, headers=AUTH).raise_for_status()
        again = http.post("/admin/promotions/apply", json=rollout, headers=AUTH)
        stopped = http.post("/admin/promotions/rollback", json={"route": "chat-8b"}, headers=AUTH)
    refusals = {
        "version 1 is the first": first,
        "not 'promote'": unjudged,
        "has no rollout in progress": idle,
        "already has a rollout in progress": again,
    }
    for phrase, response in refusals.items():
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("conflict_error", "conflict")
        assert phrase in error["message"]
    assert idle.json()["error"]["param"] == "route"
    assert stopped.status_code == 200 and stopped.json()["state"] == "rolled_back"
