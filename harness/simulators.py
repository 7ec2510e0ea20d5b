"""Start simulator processes: `with start_simulator("gpu") as sim: sim.url`.

Each simulator is a real
`python -m simulator` subprocess on a free loopback port (it picks the port itself and
announces it, so there is no race for ports), stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from harness.metrics import metric_value

READY = re.compile(r"listening on (http://\S+)")


class SimulatorProcess:
    """A running simulator subprocess and the calls tests make on it."""

    def __init__(self, process: subprocess.Popen[str], url: str, api_key: str | None = None):
        self.process = process
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        self.base_url = f"{url}/v1"
        auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url, timeout=10.0, headers=auth)

    def set_faults(self, **fields: Any) -> dict[str, Any]:
        """Change the injected faults (partial update) and return them all."""
        response = self._http.post("/admin/faults", json=fields)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def lose_kv_events(self, batches: int) -> None:
        """Keep the next `batches` KV-event batches off the PUB socket (kept for replay)."""
        self._http.post("/admin/kv-events", json={"lose": batches}).raise_for_status()

    def reset_prefix_cache(self) -> None:
        """Make every device forget its cached prefixes (vLLM's /reset_prefix_cache)."""
        self._http.post("/reset_prefix_cache").raise_for_status()

    def reset_faults(self) -> dict[str, Any]:
        """Clear every injected fault."""
        return self.set_faults(reset=True)

    def faults(self) -> dict[str, Any]:
        """Return the injected faults."""
        result: dict[str, Any] = self._http.get("/admin/faults").json()
        return result

    def metrics(self) -> str:
        """Return the Prometheus exposition text."""
        response = self._http.get("/metrics")
        response.raise_for_status()
        return response.text

    def metric(self, name: str, **labels: str) -> float:
        """Return the sum of the series called `name` whose labels include `labels`."""
        return metric_value(self.metrics(), name, **labels)

    def wait_for_metric(
        self, name: str, at_least: float, *, timeout: float = 60.0, **labels: str
    ) -> float:
        """Poll until the metric reaches `at_least` and return it; fail after `timeout` s."""
        deadline = time.monotonic() + timeout
        while (value := self.metric(name, **labels)) < at_least:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} stayed at {value}, below {at_least}, for {timeout} s")
            time.sleep(0.005)
        return value

    def stop(self, timeout: float = 5.0) -> int:
        """Stop the process (SIGTERM, then SIGKILL after `timeout` s) and return its exit code."""
        self._http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextlib.contextmanager
def start_simulator(
    profile: str = "gpu",
    *,
    speed: float = 100.0,
    seed: int = 0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    api_key: str | None = None,
    python: str = sys.executable,
    cwd: str | None = None,
) -> Iterator[SimulatorProcess]:
    """Run `python -m simulator` on a free loopback port until the block exits.

    With `api_key`, the simulator requires it and this object's own calls send it. `python`
    and `cwd` run another installation of it, from another directory.
    """
    command = [
        python,
        "-m",
        "simulator",
        "--profile",
        profile,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--speed",
        str(speed),
        "--seed",
        str(seed),
        *(["--api-key", api_key] if api_key else []),
        *extra_args,
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    try:
        url = _wait_for_announcement(process, command, startup_timeout)
        simulator = SimulatorProcess(process, url, api_key)
        _wait_until_answering(simulator, startup_timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    try:
        yield simulator
    finally:
        simulator.stop()


def _wait_for_announcement(
    process: subprocess.Popen[str], command: Sequence[str], timeout: float
) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"simulator exited with status {process.wait()} before listening"
                    f" ({' '.join(command)})"
                )
            match = READY.search(line)
            if match:
                # Keep draining stdout so a chatty simulator can never block on a full pipe.
                threading.Thread(target=process.stdout.read, daemon=True).start()
                return match.group(1)
    raise RuntimeError(f"simulator did not announce its URL within {timeout} s")


def _wait_until_answering(simulator: SimulatorProcess, timeout: float) -> None:
    # /metrics, not /health: faults given as flags (--hang, --refuse) never touch /metrics.
    deadline = time.monotonic() + timeout
    while True:
        try:
            simulator.metrics()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
