"""`gateway bench`: the routing benchmark's result file, its errors, and a benchmark missing."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint, EntryPoints, entry_points
from pathlib import Path

import pytest

from gateway.cli import bench, main
from lab.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "azure_llm_2023_conv.csv"  # traces/README.md


def test_bench_routing_command_writes_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "routing.json"
    policy = str(ROOT / "policies" / "default.yaml")
    command = ["bench", "routing", "--trace", str(TRACE), "--out", str(out), "--limit", "120"]
    status = main([*command, "--policy", policy, "--seed", "3"])
    assert status == 0
    document = json.loads(out.read_text())
    assert document["requests"] == 120 and document["seed"] == 3
    assert set(document["strategies"]) == set(STRATEGIES)
    for name, result in document["strategies"].items():
        for key in (
            "energy_j_per_request",
            "fleet_energy_j",
            "cost_usd_per_1k_tokens",
            "slo_attainment",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "pool_shares",
        ):
            assert key in result, (name, key)
    assert "mape_after_500" in document["strategies"]["learned"]["cost_model"]
    assert "slo_attainment" in document["targets"]
    assert "learned" in capsys.readouterr().out


def test_bench_routing_command_names_a_missing_trace(tmp_path: Path) -> None:
    status = main(
        ["bench", "routing", "--trace", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o")]
    )
    assert status == 2


def test_a_benchmark_registered_but_not_shipped_says_so_and_the_other_commands_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ghost = EntryPoint("ghost", "no_such_benchmark.command:add", bench.GROUP)
    registered = entry_points(group=bench.GROUP)
    monkeypatch.setattr(bench, "entry_points", lambda group: EntryPoints([*registered, ghost]))
    assert main(["policy", "schema"]) == 0
    capsys.readouterr()
    assert main(["bench", "ghost", "--trace", "t.csv", "--out", "o.json"]) == 2
    error = capsys.readouterr().err
    assert "the ghost benchmark is registered" in error and "no_such_benchmark" in error
