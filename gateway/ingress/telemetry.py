"""Telemetry: when an exchange ends, update the metrics and estimators, and hand on its record;
its energy follows once the meter has settled it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.costmodel.predict import OutputLengths
from gateway.costmodel.train import Observation, observation
from gateway.db.schema import RequestRecord
from gateway.energy.meter import EnergyMeter
from gateway.exchange import Exchange
from gateway.metrics import GatewayMetrics
from gateway.records.requests import RequestEnergy, ms
from gateway.records.slo import meets_slo, tpot_s
from gateway.routing.classify import TokenEstimator


@dataclass(frozen=True, slots=True)
class _Served:
    """The labelled series one (route, pool, model) updates for every answered request."""

    duration: Any
    ttft: Any
    tpot: Any
    prompt_tokens: Any
    completion_tokens: Any


class Telemetry:
    """Turn finished exchanges into metrics, estimator corrections and request records."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        sink: Callable[[RequestRecord], None],
        meter: EnergyMeter,
        estimator: TokenEstimator,
        outputs: OutputLengths,
        settled: Callable[[RequestEnergy, Observation | None, float | None], None],
    ):
        self.metrics = metrics
        self.sink = sink
        self.settled = settled
        # Bound once: a bound method made per request would be one more object held for each.
        self._on_energy = self._settled
        self.meter = meter
        self.estimator = estimator
        self.outputs = outputs
        # The series every answered request updates, grouped so that one lookup finds them.
        self._served_series: dict[tuple[str, str, str], _Served] = {}
        # Both of a label set's SLO series at once: "missed" reads 0, not no data, until one is.
        self._slo_series: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def _served(self, route: str, pool: str, model: str) -> _Served:
        key = (route, pool, model)
        series = self._served_series.get(key)
        if series is None:
            m = self.metrics
            series = self._served_series[key] = _Served(
                m.duration.labels(*key),
                m.ttft.labels(*key),
                m.tpot.labels(*key),
                m.prompt_tokens.labels(*key),
                m.completion_tokens.labels(*key),
            )
        return series

    def _slo(self, route: str, pool: str, slo_class: str) -> tuple[Any, Any]:
        """Return the (met, missed) counters of a route, pool and SLO class."""
        key = (route, pool, slo_class)
        series = self._slo_series.get(key)
        if series is None:
            counter = self.metrics.slo_requests
            series = self._slo_series[key] = (
                counter.labels(*key, "met"),
                counter.labels(*key, "missed"),
            )
        return series

    def finish(self, ex: Exchange, ended_at: float) -> None:
        """Account for an exchange that ended at `ended_at` (the clock of ex.started_at)."""
        e2e = ended_at - ex.started_at
        last = None if ex.last_token_at is None else ex.last_token_at - ex.started_at
        tpot = tpot_s(ex.ttft_s, last, ex.completion_tokens)
        overhead = max(e2e - ex.queue_s - ex.upstream_s, 0.0)
        self._count(ex, e2e, tpot, overhead)
        self._learn(ex)
        record = _record(ex, e2e, tpot, overhead)
        self._judge_slo(ex, record)
        self._deliver(ex, record, ended_at)

    def _count(self, ex: Exchange, e2e: float, tpot: float | None, overhead: float) -> None:
        """The request's metrics: its outcome, and how long its answer took to each token."""
        m = self.metrics
        route, pool = ex.route_name, ex.pool_name
        # Only routed models become label values: a client cannot mint new series.
        model = ex.model if ex.decision is not None else ""
        m.child(m.requests, route, pool, model, str(ex.status)).inc()
        if ex.error is not None:
            m.child(m.errors, route, pool, model, ex.error).inc()
        if ex.decision is not None and ex.decision.slo_unmeetable:
            m.child(m.slo_unmeetable, route).inc()
        if ex.fallback_reason is not None and pool:
            m.child(m.fallbacks, route, ex.first_pool or "", pool, ex.fallback_reason).inc()
        if ex.profile is not None:
            m.child(m.overhead, route).observe(overhead)
        if pool and ex.status == 200:
            series = self._served(route, pool, model)
            series.duration.observe(e2e)
            if ex.ttft_s is not None:
                series.ttft.observe(ex.ttft_s)
            if tpot is not None:
                series.tpot.observe(tpot)
            if ex.prompt_tokens:
                series.prompt_tokens.inc(ex.prompt_tokens)
            if ex.completion_tokens:
                series.completion_tokens.inc(ex.completion_tokens)

    def _learn(self, ex: Exchange) -> None:
        """Correct the prompt-token estimate and learn the route's answer lengths."""
        profile = ex.profile
        if profile is not None and ex.prompt_tokens:
            self.estimator.observe(
                ex.model, profile.prompt_tokens, ex.prompt_tokens, profile.token_ratio
            )
        if ex.route_name and ex.status == 200 and ex.completion_tokens is not None:
            self.outputs.observe(ex.route_name, ex.completion_tokens)

    def _judge_slo(self, ex: Exchange, record: RequestRecord) -> None:
        """Count the request as meeting its SLO or missing it, judged on the record's numbers,
        as the weekly report reads them. The targets are the profile's, so a client's
        x-slo-ttft-ms counts here; records do not keep it, so the report judges by the class
        alone."""
        profile = ex.profile
        if profile is None:
            return
        met, missed = self._slo(ex.route_name, ex.pool_name, profile.slo_class)
        ok = meets_slo(
            profile,
            ex.status,
            record.ttft_ms,
            record.tpot_ms,
            record.e2e_ms,
            endpoint=profile.endpoint,
            stream=profile.stream,
            completion_tokens=ex.completion_tokens,
        )
        (met if ok else missed).inc()
        ex.slo_met = ok

    def _deliver(self, ex: Exchange, record: RequestRecord, ended_at: float) -> None:
        """Hand the record on now, and its energy once its backend's meter has settled it."""
        self.sink(record)
        if ex.backend is None or not ex.attempt_started_at:
            return
        seen = observation(record)  # what the learner takes, less the energy not known yet
        if seen is not None and record.predicted_e2e_ms and record.e2e_ms:
            m = self.metrics
            ratio = record.e2e_ms / record.predicted_e2e_ms
            m.child(m.prediction_ratio, seen.pool, "e2e").observe(ratio)
        # Plain values alone, which the collector stops walking while the energy is waited for.
        subject = (record.decision_id, record.ts, seen and tuple(seen), record.predicted_energy_j)
        self.meter.settle(
            ex.backend,
            ex.decision_id,
            start_at=ex.attempt_started_at,
            end_at=ended_at,
            first_token_at=None if ex.ttft_s is None else ex.started_at + ex.ttft_s,
            prompt_tokens=ex.prompt_tokens or 0,
            completion_tokens=ex.completion_tokens or 0,
            deliver=self._on_energy,
            subject=subject,
        )

    def _settled(
        self,
        subject: tuple[str, float, tuple[Any, ...] | None, float | None],
        energy_j: float | None,
        cost: float | None,
        estimated: bool,
    ) -> None:
        """Hand on a request's energy, and the learner's observation of it, once settled."""
        decision_id, ts, seen, predicted_energy_j = subject
        energy = None if energy_j is None else round(energy_j, 6)
        measured = None
        if seen is not None:  # an estimate teaches the cost model nothing it did not assume
            measured = Observation(*seen)._replace(energy_j=None if estimated else energy)
        self.settled(
            RequestEnergy(decision_id, ts, energy, cost, estimated), measured, predicted_energy_j
        )


def _record(ex: Exchange, e2e: float, tpot: float | None, overhead: float) -> RequestRecord:
    """What is kept of the exchange: durations in milliseconds, never the prompt or answer."""
    profile, predicted = ex.profile, ex.prediction
    return RequestRecord(
        decision_id=ex.decision_id,
        ts=ex.ts,
        endpoint=ex.endpoint,
        route=ex.route_name or None,
        pool=ex.pool_name or None,
        backend=ex.backend.name if ex.backend is not None else None,
        model=ex.model[:128],
        tenant=profile.tenant if profile else None,
        slo_class=profile.slo_class if profile else None,
        stream=profile.stream if profile else False,
        prompt_tokens=ex.prompt_tokens,
        prompt_tokens_estimated=profile.prompt_tokens if profile else None,
        max_tokens=profile.max_tokens if profile else None,
        completion_tokens=ex.completion_tokens,
        queue_ms=ms(ex.queue_s),
        ttft_ms=ms(ex.ttft_s),
        tpot_ms=ms(tpot),
        e2e_ms=ms(e2e),
        gateway_ms=ms(overhead),
        attempts=ex.attempts,
        fallback=ex.fallback_reason is not None,
        status=ex.status,
        error=ex.error,
        concurrent=ex.concurrent or None,
        context_tokens=ex.context_tokens or None,
        cached_tokens=ex.cached_tokens,
        predicted_ttft_ms=ms(predicted.ttft_s) if predicted else None,
        predicted_e2e_ms=ms(predicted.e2e_s) if predicted else None,
        predicted_energy_j=predicted.energy_j if predicted else None,
        first_pool=ex.first_pool,
    )
