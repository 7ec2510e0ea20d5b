"""Every metric the simulator exposes, rendered in Prometheus text format.

Power and energy use the NVIDIA DCGM exporter's names and labels, one series per device,
so the gateway reads a simulated fleet exactly as it reads a real one:

    DCGM_FI_DEV_POWER_USAGE                 gauge, W
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION    counter, mJ, integrated over simulated time

With `--engine`, the series a serving engine publishes about its load follow them
(simulator/engines.py). The `sim_*` series describe the simulator itself, for tests and
dashboards.
"""

from __future__ import annotations

import socket
from collections import Counter

from simulator import engines
from simulator.fleet import Fleet
from simulator.profile import Profile

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SimulatorMetrics:
    """Counters kept by the request handlers, plus the fleet's live readings."""

    def __init__(self, profile: Profile, fleet: Fleet, *, instance: str, engine: str | None = None):
        self.profile = profile
        self.fleet = fleet
        self.engine = engine
        self.instance = instance
        self.hostname = socket.gethostname()
        self.requests: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.unauthorized: Counter[str] = Counter()
        self.prompt_tokens = 0
        # Per model, the prompt tokens of answered requests looked up in the prefix cache, and
        # those it held, in tokens as vLLM counts them.
        self.prefix_queries: Counter[str] = Counter()
        self.prefix_hits: Counter[str] = Counter()
        self.completion_tokens = 0
        self.answers: Counter[str] = Counter()  # by precision: exact, benign, harmful, sampled
        self.flipped_tokens = 0
        self.inflight = 0  # HTTP requests on /v1
        self.external = 0  # requests of other clients (simulator/external.py)
        self.peak_inflight = 0

    def request_started(self) -> None:
        """Count a request received and not yet answered."""
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight + self.external)

    def request_ended(self, status: str) -> None:
        """Count a request answered (or abandoned) with `status`."""
        self.inflight -= 1
        self.requests[status] += 1

    def external_changed(self, requests: int) -> None:
        """Count `requests` of other clients in flight from now on."""
        self.external = requests
        self.peak_inflight = max(self.peak_inflight, self.inflight + self.external)

    def render(self) -> bytes:
        """Return the exposition text, with power and energy brought up to now."""
        self.fleet.sync()
        lines: list[str] = []
        dcgm = [self._dcgm_labels(device.index) for device in self.fleet.devices]
        _family(lines, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).")
        for labels, device in zip(dcgm, self.fleet.devices, strict=True):
            lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {device.power_w:.3f}")
        _family(
            lines,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            "Total energy consumption since boot (in mJ).",
        )
        for labels, device in zip(dcgm, self.fleet.devices, strict=True):
            millijoules = device.energy_j * 1000.0
            lines.append(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {millijoules:.0f}")

        per_device = (
            ("sim_active_requests", "Requests holding a slot.", "active"),
            ("sim_queued_requests", "Requests waiting for a slot.", "queued"),
        )
        for name, help_text, attribute in per_device:
            _family(lines, name, "gauge", help_text)
            for device in self.fleet.devices:
                lines.append(f'{name}{{gpu="{device.index}"}} {getattr(device, attribute)}')
        if self.engine is not None:
            models = [model.name for model in self.profile.models if model.kind == "chat"]
            lines.extend(
                engines.render(
                    self.engine,
                    self.fleet.devices,
                    models,
                    prefix_cache=(self.prefix_queries, self.prefix_hits),
                )
            )
        _family(lines, "sim_device_requests_total", "counter", "Requests served per device.")
        for device in self.fleet.devices:
            lines.append(f'sim_device_requests_total{{gpu="{device.index}"}} {device.served}')

        _family(
            lines,
            "sim_inflight_requests",
            "gauge",
            "Requests received, and other clients' kept, not yet answered.",
        )
        lines.append(f"sim_inflight_requests {self.inflight + self.external}")
        _family(
            lines,
            "sim_peak_inflight_requests",
            "gauge",
            "Most requests received and not yet answered at any moment since start.",
        )
        lines.append(f"sim_peak_inflight_requests {self.peak_inflight}")
        _family(lines, "sim_requests_total", "counter", "Requests on /v1/* by response status.")
        for status, count in sorted(self.requests.items()):
            lines.append(f'sim_requests_total{{status="{status}"}} {count}')
        _family(
            lines,
            "sim_external_requests",
            "gauge",
            "Requests of other clients (--external-load) kept in flight.",
        )
        lines.append(f"sim_external_requests {self.external}")
        _family(lines, "sim_faults_injected_total", "counter", "Faults injected, by kind.")
        for kind, count in sorted(self.faults.items()):
            lines.append(f'sim_faults_injected_total{{kind="{kind}"}} {count}')
        _family(
            lines,
            "sim_unauthorized_requests_total",
            "counter",
            "Requests refused for a missing or wrong API key (--api-key), by path.",
        )
        for path, count in sorted(self.unauthorized.items()):
            lines.append(f'sim_unauthorized_requests_total{{path="{path}"}} {count}')
        totals = (
            ("sim_prompt_tokens_total", "Prompt tokens of answered requests.", self.prompt_tokens),
            (
                "sim_completion_tokens_total",
                "Completion tokens of answered requests.",
                self.completion_tokens,
            ),
            (
                "sim_flipped_tokens_total",
                "Tokens of temperature-0 answers that numeric noise flipped to a near tie.",
                self.flipped_tokens,
            ),
        )
        for name, help_text, value in totals:
            _family(lines, name, "counter", help_text)
            lines.append(f"{name} {value}")
        _family(
            lines,
            "sim_answers_total",
            "counter",
            "Answers by how they stand to the reference: exact, benign (near-tie flips only),"
            " harmful (a wrong fact or field) or sampled. Never visible to the gateway's answers.",
        )
        for precision, count in sorted(self.answers.items()):
            lines.append(f'sim_answers_total{{precision="{precision}"}} {count}')
        _family(lines, "sim_clock_seconds", "gauge", "Simulated seconds since start.")
        lines.append(f"sim_clock_seconds {self.fleet.clock.now():.6f}")
        _family(lines, "sim_clock_speed", "gauge", "Simulated seconds per wall-clock second.")
        lines.append(f"sim_clock_speed {self.fleet.clock.speed}")
        lines.append("")
        return "\n".join(lines).encode()

    def _dcgm_labels(self, index: int) -> str:
        profile = self.profile
        labels = {
            "gpu": str(index),
            "UUID": f"SIM-{profile.name}-{self.instance}-{index}",
            "device": f"{profile.device_label_prefix}{index}",
            "modelName": profile.hardware,
            "Hostname": self.hostname,
        }
        return ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())


def _family(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
