"""What-if: recorded requests replayed through a proposed policy before it is applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa
import yaml

from gateway.db.connection import connect, upgrade
from gateway.db.schema import request_records

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "azure_llm_2023_conv.csv"  # traces/README.md


def record_trace_slice(url: str, n: int) -> None:
    """Store the trace's first n requests as served chat request records of the last hour."""
    lines = TRACE.read_text().splitlines()[1 : n + 1]
    start = time.time() - 3600
    rows = []
    for i, line in enumerate(lines):
        _, prompt, output = line.split(",")
        rows.append(
            {
                "decision_id": f"{i:032x}",
                "ts": start + i * 0.2,
                "endpoint": "chat",
                "model": "llama-3.1-8b-instruct",
                "stream": True,
                "prompt_tokens": int(prompt),
                "completion_tokens": int(output),
                "attempts": 1,
                "fallback": False,
                "status": 200,
            }
        )
    db = connect(url)
    with db.begin() as conn:
        conn.execute(request_records.insert(), rows)
    db.dispose()


def test_simulate_reports_the_change_a_proposed_policy_would_make(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade(url)
    record_trace_slice(url, 300)
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for route in doc["routes"]:
        if route["name"] == "chat-8b-short":
            route["pools"] = ["gpu"]  # the proposal: stop using the ASIC for short prompts
            route.pop("objective", None)
    proposed = tmp_path / "gpu-only.yaml"
    proposed.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "policy",
            "simulate",
            str(proposed),
            "--since",
            "2h",
            "--json",
        ],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["requests"] == 300
    # Fewer requests than the sample's size: the period is replayed whole, with no sampling
    # error to state.
    assert report["sample"]["requests"] == report["sample"]["period_requests"] == 300
    assert report["sample"]["whole"]
    share = report["runs"]["active"]["intervals"]["slo_attainment"]
    assert share["low"] == share["estimate"] == share["high"]
    shares = report["change"]["pool_shares"]
    assert shares["active"].get("asic", 0) > 0.5
    assert shares["proposed"].get("asic", 0) == 0
    # All on the GPU costs more energy per request than sending short prompts to the ASIC.
    assert report["change"]["energy_j_per_request"]["ratio"] > 1.2
    db = sa.create_engine(url)
    with db.connect() as conn:
        assert conn.execute(sa.text("select count(*) from policy_versions")).scalar() == 0
    db.dispose()


def test_simulate_says_when_there_is_nothing_to_replay(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade(url)
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "simulate", "policies/default.yaml"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert "nothing to replay" in result.stderr


def test_every_recorded_model_class_tenant_and_endpoint_is_replayed_as_it_was(
    tmp_path: Path,
) -> None:
    """A fleet's mix: 8B chat, 70B chat in the batch class, embeddings, a tenant's streams off."""
    from gateway.policy.load import load_policy
    from gateway.whatif.simulate import recorded_requests, simulate

    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade(url)
    start = time.time() - 600
    kinds = [
        ("llama-3.1-8b-instruct", "interactive", None, "chat", True, 800, 100),
        ("llama-3.1-70b-instruct", "batch", "acme", "chat", False, 1200, 200),
        ("bge-large-en-v1.5", "interactive", None, "embeddings", False, 300, 0),
        ("a-model-this-fleet-no-longer-serves", "interactive", None, "chat", True, 100, 10),
    ]
    rows = [
        {
            "decision_id": f"{i:032x}",
            "ts": start + i * 0.5,
            "endpoint": endpoint,
            "model": model,
            "slo_class": slo,
            "tenant": tenant,
            "stream": stream,
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "attempts": 1,
            "fallback": False,
            "status": 200,
        }
        for i, (model, slo, tenant, endpoint, stream, prompt, output) in enumerate(kinds * 30)
    ]
    db = connect(url)
    with db.begin() as conn:
        conn.execute(request_records.insert(), rows)
    requests = recorded_requests(db, start - 1)
    db.dispose()
    assert len(requests) == 120
    big = next(r for r in requests if r.model == "llama-3.1-70b-instruct")
    assert (big.slo_class, big.tenant, big.stream) == ("batch", "acme", False)
    assert next(r for r in requests if r.endpoint == "embeddings").output_tokens == 0
    policy = load_policy(ROOT / "policies" / "default.yaml")
    run = simulate(policy, policy, requests)["runs"]["active"]
    # Every model reached its own pools: the 70B model's own GPUs, the embeddings the ASIC.
    assert run["pool_shares"]["gpu-70b"] == 0.25
    assert run["served"] == 90  # the model no pool serves is refused, as it would be
    assert run["refused"] == 30
