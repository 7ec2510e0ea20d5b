"""The fleet's gauges: slots, waiters and health per pool, read from the live state when scraped.

Each backend also has an info series, `gateway_backend_info{pool, backend, kind, precision,
engine, engine_version, driver, firmware} 1`, with the serving engine and the versions its pool's
policy entry gives (empty when not given). Versions are labels of their own series rather than
of the load gauges, so an upgrade starts one new info series instead of breaking every backend
series in two; a query joins them (`* on (pool, backend) group_left (engine_version)
gateway_backend_info`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.state import DRAINING, PARKED, WAKING, Fleet
from gateway.metrics import NAMESPACE


class FleetCollector(Collector):
    """Report slots, waiters and health per pool (slots per backend too) when scraped."""

    def __init__(self, fleet: Callable[[], Fleet]):
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            f"{NAMESPACE}_pool_in_flight_requests", "Requests holding a slot.", labels=["pool"]
        )
        free = GaugeMetricFamily(
            f"{NAMESPACE}_pool_free_slots", "Free slots on healthy backends.", labels=["pool"]
        )
        queued = GaugeMetricFamily(
            f"{NAMESPACE}_pool_queued_requests", "Requests waiting for a slot.", labels=["pool"]
        )
        healthy = GaugeMetricFamily(
            f"{NAMESPACE}_pool_healthy_backends", "Backends not ejected.", labels=["pool"]
        )
        parking = GaugeMetricFamily(
            f"{NAMESPACE}_pool_parking_backends",
            "Backends parking has taken out of service: draining, parked or waking.",
            labels=["pool", "state"],
        )
        backend_in_flight = GaugeMetricFamily(
            f"{NAMESPACE}_backend_in_flight_requests",
            "Requests and shadow copies holding a slot of the backend, this replica's.",
            labels=["pool", "backend"],
        )
        external = GaugeMetricFamily(
            f"{NAMESPACE}_backend_external_requests",
            "Requests of other clients the backend's serving engine reports beyond the gateway's.",
            labels=["pool", "backend"],
        )
        engine_full = GaugeMetricFamily(
            f"{NAMESPACE}_backend_engine_full",
            "1 while the backend's serving engine queues or has its KV cache full: sent nothing.",
            labels=["pool", "backend"],
        )
        cached = GaugeMetricFamily(
            f"{NAMESPACE}_backend_engine_prompt_cached_ratio",
            "Share of the prompt tokens the backend's engine took from its prompt cache since it "
            "started (llama.cpp).",
            labels=["pool", "backend"],
        )
        speed = GaugeMetricFamily(
            f"{NAMESPACE}_backend_engine_generation_tokens_per_second",
            "Generation speed the backend's engine last measured: tokens a second of a "
            "request's decoding (llama.cpp).",
            labels=["pool", "backend"],
        )
        info = InfoMetricFamily(
            f"{NAMESPACE}_backend",
            "What a backend runs on, from its pool's policy entry: serving engine and its "
            "version, driver, firmware.",
            labels=["pool", "backend"],
        )
        for pool in self.fleet().pools.values():
            spec = pool.spec
            hardware = {"kind": spec.kind, "precision": spec.precision, "engine": spec.engine or ""}
            hardware |= {k: v or "" for k, v in spec.versions().items()}
            in_flight.add_metric([pool.name], sum(b.in_flight for b in pool.backends))
            free.add_metric([pool.name], sum(max(b.free_slots, 0) for b in pool.healthy()))
            queued.add_metric([pool.name], len(pool.waiters))
            healthy.add_metric([pool.name], len(pool.healthy()))
            if spec.parking is not None:
                for state in (DRAINING, PARKED, WAKING):
                    count = sum(b.parking == state for b in pool.backends)
                    parking.add_metric([pool.name, state], count)
            for backend in pool.backends:
                backend_in_flight.add_metric([pool.name, backend.name], backend.in_flight)
                if spec.engine is not None:
                    labels = [pool.name, backend.name]
                    external.add_metric(labels, backend.external)
                    engine_full.add_metric(labels, 1 if backend.engine_full else 0)
                    if backend.engine_cached_share is not None:
                        cached.add_metric(labels, backend.engine_cached_share)
                    if backend.engine_tokens_per_s is not None:
                        speed.add_metric(labels, backend.engine_tokens_per_s)
                info.add_metric([pool.name, backend.name], hardware)
        yield from (in_flight, free, queued, healthy, parking, backend_in_flight, external)
        yield engine_full
        yield from (cached, speed)
        yield info
