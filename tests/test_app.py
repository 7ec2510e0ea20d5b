"""The app built from the environment: the policy file it serves."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.settings import Settings


def test_a_policy_file_with_a_retired_key_is_served_and_the_key_named_in_the_log(
    repo_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / "old.yaml"
    text = (repo_root / "policies" / "default.yaml").read_text()
    old.write_text(
        text.replace("    engine: vllm ", '    runtime: "vllm 0.6.3"\n    engine: vllm ', 1)
    )
    with caplog.at_level(logging.WARNING, logger="gateway.app"):
        app = create_app(Settings(policy_path=old))
    # An upgrade never stops a gateway: the file serves, its runtime read as the engine version.
    assert app.gateway.policy.pools["gpu"].engine_version == "0.6.3"
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{old}: pools.gpu.runtime: runtime ('vllm 0.6.3') is")
    assert "write engine_version: '0.6.3' instead" in record.getMessage()
