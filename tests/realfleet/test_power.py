"""The real fleet's power exporter: real processes on this machine, scraped over loopback.

Each test starts `python -m realfleet.power` as a subprocess watching children it spawns (a
busy loop, a sleeper) and reads the pages as the gateway does (gateway.upstream.exposition with
the policy's PowerMetrics names). Nothing waits for a time: tests wait until /proc shows the
CPU time they need, and assert relations that hold however slow the machine is.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from waiting import wait_for

from gateway.policy.definition import PowerMetrics
from gateway.upstream import exposition
from realfleet import power

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"listening on (http://\S+)")
NAMES = PowerMetrics()
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}
TICK = os.sysconf("SC_CLK_TCK")
BUSY = "while True: pass"
SLEEPING = "import time; time.sleep(3600)"


@pytest.fixture
def spawn() -> Iterator:
    """Start Python children running a snippet; kill whatever is left at the end."""
    children: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", code])
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()


@contextlib.contextmanager
def exporter(*args: str) -> Iterator[httpx.Client]:
    """Run the exporter with `args` on a free loopback port; yield a client on its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "realfleet.power", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # returns once it is ready, or at its exit
        found = READY.search(line)
        if found is None:
            process.kill()
            _, err = process.communicate()
            raise AssertionError(f"the exporter did not start: {line!r} {err!r}")
        with httpx.Client(base_url=found[1], timeout=10.0) as client:
            yield client
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)


def page(client: httpx.Client, name: str) -> str:
    response = client.get(f"/backends/{name}/metrics")
    assert response.status_code == 200, response.text
    return response.text


def energy_j(text: str) -> float:
    """Read the energy counter as the gateway's metering does (mJ, summed over devices)."""
    counter = exposition.total(text, NAMES.energy_counter)
    assert counter is not None, text
    return counter / 1000.0


def power_w(text: str) -> float:
    gauge = exposition.total(text, NAMES.power_gauge)
    assert gauge is not None, text
    return gauge


def up(text: str) -> bool:
    return exposition.total(text, "realfleet_power_process_up") == 1


def proc(pid: int) -> tuple[float, float]:
    """Return (start, CPU seconds) of a process, read from /proc/PID/stat by this test."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / TICK, (int(fields[11]) + int(fields[12])) / TICK


def boot() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def cpu_reaches(pid: int, seconds: float) -> None:
    wait_for(
        lambda: proc(pid)[1] >= seconds,
        message=lambda: f"process {pid} used {proc(pid)[1]} s of CPU, not {seconds}",
    )


def test_a_busy_process_uses_energy_faster_than_a_sleeping_one(spawn) -> None:
    busy, sleeping = spawn(BUSY), spawn(SLEEPING)
    backends = ["--backend", f"busy={busy.pid}:0.5:20", "--backend", f"idle={sleeping.pid}:0.5:20"]
    with exporter(*backends) as client:
        before = {name: energy_j(page(client, name)) for name in ("busy", "idle")}
        cpu_reaches(busy.pid, proc(busy.pid)[1] + 0.3)
        after = {name: energy_j(page(client, name)) for name in ("busy", "idle")}
        # 0.3 CPU-seconds at 20 W a core is 6 J more; the idle terms differ only by how far
        # apart the two pages were read (0.5 W for each second of that).
        assert after["busy"] - before["busy"] > after["idle"] - before["idle"] + 3.0
        # The gauge is a mean over a second or more: it shows the busy loop's cores too.
        wait_for(
            lambda: power_w(page(client, "busy")) > power_w(page(client, "idle")) + 2.0,
            message="the busy process's power never rose above the sleeping one's",
        )


@pytest.mark.parametrize(
    ("figures", "idle_w", "per_core"),
    [(":2:10", 2.0, 10.0), ("", power.IDLE_W, power.WATTS_PER_CORE)],
    ids=["stated figures", "default figures"],
)
def test_the_counter_is_the_models_energy_from_proc_cpu_times(
    spawn, figures: str, idle_w: float, per_core: float
) -> None:
    busy = spawn(BUSY)
    with exporter("--backend", f"engine={busy.pid}{figures}") as client:
        for target in (0.2, 0.5):
            cpu_reaches(busy.pid, target)
            # The exporter reads /proc and the clock between these two looks of the test's.
            t0, (start, cpu0) = boot(), proc(busy.pid)
            text = page(client, "engine")
            (_, cpu1), t1 = proc(busy.pid), boot()
            low = idle_w * (t0 - start) + per_core * cpu0
            high = idle_w * (t1 - start) + per_core * cpu1
            assert low - 0.001 <= energy_j(text) <= high + 0.001  # mJ rounding
            assert exposition.total(text, "realfleet_power_idle_watts") == idle_w
            assert exposition.total(text, "realfleet_power_watts_per_core") == per_core


def test_each_backend_page_is_one_device_the_gateway_reads(spawn) -> None:
    a, b = spawn(SLEEPING), spawn(SLEEPING)
    with exporter("--backend", f"gpu-0={a.pid}", "--backend", f"asic-0={b.pid}") as client:
        for name, child in (("gpu-0", a), ("asic-0", b)):
            text = page(client, name)
            series = list(exposition.samples(text, NAMES.energy_counter))
            gauges = list(exposition.samples(text, NAMES.power_gauge))
            assert len(series) == len(gauges) == 1
            labels, _ = series[0]
            assert set(labels) == DCGM_LABELS
            assert labels["device"] == name and labels["gpu"] == "0"
            assert str(child.pid) in labels["UUID"]
            assert energy_j(text) > 0 and power_w(text) >= power.IDLE_W - 0.001
        everything = client.get("/metrics")
        assert everything.headers["content-type"].startswith("text/plain; version=0.0.4")
        devices = {
            labels["device"]: labels["gpu"]
            for labels, _ in exposition.samples(everything.text, NAMES.energy_counter)
        }
        assert devices == {"gpu-0": "0", "asic-0": "1"}
        assert client.get("/healthz").status_code == 200


def test_counters_never_go_back_between_scrapes(spawn) -> None:
    busy = spawn(BUSY)
    with exporter("--backend", f"busy={busy.pid}:1:5") as client:
        seen = [energy_j(page(client, "busy"))]
        target = proc(busy.pid)[1] + 0.3
        # Scrape as fast as the machine allows while the process burns CPU, then once more.
        while proc(busy.pid)[1] < target:
            seen.append(energy_j(page(client, "busy")))
        seen.append(energy_j(page(client, "busy")))
        assert all(later >= earlier for earlier, later in itertools.pairwise(seen))
        assert seen[-1] > seen[0]


def test_an_exited_process_keeps_its_counter_and_draws_nothing(spawn) -> None:
    child = spawn(BUSY)
    with exporter("--backend", f"gone={child.pid}:1:5") as client:
        cpu_reaches(child.pid, 0.1)
        alive = page(client, "gone")
        assert up(alive)
        child.kill()
        child.wait()

        def exited() -> str | None:
            text = page(client, "gone")
            return None if up(text) else text

        dead = wait_for(exited, message="the exporter never saw its process exit")
        assert energy_j(dead) >= energy_j(alive)
        assert power_w(dead) == 0
        assert energy_j(page(client, "gone")) == energy_j(dead)


def test_a_cap_clips_the_power_at_max_w(spawn) -> None:
    busy = spawn(BUSY)
    with exporter("--backend", f"capped={busy.pid}:1:50:3") as client:
        cpu_reaches(busy.pid, proc(busy.pid)[1] + 0.3)
        t0, (start, _) = boot(), proc(busy.pid)
        text = page(client, "capped")
        assert power_w(text) <= 3.0 + 0.001
        assert energy_j(page(client, "capped")) <= 3.0 * (boot() - start) + 0.001
        assert energy_j(text) >= 1.0 * (t0 - start) - 0.001


def test_an_unknown_backend_or_page_is_404(spawn) -> None:
    child = spawn(SLEEPING)
    with exporter("--backend", f"gpu-0={child.pid}") as client:
        missing = client.get("/backends/gpu-9/metrics")
        assert missing.status_code == 404
        assert "gpu-0" in missing.text  # it names the backends there are
        assert client.get("/backends/gpu-0/other").status_code == 404
        assert client.get("/backends/gpu-0/metrics/extra").status_code == 404


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("gpu-0", "is not NAME=PID"),
        ("gpu-0=abc", "PID must be an integer"),
        ("gpu-0=1:1:1:0.5", "max_w must be"),
        ("gpu-0=1:-1", "idle_w must be"),
    ],
)
def test_rejects_a_malformed_backend_naming_it(flag: str, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "realfleet.power", "--port", "0", "--backend", flag],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert message in result.stderr and flag in result.stderr


def test_refuses_to_start_for_a_process_that_is_not_there(spawn) -> None:
    child = spawn(SLEEPING)
    child.kill()
    child.wait()
    result = subprocess.run(
        [sys.executable, "-m", "realfleet.power", "--port", "0", "--backend", f"x={child.pid}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert f"no process with PID {child.pid}" in result.stderr


def test_exits_with_status_zero_on_sigterm(spawn) -> None:
    child = spawn(SLEEPING)
    process = subprocess.Popen(
        [sys.executable, "-m", "realfleet.power", "--port", "0", "--backend", f"a={child.pid}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None
    assert READY.search(process.stdout.readline())
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_a_reused_pid_counts_as_the_process_having_exited() -> None:
    times = {"now": 110.0, "start": 100.0, "cpu": 2.0}

    def read(pid: int) -> power.ProcessTimes:
        return power.ProcessTimes(start_s=times["start"], cpu_s=times["cpu"], zombie=False)

    model = power.PowerModel(idle_w=1.0, watts_per_core=10.0)
    meter = power.BackendMeter(
        power.BackendSpec("a", 42, model), read=read, clock=lambda: times["now"]
    )
    first = meter.reading()
    assert first.up and first.energy_j == pytest.approx(1.0 * 10 + 10.0 * 2)
    times.update(now=120.0, start=119.0, cpu=0.1)  # another process now has PID 42
    later = meter.reading()
    assert not later.up and later.power_w == 0 and later.energy_j == first.energy_j


def test_reads_proc_stat_whose_command_name_has_spaces_and_parentheses(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    fields = ["Z", *["0"] * 10, str(3 * TICK), str(TICK), *["0"] * 6, str(50 * TICK), "0"]
    (tmp_path / "7" / "stat").write_text(f"7 (llama (server) x) {' '.join(fields)}\n")
    times = power.read_process(7, tmp_path)
    assert times == power.ProcessTimes(start_s=50.0, cpu_s=4.0, zombie=True)
    assert power.read_process(8, tmp_path) is None
