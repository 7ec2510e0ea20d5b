"""A power exporter in DCGM's names for the real fleet's engines: `python -m realfleet.power`.

There is no power meter on this machine, so this is a **model, not a measurement**, in the
style of the ratio models of Kepler, Scaphandre and Cloud Carbon Footprint: each backend (one
llama-server process, named by its PID) draws

    P = idle_w + watts_per_core × (cores busy)      clipped at max_w, if one is given

where cores busy is the process's CPU time (utime + stime of /proc/PID/stat, all its threads)
per second of wall time. Energy is that power integrated: between two readings it is
`idle_w × Δwall + watts_per_core × ΔCPU`, so without a cap it is exact for the model whatever the
scrape timing (no sampling thread: each scrape reads /proc and adds what happened since the
last). The counter counts from the process's start, as DCGM's counts from the device's. With a
cap the clip applies to the mean power between readings, so it then depends a little on
their spacing.

Default figures, per backend (each engine runs one compute thread, realfleet/engine.py, so a
backend is modelled as one vCPU of a server of this machine's CPU generation, AMD EPYC 4th
gen, "Genoa"):

    idle_w          0.74 W    Cloud Carbon Footprint's "Min Watts" per vCPU for EPYC 4th Gen
    watts_per_core  1.54 W    its "Max Watts" (2.28 W) minus Min Watts: each busy vCPU adds that

from github.com/cloud-carbon-footprint/ccf-coefficients, output/coefficients-aws-use.csv
(0.739 and 2.282 W), which averages SPECpower_ssj2008 results of EPYC 9004/8004 servers: wall
power at active idle and at 100 % load divided by the hardware threads. They are whole-server
figures (memory, fans, supply included), a closer stand-in for a card's board power than a CPU
package alone. The alternative the flags allow is the package's TDP over its cores: an EPYC 9654
is 360 W over 96 cores, 3.75 W per core (AMD's specification): the package alone at full
load, with no idle term.

Interface: one process, one port, a page per backend, since the policy gives each backend its
own `metrics_url` (policies/real.yaml: `http://127.0.0.1:9440/backends/gpu-0/metrics`) and a
single port needs no port per backend to allocate, start or wait for:

    GET /backends/NAME/metrics   that backend's device series only (gpu="0"); 404 if unknown
    GET /metrics                 every backend's series (gpu = its index on the command line)
    GET /healthz                 200 once serving

    python -m realfleet.power --backend NAME=PID[:IDLE_W[:WATTS_PER_CORE[:MAX_W]]] ... \
        [--idle-w W] [--watts-per-core W] [--max-w W] [--host H] [--port P]

`--idle-w`, `--watts-per-core` and `--max-w` set the figures of every backend that does not give
its own. Port 0 picks a free port; the chosen one is announced as `listening on http://...`.

Series, with the DCGM exporter's label set as the simulator gives it (gpu, UUID, device,
modelName, Hostname):

    DCGM_FI_DEV_POWER_USAGE                 gauge, W: mean power over the last second or more
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION    counter, mJ since the process started
    realfleet_power_process_up              1 while the process runs, 0 once it has exited
    realfleet_power_cpu_seconds_total       the CPU time the model read
    realfleet_power_idle_watts, realfleet_power_watts_per_core: the model's figures

A process that exits (or whose PID now names another process: its start time differs) keeps
its last counter forever, so the counter never goes back; its power is 0 W and
`realfleet_power_process_up` 0. A dead engine draws nothing in this model: reporting idle power
for it would invent energy that no request could be charged. A zombie's final CPU time is still
counted. The exporter does not follow a restarted engine; the fleet restarts both together.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

IDLE_W = 0.74
WATTS_PER_CORE = 1.54
DEFAULT_PORT = 9440  # policies/real.yaml's metrics_url
POWER_WINDOW_S = 1.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


class PowerError(Exception):
    """A backend's figures or process are not usable; the message names the value."""


@dataclass(frozen=True, slots=True)
class PowerModel:
    """The stated power model of one backend: idle draw plus a figure per busy core."""

    idle_w: float = IDLE_W
    watts_per_core: float = WATTS_PER_CORE
    max_w: float | None = None

    def __post_init__(self) -> None:
        for field, value in (("idle_w", self.idle_w), ("watts_per_core", self.watts_per_core)):
            if not 0 <= value < float("inf"):
                raise PowerError(f"{field} must be a finite number of watts >= 0, got {value}")
        if self.max_w is not None and not self.idle_w < self.max_w < float("inf"):
            raise PowerError(
                f"max_w must be a finite number of watts above idle_w ({self.idle_w}), "
                f"got {self.max_w}"
            )

    def energy_j(self, seconds: float, cpu_s: float) -> float:
        """Return the energy of `seconds` of wall time in which the process used `cpu_s`."""
        joules = self.idle_w * seconds + self.watts_per_core * cpu_s
        return joules if self.max_w is None else min(joules, self.max_w * seconds)


@dataclass(frozen=True, slots=True)
class ProcessTimes:
    """What /proc/PID/stat says of a process: when it started and how much CPU it has used."""

    start_s: float  # seconds after boot (CLOCK_BOOTTIME)
    cpu_s: float  # utime + stime, all threads
    zombie: bool  # exited, not yet reaped: the times are final


def read_process(pid: int, proc: Path = PROC) -> ProcessTimes | None:
    """Return the process's times from /proc/PID/stat, or None if there is no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = text[text.rindex(")") + 2 :].split()
    state, utime, stime, starttime = fields[0], fields[11], fields[12], fields[19]
    return ProcessTimes(
        start_s=int(starttime) / CLK_TCK,
        cpu_s=(int(utime) + int(stime)) / CLK_TCK,
        zombie=state in ("Z", "X"),
    )


def boot_clock() -> float:
    """Return seconds since boot, the clock that /proc's process start times count on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend the exporter meters: its name (the URL path), its process and its model."""

    name: str
    pid: int
    model: PowerModel = PowerModel()


@dataclass(frozen=True, slots=True)
class Reading:
    """One backend's series at one moment."""

    energy_j: float
    power_w: float
    cpu_s: float
    up: bool


class BackendMeter:
    """A backend's energy counter and power gauge, brought up to date from /proc when read."""

    def __init__(
        self,
        spec: BackendSpec,
        *,
        read: Callable[[int], ProcessTimes | None] = read_process,
        clock: Callable[[], float] = boot_clock,
    ):
        self.spec = spec
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        first = read(spec.pid)
        if first is None:
            raise PowerError(f"backend {spec.name!r}: no process with PID {spec.pid}")
        self._start_s = first.start_s
        self.identity = f"{spec.pid}-{round(first.start_s * CLK_TCK)}"
        # The counter starts at the process's start, with no CPU used yet.
        self._t, self._cpu_s, self._energy_j = first.start_s, 0.0, 0.0
        self._history: deque[tuple[float, float]] = deque([(first.start_s, 0.0)])
        self._power_w = spec.model.idle_w
        self._up = True
        self._advance(first)

    def reading(self) -> Reading:
        """Read /proc, add the energy used since the last reading, and return the series."""
        with self._lock:
            if self._up:
                times = self._read(self.spec.pid)
                if times is None or times.start_s != self._start_s:  # gone, or PID reused
                    self._up = False
                else:
                    self._advance(times)
            return Reading(
                energy_j=self._energy_j,
                power_w=self._power_w if self._up else 0.0,
                cpu_s=self._cpu_s,
                up=self._up,
            )

    def _advance(self, times: ProcessTimes) -> None:
        now = self._clock()
        seconds = max(now - self._t, 0.0)
        cpu_s = max(times.cpu_s - self._cpu_s, 0.0)
        self._energy_j += self.spec.model.energy_j(seconds, cpu_s)
        self._t, self._cpu_s = now, max(times.cpu_s, self._cpu_s)
        self._history.append((now, self._energy_j))
        # Keep the newest reading at least a window old, so the gauge is a mean over a second
        # or more however often it is scraped (CPU time moves in ticks of 1/CLK_TCK s).
        while len(self._history) > 2 and self._history[1][0] <= now - POWER_WINDOW_S:
            self._history.popleft()
        then, energy_then = self._history[0]
        if now > then:
            self._power_w = (self._energy_j - energy_then) / (now - then)
        if times.zombie:
            self._up = False


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())


def cpu_model(proc: Path = PROC) -> str:
    """Return the host CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in (proc / "cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return "CPU"


class Exporter:
    """The meters of every backend, and their exposition text."""

    def __init__(self, meters: Sequence[BackendMeter], *, hostname: str, model_name: str):
        self.meters = {meter.spec.name: meter for meter in meters}
        self._index = {meter.spec.name: i for i, meter in enumerate(meters)}
        self._hostname = hostname
        self._model_name = model_name

    def render(self, names: Sequence[str] | None = None) -> bytes:
        """Return the exposition text of the backends `names` (all when None), read now.

        A page of one backend numbers its device gpu="0", as a DCGM exporter on a one-GPU host
        does; the page of all numbers them by their order on the command line."""
        chosen = list(self.meters) if names is None else list(names)
        alone = names is not None and len(chosen) == 1
        meters = [self.meters[name] for name in chosen]
        readings = [meter.reading() for meter in meters]
        dcgm = [
            _labels(
                {
                    "gpu": "0" if alone else str(self._index[meter.spec.name]),
                    "UUID": f"CPU-MODEL-{meter.spec.name}-{meter.identity}",
                    "device": meter.spec.name,
                    "modelName": f"{self._model_name} (power modelled from CPU time)",
                    "Hostname": self._hostname,
                }
            )
            for meter in meters
        ]
        ours = [_labels({"backend": m.spec.name, "pid": str(m.spec.pid)}) for m in meters]
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, values: Sequence[str]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(values)

        family(
            "DCGM_FI_DEV_POWER_USAGE",
            "gauge",
            "Power draw (in W), modelled from the process's CPU time.",
            [
                f"DCGM_FI_DEV_POWER_USAGE{{{la}}} {r.power_w:.3f}"
                for la, r in zip(dcgm, readings, strict=True)
            ],
        )
        family(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            "Total energy consumption since the process started (in mJ), modelled.",
            [
                f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{la}}} {r.energy_j * 1000.0:.0f}"
                for la, r in zip(dcgm, readings, strict=True)
            ],
        )
        family(
            "realfleet_power_process_up",
            "gauge",
            "1 while the backend's process runs; 0 once it has exited (its counter then holds).",
            [
                f"realfleet_power_process_up{{{la}}} {int(r.up)}"
                for la, r in zip(ours, readings, strict=True)
            ],
        )
        family(
            "realfleet_power_cpu_seconds_total",
            "counter",
            "CPU time (utime + stime) of the backend's process, the power model's input.",
            [
                f"realfleet_power_cpu_seconds_total{{{la}}} {r.cpu_s:.2f}"
                for la, r in zip(ours, readings, strict=True)
            ],
        )
        family(
            "realfleet_power_idle_watts",
            "gauge",
            "The power model's idle draw.",
            [
                f"realfleet_power_idle_watts{{{la}}} {m.spec.model.idle_w}"
                for la, m in zip(ours, meters, strict=True)
            ],
        )
        family(
            "realfleet_power_watts_per_core",
            "gauge",
            "The power model's draw per busy core.",
            [
                f"realfleet_power_watts_per_core{{{la}}} {m.spec.model.watts_per_core}"
                for la, m in zip(ours, meters, strict=True)
            ],
        )
        lines.append("")
        return "\n".join(lines).encode()


BACKEND_PATH = re.compile(r"/backends/([^/]+)/metrics")


def handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    """Return the request handler class that serves `exporter`'s pages."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/metrics":
                self._send(200, exporter.render(), CONTENT_TYPE)
            elif (found := BACKEND_PATH.fullmatch(path)) and found[1] in exporter.meters:
                self._send(200, exporter.render([found[1]]), CONTENT_TYPE)
            else:
                known = ", ".join(exporter.meters)
                text = f"no page {path!r}; backends: {known} (at /backends/NAME/metrics)\n"
                self._send(404, text.encode(), "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape a second per backend would drown the fleet's logs

    return Handler


def parse_backend(text: str, default: PowerModel) -> BackendSpec:
    """Parse `NAME=PID[:IDLE_W[:WATTS_PER_CORE[:MAX_W]]]`, taking the rest from `default`."""
    name, equals, rest = text.partition("=")
    if not equals or not NAME.fullmatch(name):
        raise PowerError(
            f"--backend {text!r} is not NAME=PID[:IDLE_W[:WATTS_PER_CORE[:MAX_W]]] with a NAME "
            "of letters, digits, '.', '_' and '-'"
        )
    parts = rest.split(":")
    if len(parts) > 4:
        raise PowerError(f"--backend {text!r} has {len(parts)} figures after '=', at most 4")
    try:
        pid = int(parts[0])
        figures = [float(part) for part in parts[1:]]
    except ValueError:
        raise PowerError(
            f"--backend {text!r}: PID must be an integer and the figures numbers of watts"
        ) from None
    if pid <= 0:
        raise PowerError(f"--backend {text!r}: PID must be positive, got {pid}")
    idle_w, per_core, max_w = [*figures, None, None, None][:3]
    try:
        model = PowerModel(
            idle_w=default.idle_w if idle_w is None else idle_w,
            watts_per_core=default.watts_per_core if per_core is None else per_core,
            max_w=default.max_w if max_w is None else max_w,
        )
    except PowerError as exc:
        raise PowerError(f"--backend {text!r}: {exc}") from None
    return BackendSpec(name, pid, model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m realfleet.power",
        description="Serve DCGM power series for llama-server processes, modelled from their "
        "CPU time (see the module's docstring for the model and its figures).",
    )
    parser.add_argument(
        "--backend",
        action="append",
        required=True,
        metavar="NAME=PID[:IDLE_W[:WATTS_PER_CORE[:MAX_W]]]",
        help="a backend to meter, served at /backends/NAME/metrics; repeat for each",
    )
    parser.add_argument("--idle-w", type=float, default=IDLE_W, help=f"default {IDLE_W} W")
    parser.add_argument(
        "--watts-per-core", type=float, default=WATTS_PER_CORE, help=f"default {WATTS_PER_CORE} W"
    )
    parser.add_argument("--max-w", type=float, default=None, help="default: no cap")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    args = parser.parse_args(argv)
    try:
        default = PowerModel(args.idle_w, args.watts_per_core, args.max_w)
        specs = [parse_backend(text, default) for text in args.backend]
        names = [spec.name for spec in specs]
        if doubled := sorted({name for name in names if names.count(name) > 1}):
            raise PowerError(f"backend names must be unique; given twice: {', '.join(doubled)}")
        meters = [BackendMeter(spec) for spec in specs]
    except PowerError as exc:
        parser.error(str(exc))
    exporter = Exporter(meters, hostname=socket.gethostname(), model_name=cpu_model())
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler(exporter))
    except OSError as exc:
        parser.error(f"cannot listen on {args.host}:{args.port}: {exc.strerror}")
    server.daemon_threads = True

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return, so it cannot run on serve_forever's
        # own thread, which is where signal handlers run.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    url = f"http://{args.host}:{server.server_port}"
    print(f"power exporter listening on {url} ({', '.join(names)})", flush=True)
    with server:
        server.serve_forever(poll_interval=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
