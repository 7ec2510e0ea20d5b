"""The command line: start-up line, flag overrides, new profiles, clean exit."""

import contextlib
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from harness.simulators import start_simulator

PROFILES = Path(__file__).parents[2] / "simulator" / "profiles"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_exits_with_status_zero_on_sigterm_and_sigint(sig):
    with start_simulator("cim") as sim:
        sim.process.send_signal(sig)
        assert sim.process.wait(timeout=10) == 0


def test_exits_cleanly_even_with_a_request_hanging():
    with start_simulator("gpu") as sim:
        sim.set_faults(hang=True)

        def hang() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{sim.url}/health", timeout=30)

        threading.Thread(target=hang, daemon=True).start()
        sim.wait_for_metric("sim_faults_injected_total", 1, kind="hang")
        sim.process.terminate()
        assert sim.process.wait(timeout=10) == 0


def test_flags_override_the_profile_figures():
    flags = ["--models", "llama-3.1-8b-instruct", "--max-context", "100", "--idle-w", "50"]
    with start_simulator("gpu", extra_args=flags) as sim:
        models = httpx.get(f"{sim.base_url}/models").json()["data"]
        assert [model["id"] for model in models] == ["llama-3.1-8b-instruct"]
        too_long = httpx.post(
            f"{sim.base_url}/completions",
            json={"model": "llama-3.1-8b-instruct", "prompt": "word " * 95, "max_tokens": 10},
        )
        assert too_long.status_code == 400
        assert "maximum context length is 100" in too_long.json()["error"]["message"]
        assert sim.metric("DCGM_FI_DEV_POWER_USAGE") == pytest.approx(50)


def test_rejects_an_unknown_profile_naming_the_bundled_ones():
    result = subprocess.run(
        [sys.executable, "-m", "simulator", "--profile", "tpu", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "bundled: asic, cim, gpu" in result.stderr


def test_serves_a_fourth_kind_of_chip_from_a_profile_file(tmp_path):
    profile = yaml.safe_load((PROFILES / "asic.yaml").read_text())
    profile.update(name="npu", hardware="Example NPU", device_label_prefix="npu", slots=3)
    path = tmp_path / "npu.yaml"
    path.write_text(yaml.safe_dump(profile))
    with start_simulator(str(path)) as sim:
        reply = httpx.post(
            f"{sim.base_url}/chat/completions",
            json={
                "model": "llama-3.1-8b-instruct",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 3,
            },
        )
        assert reply.status_code == 200
        metrics = sim.metrics()
    assert 'device="npu0"' in metrics
    assert 'modelName="Example NPU"' in metrics
