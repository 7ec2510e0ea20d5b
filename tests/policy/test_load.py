from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.errors import PolicyError
from gateway.policy.definition import DEFAULT_NOISE_SHARE, NoiseFloor
from gateway.policy.load import load_policy, parse_policy
from gateway.policy.validation import validate

DEFAULT = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def default_doc() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_policy_is_the_realistic_fleet() -> None:
    policy = load_policy(DEFAULT)
    assert {p.kind for p in policy.pools.values()} == {"gpu", "asic", "cim"}
    assert not policy.pools["cim"].live
    assert policy.pools["gpu"].models == ["llama-3.1-8b-instruct", "bge-large-en-v1.5"]
    # 140 GB of weights in bf16: a pool of its own, each backend four GPUs.
    big = policy.pools["gpu-70b"]
    assert (big.kind, big.models, big.memory_gb) == ("gpu", ["llama-3.1-70b-instruct"], 320)
    assert [r.pools for r in policy.routes if r.name == "chat-70b"] == [["gpu-70b"]]
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
    tenant = policy.tenant_for_key("sk-acme")
    assert tenant is not None and tenant.name == "acme"
    assert policy.tenant_for_key("sk-other") is None


def test_default_policy_shadows_8b_chat_to_cim_and_long_prompts_to_the_asic() -> None:
    routes = {r.name: r for r in load_policy(DEFAULT).routes}
    chat = routes["chat-8b"]
    targets = {t.pool: t for t in chat.shadow}
    assert set(targets) == {"cim", "asic"} and 0 < targets["cim"].sample_rate < 1
    assert targets["asic"].match.prompt_tokens.min > 2048
    assert chat.noise_floor is not None and chat.noise_floor.share > 0
    assert [t.pool for t in routes["chat-8b-short"].shadow] == ["cim"]


def shadowing(**target: object) -> dict:
    doc = default_doc()
    doc["routes"][1]["shadow"] = [{"pool": "cim", "sample_rate": 0.1, **target}]
    doc["routes"][1].pop("noise_floor", None)
    return doc


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        ({"pool": "cimx"}, "routes.1.shadow.0.pool", "shadows pool 'cimx', which is not defined"),
        ({"pool": "gpu"}, "routes.1.shadow.0.pool", "which is its primary pool"),
        ({"sample_rate": 1.5}, "routes.1.shadow.0.sample_rate", "less than or equal to 1"),
        (
            {"match": {"tenants": ["ghost"]}},
            "routes.1.shadow.0.match.tenants.0",
            "filters on tenant 'ghost', which is not defined",
        ),
        (
            {"match": {"models": ["llama-3.1-70b-instruct"]}},
            "routes.1.shadow.0.match.models.0",
            "which route 'chat-8b' never matches",
        ),
        (
            {"budget": {"max_slot_share": 0.1}},
            "routes.1.shadow.0.budget.max_slot_share",
            "0.1 of pool 'cim' (4 slots) is less than one slot; use at least 0.25",
        ),
        (
            {"compare": {"comparators": ["exact", "bleu"]}},
            "routes.1.shadow.0.compare.comparators.1",
            "comparator 'bleu' is not known",
        ),
        (
            {"compare": {"comparators": ["rouge_l", "edit_ratio"]}},
            "routes.1.shadow.0.compare.comparators",
            "2 similarity measures",
        ),
    ],
)
def test_shadow_target_errors_name_the_path_and_value(
    change: dict, path: str, message: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml.safe_dump(shadowing(**change)), "fleet.yaml")
    assert path in str(info.value) and message in str(info.value)


def test_a_shadow_target_must_serve_the_routes_model() -> None:
    doc = default_doc()
    doc["routes"][2]["shadow"] = [{"pool": "cim", "sample_rate": 0.1}]  # chat-70b
    with pytest.raises(PolicyError, match="shadows pool 'cim', which serves none of"):
        parse_policy(yaml.safe_dump(doc))


def test_a_noise_floor_needs_shadow_samples_unless_it_is_off() -> None:
    doc = default_doc()
    doc["routes"][2]["noise_floor"] = {"share": 0.5}  # chat-70b shadows nothing
    with pytest.raises(PolicyError, match="route 'chat-70b' keeps a noise floor but shadows no"):
        parse_policy(yaml.safe_dump(doc))
    doc["routes"][2]["noise_floor"] = {"share": 0}
    assert parse_policy(yaml.safe_dump(doc)).routes[2].noise is None


def test_every_shadowed_route_has_a_noise_floor_measured_as_its_first_target() -> None:
    doc = default_doc()
    short = doc["routes"][0]  # chat-8b-short names no noise floor
    assert "noise_floor" not in short
    short["shadow"][0]["compare"] = {"comparators": ["exact", "edit_ratio"], "store_text": True}
    routes = {r.name: r for r in parse_policy(yaml.safe_dump(doc)).routes}
    noise = routes["chat-8b-short"].noise
    assert noise is not None and noise.share == DEFAULT_NOISE_SHARE == 0.25
    assert noise.compare == routes["chat-8b-short"].shadow[0].compare
    assert noise.budget == NoiseFloor(share=0.25).budget
    # A floor the policy gives is the one sampled; a route that shadows nothing has none.
    assert routes["chat-8b"].noise == routes["chat-8b"].noise_floor
    assert routes["chat-70b"].noise is None
    short["noise_floor"] = {"share": 0}
    assert parse_policy(yaml.safe_dump(doc)).routes[0].noise is None


def test_a_single_backend_pool_keeps_a_noise_floor_by_asking_its_backend_again() -> None:
    doc = default_doc()
    doc["pools"]["gpu"]["backends"] = doc["pools"]["gpu"]["backends"][:1]
    # chat-8b-short: the single ASIC, falling back to the single GPU.
    doc["routes"][0]["noise_floor"] = {"share": 0.5}
    policy = parse_policy(yaml.safe_dump(doc))
    assert [r.noise.share for r in policy.routes[:2] if r.noise is not None] == [0.5, 0.25]


def test_noise_floor_and_targets_must_measure_similarity_the_same_way() -> None:
    doc = default_doc()
    doc["routes"][1]["noise_floor"]["compare"] = {"comparators": ["exact", "edit_ratio"]}
    with pytest.raises(PolicyError, match="noise floor measures similarity with 'edit_ratio'"):
        parse_policy(yaml.safe_dump(doc))


def test_yaml_aliases_are_refused_so_a_kilobyte_cannot_expand_to_gigabytes() -> None:
    # Each level doubles the last: a billion entries from 600 bytes, were aliases followed.
    levels = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    bomb = "\n".join(levels) + "\n"
    with pytest.raises(PolicyError) as refused:
        parse_policy(bomb, "bomb.yaml")
    assert "aliases (*name) are not allowed" in str(refused.value)
    assert refused.value.problems[0].location.startswith("bomb.yaml:2:")


def test_a_pool_may_run_llamacpp_and_an_engine_the_gateway_cannot_read_is_named() -> None:
    doc = default_doc()
    doc["pools"]["cim"]["engine"] = "llamacpp"
    assert parse_policy(yaml.safe_dump(doc)).pools["cim"].engine == "llamacpp"
    doc["pools"]["cim"]["engine"] = "llama.cpp"
    with pytest.raises(PolicyError) as info:
        parse_policy(yaml.safe_dump(doc))
    assert "pools.cim.engine" in str(info.value) and "'llamacpp'" in str(info.value)


def test_a_pools_serving_engine_is_its_name_and_its_version() -> None:
    doc = default_doc()
    doc["pools"]["gpu"] |= {"engine": "vllm", "engine_version": "0.6.3"}
    gpu = parse_policy(yaml.safe_dump(doc)).pools["gpu"]
    assert (gpu.engine, gpu.engine_version) == ("vllm", "0.6.3")
    assert gpu.versions() == {"driver": None, "engine_version": "0.6.3", "firmware": None}
    doc["pools"]["gpu"]["engine_version"] = 0.10  # YAML's number: its digits would be lost
    with pytest.raises(PolicyError, match=r"pools\.gpu\.engine_version: .* quoted string"):
        parse_policy(yaml.safe_dump(doc))


def old_policy(engine: str | None, runtime: str) -> str:
    """policies/default.yaml as a policy of before 0022 gave its GPUs' engine and version."""
    return DEFAULT.read_text().replace(
        "    engine: vllm ", f"    engine: {engine or 'null'}\n    runtime: {runtime!r}  #", 1
    )


@pytest.mark.parametrize(
    ("engine", "runtime", "version"),
    [
        ("vllm", "vllm 0.6.3", "0.6.3"),
        ("llamacpp", "llama.cpp 0.3.36", "0.3.36"),
        (None, "vendor-sdk 1.18", "vendor-sdk 1.18"),
        ("vllm", "vllm", None),
    ],
)
def test_the_former_runtime_is_read_as_its_engine_version_and_refused_where_it_is(
    engine: str | None, runtime: str, version: str | None
) -> None:
    text = old_policy(engine, runtime)
    # A gateway serving a file that still has it starts, reading it as migration 0022 would.
    gpu = parse_policy(text, "old.yaml").pools["gpu"]
    assert (gpu.engine, gpu.engine_version) == (engine, version)
    # Validation (and so every apply) refuses it, at its line, saying what to write instead.
    (problem,) = validate(text, "old.yaml").errors
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.startswith("    runtime:"))
    assert (problem.location, problem.path) == (f"old.yaml:{line}:14", "pools.gpu.runtime")
    write = f"engine_version: '{version}'" if version else "no engine_version"
    assert problem.message == (
        f"runtime ({runtime!r}) is retired: a pool's serving engine is `engine` and its version "
        f"`engine_version`; write {write} instead (docs/policy.md#versions)"
    )


def test_a_pool_giving_both_runtime_and_engine_version_is_refused_on_load() -> None:
    text = old_policy("vllm", "vllm 0.6.3").replace(
        "runtime: 'vllm 0.6.3'", "runtime: 'vllm 0.6.3'\n    engine_version: '0.6.4'", 1
    )
    with pytest.raises(PolicyError, match=r"pools\.gpu\.runtime: runtime \('vllm 0\.6\.3'\) is"):
        parse_policy(text, "old.yaml")
