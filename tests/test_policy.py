from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.errors import PolicyError
from gateway.policy import load_policy, parse_policy

DEFAULT = Path(__file__).resolve().parent.parent / "policies" / "default.yaml"


def default_doc() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_policy_is_the_realistic_fleet() -> None:
    policy = load_policy(DEFAULT)
    assert {p.kind for p in policy.pools.values()} == {"gpu", "asic", "cim"}
    assert not policy.pools["cim"].live
    assert policy.pools["gpu"].models == [
        "llama-3.1-8b-instruct",
        "llama-3.1-70b-instruct",
        "bge-large-en-v1.5",
    ]
    assert "llama-3.1-70b-instruct" not in policy.pools["asic"].models
    short = policy.routes[0]
    assert short.pools[0] == "asic" and short.fallback == "gpu"
    assert all(r.fallback in (None, "gpu") for r in policy.routes)
    assert [b.name for b in policy.pools["gpu"].backends] == ["gpu-0", "gpu-1"]


def test_error_names_file_line_field_and_value() -> None:
    text = DEFAULT.read_text().replace("slots_per_backend: 16", "slots_per_backend: -3")
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "fleet.yaml")
    message = str(info.value)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "slots_per_backend: -3" in s)
    assert f"fleet.yaml:{line}:" in message
    assert "pools.asic.slots_per_backend" in message
    assert "-3" in message


def test_unknown_key_is_an_error() -> None:
    doc = default_doc()
    doc["pools"]["gpu"]["slotz"] = 4
    with pytest.raises(PolicyError, match=r"pools\.gpu\.slotz"):
        parse_policy(yaml.safe_dump(doc))


def test_route_naming_an_undefined_pool_is_an_error() -> None:
    doc = default_doc()
    doc["routes"][0]["pools"] = ["asic-b", "gpu"]
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml.safe_dump(doc))
    assert "route 'chat-8b-short' names pool 'asic-b', which is not defined" in str(info.value)
    assert "routes.0.pools.0" in str(info.value)


def test_shadow_only_pool_cannot_serve_a_route() -> None:
    doc = default_doc()
    doc["routes"][0]["pools"] = ["cim"]
    with pytest.raises(PolicyError, match="shadow-only"):
        parse_policy(yaml.safe_dump(doc))


def test_fallback_must_serve_the_routes_models() -> None:
    doc = default_doc()
    doc["routes"][2]["fallback"] = "asic"  # chat-70b: the ASIC does not serve the 70B model
    with pytest.raises(PolicyError, match="does not serve"):
        parse_policy(yaml.safe_dump(doc))


def test_undefined_slo_class_and_tenant_are_errors() -> None:
    doc = default_doc()
    doc["default_slo_class"] = "realtime"
    doc["routes"][1]["match"]["tenants"] = ["ghost"]
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml.safe_dump(doc))
    assert "'realtime'" in str(info.value) and "'ghost'" in str(info.value)


def test_backend_url_must_be_http() -> None:
    doc = default_doc()
    doc["pools"]["gpu"]["backends"][0]["url"] = "ftp://x"
    with pytest.raises(PolicyError, match="http://"):
        parse_policy(yaml.safe_dump(doc))


def test_missing_file_and_bad_yaml_are_policy_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)


def test_tenant_keys_are_matched_by_digest() -> None:
    import hashlib

    doc = default_doc()
    doc["tenants"] = [{"name": "acme", "api_key_sha256": [hashlib.sha256(b"sk-acme").hexdigest()]}]
    policy = parse_policy(yaml.safe_dump(doc))
    assert policy.tenant_for_key("sk-acme") == "acme"
    assert policy.tenant_for_key("sk-other") is None
