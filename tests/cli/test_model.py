"""`gateway model train`: a new cost-model version from recorded requests."""

from __future__ import annotations

import time
from pathlib import Path

import sqlalchemy as sa
from command import gateway

from gateway.db.schema import request_records
from policies import MODEL

ROOT = Path(__file__).resolve().parents[2]


def test_model_train_learns_from_recorded_requests(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    assert gateway("db", "upgrade", env={"DATABASE_URL": url}).returncode == 0
    db = sa.create_engine(url)
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
    with db.begin() as conn:
        conn.execute(request_records.insert(), rows)
    result = gateway("model", "train", env={"DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    assert "cost model version 1 trained on 120 requests" in result.stdout
    assert "asic" in result.stdout and "%" in result.stdout
    from gateway.costmodel.store import load_latest
    from gateway.policy.load import load_policy

    model = load_latest(db, load_policy(ROOT / "policies/default.yaml"))
    db.dispose()
    assert model is not None and model.version == 1
    assert ("asic", MODEL) in model.trained
