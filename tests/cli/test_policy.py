"""The policy workflow from the command line: validate, diff, apply, history, rollback, schema."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from command import ROOT, gateway

from gateway.db.connection import upgrade
from gateway.policy.load import json_schema, render_policy
from policies import fleet_policy


def test_apply_diff_history_and_rollback_through_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    env = {"DATABASE_URL": url}
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(render_policy(fleet_policy()))
    second.write_text(render_policy(fleet_policy(assumed_max_tokens=512)))

    missing_message = gateway("policy", "apply", str(first), env=env)
    assert missing_message.returncode != 0 and "-m" in missing_message.stderr
    applied = gateway("policy", "apply", str(first), "-m", "start", "--author", "ana", env=env)
    assert applied.returncode == 0, applied.stderr
    assert "as version 1" in applied.stdout and "warning: " in applied.stdout  # cim unused

    diff = gateway("policy", "diff", str(second), env=env)
    assert diff.returncode == 0
    assert "--- version 1 (active)" in diff.stdout and "+assumed_max_tokens: 512" in diff.stdout

    assert "as version 2" in gateway("policy", "apply", str(second), "-m", "more", env=env).stdout
    unchanged = gateway("policy", "apply", str(second), "-m", "again", env=env)
    assert "unchanged, already the active version 2" in unchanged.stdout

    rolled = gateway("policy", "rollback", env=env)
    assert rolled.returncode == 0 and "version 3 restores version 1" in rolled.stdout
    history = gateway("policy", "history", env=env).stdout.splitlines()
    assert history[1].split()[:2] == ["*", "3"]  # newest first, the active one marked
    assert [line.split()[0] for line in history[2:]] == ["2", "1"]
    assert "roll back to version 1" in history[1] and "ana" in history[3]
    assert gateway("policy", "show", env=env).stdout == first.read_text()
    assert gateway("policy", "rollback", "9", env=env).returncode == 1


def test_apply_refuses_an_invalid_policy_with_the_loaders_message(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    broken = tmp_path / "broken.yaml"
    broken.write_text(render_policy(fleet_policy()).replace("fallback: gpu", "fallback: gpux", 1))
    result = gateway("policy", "apply", str(broken), "-m", "oops", env={"DATABASE_URL": url})
    assert result.returncode == 2
    assert f"{broken}:" in result.stderr and "routes.0.fallback" in result.stderr
    history = gateway("policy", "history", env={"DATABASE_URL": url})
    assert len(history.stdout.splitlines()) == 1  # the header only: nothing was stored


def test_schema_prints_the_json_schema_of_the_typed_model() -> None:
    result = gateway("policy", "schema")
    assert json.loads(result.stdout) == json.loads(json.dumps(json_schema()))


def test_policy_validate_accepts_the_default_policy() -> None:
    result = gateway("policy", "validate", "policies/default.yaml")
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


# The GPU pool of the default policy before gpu-70b: the 70B model beside the 8B and the
# embedding model on one 80 GB GPU.
OLD_GPU_POOL = """
kind: gpu
backends: [{url: "http://127.0.0.1:9101"}, {url: "http://127.0.0.1:9102"}]
models: [llama-3.1-8b-instruct, llama-3.1-70b-instruct, bge-large-en-v1.5]
max_context: 131072
memory_gb: 80
kv_cache_gb: 40
slots_per_backend: 32
precision: bf16
compute_tflops: 989
bandwidth_gbs: 3350
power: {idle_w: 120, max_w: 700}
price: {usd_per_hour: 2.50, usd_per_kwh: 0.12}
"""


def test_validate_and_apply_refuse_models_that_do_not_fit_a_pools_memory(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["gpu"] = yaml.safe_load(OLD_GPU_POOL)
    del doc["pools"]["gpu-70b"]
    (chat_70b,) = [r for r in doc["routes"] if r["name"] == "chat-70b"]
    chat_70b["pools"] = ["gpu"]
    old = tmp_path / "old-default.yaml"
    old.write_text(yaml.safe_dump(doc, sort_keys=False))

    result = gateway("policy", "validate", str(old))
    assert result.returncode == 2
    assert f"{old}:" in result.stderr and "pools.gpu.memory_gb" in result.stderr
    assert (
        "pool 'gpu' holds llama-3.1-70b-instruct (140.0 GB in bf16), llama-3.1-8b-instruct "
        "(16.0 GB), bge-large-en-v1.5 (0.7 GB) and 40.0 GB of KV cache plus 8.0 GB of "
        "headroom (10% of memory): 204.7 GB, more than its 80 GB" in result.stderr
    )
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    applied = gateway(
        "policy", "apply", str(old), "-m", "70B on the GPU", env={"DATABASE_URL": url}
    )
    assert applied.returncode == 2 and "204.7 GB, more than its 80 GB" in applied.stderr
    assert len(gateway("policy", "history", env={"DATABASE_URL": url}).stdout.splitlines()) == 1


def test_routes_without_a_gpu_fallback_are_warned_of_but_valid(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    (embeddings,) = [r for r in doc["routes"] if r["name"] == "embeddings"]
    embeddings["fallback"] = "asic"
    doubtful = tmp_path / "doubtful.yaml"
    doubtful.write_text(yaml.safe_dump(doc, sort_keys=False))

    result = gateway("policy", "validate", str(doubtful))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, result.stdout
    assert "routes.2.fallback: route 'chat-70b' has no fallback" in warnings[0]
    assert "route 'embeddings' falls back to pool 'asic', of kind 'asic', not gpu" in warnings[1]
    assert gateway("policy", "validate", "--strict", str(doubtful)).returncode == 1


def test_policy_validate_names_file_field_and_value(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["gpu"]["max_context"] = "lots"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = gateway("policy", "validate", str(bad))
    assert result.returncode == 2
    assert f"{bad}:" in result.stderr
    assert "pools.gpu.max_context" in result.stderr and "'lots'" in result.stderr
