"""Policy checks before apply: a catalogue of broken and doubtful policies, and the JSON Schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gateway.policy.load import json_schema, parse_policy, render_policy
from gateway.policy.validation import validate
from policies import BIG, MODEL, fleet_policy

Edit = Callable[[dict], None]


def base() -> dict:
    doc = yaml.safe_load(render_policy(fleet_policy()))
    doc["routes"][1]["shadow"] = [{"pool": "cim", "sample_rate": 0.1}]
    doc["routes"][2]["fallback"] = "gpu"  # chat-70b: without one it warns
    return doc


def checked(edit: Edit) -> tuple[list[str], list[str]]:
    doc = base()
    edit(doc)
    result = validate(yaml.safe_dump(doc, sort_keys=False), "p.yaml")
    assert result.valid == (not result.errors)
    return [f"{e.path}: {e.message}" for e in result.errors], [
        f"{w.path}: {w.message}" for w in result.warnings
    ]


def test_the_base_policy_is_clean() -> None:
    assert checked(lambda doc: None) == ([], [])


ERRORS: dict[str, tuple[Edit, str]] = {
    "unknown pool in a route": (
        lambda d: d["routes"][0]["pools"].append("tpu"),
        "routes.0.pools.2: route 'chat-8b-short' names pool 'tpu', which is not defined",
    ),
    "shadow-only pool serving": (
        lambda d: d["routes"][0]["pools"].append("cim"),
        "which is shadow-only",
    ),
    "unknown fallback": (lambda d: d["routes"][0].update(fallback="gpux"), "routes.0.fallback"),
    "fallback missing the route's models": (
        lambda d: d["routes"][2].update(fallback="asic"),
        f"falls back to pool 'asic', which does not serve ['{BIG}']",
    ),
    "shadow target is the primary": (
        lambda d: d["routes"][1]["shadow"][0].update(pool="gpu"),
        "which is its primary pool",
    ),
    "unknown SLO class": (
        lambda d: d["routes"][0]["match"].update(slo_classes=["gold"]),
        "matches SLO class 'gold', which is not defined",
    ),
    "unknown default class": (lambda d: d.update(default_slo_class="gold"), "default_slo_class"),
    "unknown tenant": (
        lambda d: d["routes"][0]["match"].update(tenants=["acme"]),
        "matches tenant 'acme', which is not defined",
    ),
    "inverted prompt range": (
        lambda d: d["routes"][0]["match"].update(prompt_tokens={"min": 10, "max": 5}),
        "max 5 is below min 10",
    ),
    "negative slots": (
        lambda d: d["pools"]["asic"].update(slots_per_backend=-1),
        "pools.asic.slots_per_backend: Input should be greater than 0 (got -1)",
    ),
    "unknown key": (lambda d: d["pools"]["asic"].update(slotz=3), "pools.asic.slotz"),
    "duplicate route name": (
        lambda d: d["routes"][1].update(name="chat-8b-short"),
        "is used twice",
    ),
    "shadow sample rate above 1": (
        lambda d: d["routes"][1]["shadow"][0].update(sample_rate=2),
        "routes.1.shadow.0.sample_rate",
    ),
    "unknown comparator": (
        lambda d: d["routes"][1]["shadow"][0].update(compare={"comparators": ["bleu"]}),
        "comparator 'bleu' is not known",
    ),
    "bad backend url": (
        lambda d: d["pools"]["gpu"]["backends"][0].update(url="gpu0:9000"),
        "must start with http:// or https://",
    ),
    "models that do not fit a backend's memory": (
        lambda d: d.update(models={BIG: {"params_b": 70}}),
        f"pools.gpu.memory_gb: pool 'gpu' holds {BIG} (140.0 GB in bf16), {MODEL} (16.0 GB, 8B "
        "assumed, not in models), bge-large-en-v1.5 (16.0 GB, 8B assumed, not in models) and "
        "70.5 GB of KV cache (half its memory: kv_cache_gb is not given) plus 14.1 GB "
        "of headroom (10% of memory): 256.6 GB, more than its 141 GB",
    ),
    "KV cache that does not fit beside the weights": (
        lambda d: d["pools"]["asic"].update(kv_cache_gb=100),
        "pools.asic.memory_gb: pool 'asic' holds",
    ),
    "parking with no hook": (
        lambda d: d["pools"]["gpu"].update(parking={"wake_s": 0.4}),
        "pools.gpu.parking.hook: Field required",
    ),
    "parking with no wake-up time": (
        lambda d: d["pools"]["gpu"].update(parking={"hook": "vllm"}),
        "pools.gpu.parking.wake_s: Field required",
    ),
    "a command hook without its commands": (
        lambda d: d["pools"]["gpu"].update(
            parking={"hook": "command", "wake_s": 2, "park_command": ["park", "{name}"]}
        ),
        "pools.gpu.parking: Value error, hook: command needs wake_command",
    ),
    "commands given to the vllm hook": (
        lambda d: d["pools"]["gpu"].update(
            parking={"hook": "vllm", "wake_s": 0.4, "park_command": ["park"]}
        ),
        "park_command is for hook: command; hook: vllm calls the backend's own /sleep",
    ),
    "a command naming an unknown field": (
        lambda d: d["pools"]["gpu"].update(
            parking={
                "hook": "command",
                "wake_s": 2,
                "park_command": ["stop", "{host}"],
                "wake_command": ["start", "{url}"],
            }
        ),
        "pools.gpu.parking.park_command: Value error, a command may name {name}, {url}, {pool}, "
        "not {host} (in '{host}')",
    ),
    "min_active below one": (
        lambda d: d["pools"]["gpu"].update(
            parking={"hook": "vllm", "wake_s": 0.4, "min_active": 0}
        ),
        "pools.gpu.parking.min_active: Input should be greater than or equal to 1 (got 0)",
    ),
    "min_active above the pool's backends": (
        lambda d: d["pools"]["asic"].update(
            parking={"hook": "vllm", "wake_s": 0.4, "min_active": 3}
        ),
        "pools.asic: Value error, parking.min_active is 3, more than the pool's 1 backends",
    ),
    "release through vLLM's sleep mode": (
        lambda d: d["pools"]["gpu"].update(
            parking={"hook": "vllm", "mode": "release", "wake_s": 0.4}
        ),
        "pools.gpu.parking: Value error, mode: release gives the device back, which vLLM's sleep "
        "mode does not",
    ),
    "an unknown parking mode": (
        lambda d: d["pools"]["gpu"].update(
            parking={"hook": "vllm", "mode": "hibernate", "wake_s": 0.4}
        ),
        "pools.gpu.parking.mode: Input should be 'sleep' or 'release'",
    ),
    "a wake-up longer than a hook call may take": (
        lambda d: d["pools"]["gpu"].update(
            parking={
                "hook": "command",
                "mode": "release",
                "wake_s": 180,
                "park_command": ["release", "{name}"],
                "wake_command": ["provision", "{name}"],
            }
        ),
        "pools.gpu.parking: Value error, wake_s is 180 s, longer than hook_timeout_s (30 s): a "
        "woken backend would be taken for failed before it could serve",
    ),
    "version written as a number": (
        lambda d: d["pools"]["gpu"].update(firmware=1.10),
        "pools.gpu.firmware: Value error, write a version as a quoted string, e.g. '1.1'",
    ),
    "a KV-event endpoint the gateway cannot connect to": (
        lambda d: d["pools"]["gpu"]["backends"][0].update(kv_events="tcp://*:5557"),
        "pools.gpu.backends.0.kv_events: Value error, a KV-event endpoint is tcp://HOST:PORT or "
        "ipc://PATH, where the gateway connects (no '*'), got 'tcp://*:5557'",
    ),
    "a replay socket without a publisher": (
        lambda d: d["pools"]["gpu"]["backends"][0].update(kv_events_replay="tcp://h:5558"),
        "kv_events_replay needs kv_events",
    ),
    "a tokenizer that is not an import path": (
        lambda d: d.setdefault("models", {}).update(
            {MODEL: {"params_b": 8, "tokenizer": "llama3"}}
        ),
        f"models.{MODEL}.tokenizer: Value error, tokenizer is an import path module:Class",
    ),
    "events from engines whose prompts the gateway cannot key by token": (
        lambda d: d["pools"]["gpu"]["backends"][0].update(kv_events="tcp://10.0.0.5:5557"),
        "pools.gpu.models: pool 'gpu' has backends publishing KV events, but models "
        f"'{MODEL}', '{BIG}'",
    ),
    "the former share margin of the quality check": (
        lambda d: d.setdefault("promotion", {}).update(quality_margin=0.01),
        "promotion: promotion.quality_margin (a share of departing answers) is no longer read: "
        "the judge holds departures per word at risk to promotion.departure_margin",
    ),
}


@pytest.mark.parametrize("kind", ERRORS)
def test_a_broken_policy_is_invalid_with_a_located_error(kind: str) -> None:
    edit, expected = ERRORS[kind]
    errors, _ = checked(edit)
    assert any(expected in e for e in errors), errors


WARNINGS: dict[str, tuple[Edit, str]] = {
    "route shadowed by an earlier one": (
        lambda d: d["routes"].insert(
            0, {"name": "all-8b", "match": {"models": [MODEL]}, "pools": ["gpu"]}
        ),
        "route 'chat-8b-short' can never match: route 'all-8b' before it",
    ),
    "model no pool of the route serves": (
        lambda d: d["routes"][2].update(pools=["asic"], fallback=None),
        f"matches model '{BIG}', which none of its pools (asic) serves",
    ),
    "prompts longer than every context": (
        lambda d: d["routes"][0].update(pools=["asic"], match={"prompt_tokens": {"min": 9000}}),
        "the longest context of its pools is 8192",
    ),
    "SLO no pool can meet": (
        lambda d: d["slo_classes"]["interactive"].update(tpot_ms=0.5),
        "no pool of route 'chat-8b-short' can meet interactive tpot_ms 0.5",
    ),
    "fallback missing some models": (
        lambda d: d["routes"].append({"name": "rest", "pools": ["gpu"], "fallback": "asic"}),
        f"falls back to pool 'asic', which does not serve ['{BIG}']",
    ),
    "unused pool": (
        lambda d: d["routes"][1].update(shadow=[]),
        "pools.cim: pool 'cim' is not used by any route",
    ),
    "route without a fallback": (
        lambda d: d["routes"][2].pop("fallback"),
        "routes.2.fallback: route 'chat-70b' has no fallback: when its pools (gpu) are full past "
        "the queue budget, its requests are refused (429 no_capacity)",
    ),
    "fallback that is not a GPU pool": (
        lambda d: d["routes"][3].update(fallback="asic"),
        "routes.3.fallback: route 'embeddings' falls back to pool 'asic', of kind 'asic', not gpu",
    ),
}


@pytest.mark.parametrize("kind", WARNINGS)
def test_a_doubtful_policy_is_valid_with_a_warning(kind: str) -> None:
    edit, expected = WARNINGS[kind]
    errors, warnings = checked(edit)
    assert errors == []
    assert any(expected in w for w in warnings), warnings


def test_a_version_stored_before_the_memory_check_still_loads_but_validates_no_more() -> None:
    doc = base()
    doc["pools"]["asic"]["kv_cache_gb"] = 100
    text = yaml.safe_dump(doc, sort_keys=False)
    # Replicas upgraded over it keep serving it; the next apply has to fix it.
    assert parse_policy(text).pools["asic"].kv_cache_gb == 100
    result = validate(text, "p.yaml")
    assert not result.valid and [e.path for e in result.errors] == ["pools.asic.memory_gb"]
    lines = text.splitlines()
    at = next(i for i in range(lines.index("  asic:"), len(lines)) if "memory_gb:" in lines[i])
    assert result.errors[0].location.startswith(f"p.yaml:{at + 1}:")


def test_warnings_name_file_line_and_column() -> None:
    text = render_policy(fleet_policy())
    (warning,) = [w for w in validate(text, "p.yaml").warnings if w.path == "pools.cim"]
    line = text.splitlines().index("  cim:") + 2  # where the pool's mapping starts
    assert warning.location == f"p.yaml:{line}:5"


def test_the_committed_json_schema_is_current(repo_root: Path) -> None:
    committed = json.loads((repo_root / "policies" / "policy.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema())), (
        "regenerate: gateway policy schema > policies/policy.schema.json"
    )


def test_each_parking_hook_is_valid_with_its_own_keys() -> None:
    def parked(doc: dict) -> None:
        doc["pools"]["gpu"]["parking"] = {"hook": "vllm", "wake_s": 0.4, "min_active": 1}
        doc["pools"]["asic"]["parking"] = {
            "hook": "command",
            "wake_s": 20,
            "park_command": ["/usr/local/bin/scale", "{pool}", "{name}", "--replicas=0"],
            "wake_command": ["/usr/local/bin/scale", "{pool}", "{name}", "--replicas=1"],
        }

    assert checked(parked) == ([], [])

    def released(doc: dict) -> None:
        parked(doc)
        doc["pools"]["asic"]["parking"] |= {"mode": "release", "wake_s": 180, "hook_timeout_s": 600}

    assert checked(released) == ([], [])
