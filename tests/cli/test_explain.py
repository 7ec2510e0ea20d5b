"""`gateway explain`: the decision for a request, without sending it."""

from __future__ import annotations

import json
from pathlib import Path

from command import gateway


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
