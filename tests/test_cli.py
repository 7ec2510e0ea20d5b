"""The `gateway` command as an operator runs it: validate, migrate, serve and stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import sqlalchemy as sa
import yaml
from gatewayserver import free_port, wait_ready
from test_hostile_requests import NOT_HTTP, UPGRADE, not_http_error
from test_retention import store

from gateway.db.schema import request_records, shadow_records
from policies import MODEL

ROOT = Path(__file__).resolve().parent.parent


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=60,
    )


def test_policy_validate_accepts_the_default_policy() -> None:
    result = gateway("policy", "validate", "policies/default.yaml")
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_policy_validate_names_file_field_and_value(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["gpu"]["max_context"] = "lots"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = gateway("policy", "validate", str(bad))
    assert result.returncode == 2
    assert f"{bad}:" in result.stderr
    assert "pools.gpu.max_context" in result.stderr and "'lots'" in result.stderr


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    result = gateway("db", "upgrade", env={"DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    engine = sa.create_engine(url)
    assert request_records.name in sa.inspect(engine).get_table_names()
    engine.dispose()


def test_db_prune_deletes_records_past_retention_and_says_how_many(database: str) -> None:
    engine = sa.create_engine(database)
    now = time.time()
    store(engine, request_records, [40, 35, 1], now=now)
    store(engine, shadow_records, [40, 1], now=now)
    result = gateway(
        "db",
        "prune",
        env={"DATABASE_URL": database, "GATEWAY_SHADOW_RETENTION_DAYS": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert "request_records: deleted 2 rows from before" in result.stdout
    assert "shadow_records: kept forever" in result.stdout
    assert "cost_models: deleted 0 from before the request window" in result.stdout
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar() == 1
        assert conn.execute(sa.select(sa.func.count()).select_from(shadow_records)).scalar() == 2
    engine.dispose()


def test_db_prune_on_an_unmigrated_database_says_so(tmp_path: Path) -> None:
    result = gateway("db", "prune", env={"DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"})
    assert result.returncode == 1
    assert "cannot delete old rows of request_records" in result.stderr
    assert "gateway db upgrade" in result.stderr


def test_serve_refuses_an_invalid_policy_at_startup(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {}\n")
    result = gateway("serve", "--port", "1", env={"GATEWAY_POLICY": str(bad)})
    assert result.returncode == 2
    assert str(bad) in result.stderr and "pools" in result.stderr


def test_serve_answers_then_stops_on_sigterm_with_records_flushed(sims, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["gpu"]["backends"] = [{"url": u} for u in sims.urls("gpu")]
    doc["pools"]["asic"]["backends"] = [{"url": u} for u in sims.urls("asic")]
    doc["pools"]["cim"]["backends"] = [{"url": u} for u in sims.urls("cim")]
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    url = f"sqlite:///{tmp_path / 'g.db'}"
    env = {
        **os.environ,
        "GATEWAY_POLICY": str(policy),
        "DATABASE_URL": url,
        "GATEWAY_RECORD_FLUSH_INTERVAL_S": "30",
    }
    assert gateway("db", "upgrade", env=env).returncode == 0
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_ready(port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        for _ in range(3):
            assert client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            ).choices
        error = not_http_error(f"http://127.0.0.1:{port}", NOT_HTTP[0])
        assert error["code"] == "invalid_http_request"
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=UPGRADE, timeout=10)
        assert models.status_code == 200, models.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar()
    engine.dispose()
    # The flush interval is 30 s: the records exist only because shutdown wrote them.
    assert count == 3


def test_explain_shows_the_decision_and_predictions_without_sending(tmp_path: Path) -> None:
    body = tmp_path / "request.json"
    body.write_text(
        '{"model": "llama-3.1-8b-instruct", "max_tokens": 64,'
        ' "messages": [{"role": "user", "content": "hello"}]}'
    )
    result = gateway(
        "explain",
        str(body),
        "-H",
        "x-slo-ttft-ms: 300",
        env={"DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"},
    )
    assert result.returncode == 0, result.stderr
    explained = json.loads(result.stdout)
    assert explained["decision"]["route"] == "chat-8b-short"
    assert explained["decision"]["objective"] == "min_cost"
    assert explained["profile"]["ttft_ms"] == 300
    assert set(explained["predictions"]) == {"gpu", "asic"}
    assert explained["trace"]


def test_explain_reports_the_error_a_client_would_get(tmp_path: Path) -> None:
    body = tmp_path / "request.json"
    body.write_text('{"model": "gpt-nope", "messages": [{"role": "user", "content": "x"}]}')
    result = gateway("explain", str(body))
    assert result.returncode == 1
    explained = json.loads(result.stdout)
    assert (explained["status"], explained["error"]["code"]) == (404, "model_not_found")


def test_model_train_learns_from_recorded_requests(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    assert gateway("db", "upgrade", env={"DATABASE_URL": url}).returncode == 0
    engine = sa.create_engine(url)
    rows = []
    for i in range(120):
        prompt, output, concurrent = 100 + 10 * i, 20 + i % 50, 1 + i % 8
        e2e_ms = 30 + 0.05 * prompt + output * (9 + concurrent)
        rows.append(
            {
                "decision_id": f"{i:032d}",
                "ts": time.time() - 60 + i * 0.1,
                "endpoint": "chat",
                "route": "chat-8b",
                "pool": "asic",
                "backend": "asic-0",
                "model": MODEL,
                "stream": True,
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "concurrent": concurrent,
                "queue_ms": 0.0,
                "ttft_ms": 30 + 0.05 * prompt,
                "tpot_ms": 9.0 + concurrent,
                "e2e_ms": e2e_ms,
                "energy_j": e2e_ms * 0.08,
                "energy_estimated": False,
                "attempts": 1,
                "fallback": False,
                "status": 200,
            }
        )
    with engine.begin() as conn:
        conn.execute(request_records.insert(), rows)
    result = gateway("model", "train", env={"DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    assert "cost model version 1 trained on 120 requests" in result.stdout
    assert "asic" in result.stdout and "%" in result.stdout
    from gateway.costmodel.store import load_latest
    from gateway.policy.load import load_policy

    model = load_latest(engine, load_policy(ROOT / "policies/default.yaml"))
    engine.dispose()
    assert model is not None and model.version == 1
    assert ("asic", MODEL) in model.trained
