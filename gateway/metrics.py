"""Every Prometheus metric the gateway exports, declared in one place.

`GatewayMetrics` is a table: each class attribute is one row (`counter`, `gauge` or `histogram`
with its name, help text, labels and buckets), and each instance builds every row on its own
registry, in the order written, which is the order of the exposition.

Labels are bounded: route, pool, backend, model, slo_class and tenant names (from the policy),
status (HTTP code), error codes and other small fixed sets; never tenant keys or request ids.
Fleet gauges are read from the live state at scrape time (gateway/fleet/collector.py), so the
request path never updates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "gateway"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
SIMILARITY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
# The loop's timers tick in milliseconds (libuv): lag under 2 ms is the clock's, not a stall.
LOOP_LAG_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4)

RPM = ("route", "pool", "model")
# Shadow traffic: `candidate` is the pool that answered the copy (for kind="noise", the
# primary's own pool); match rates are matches_total / compared_total.
SHADOW = ("route", "candidate", "kind")

M = TypeVar("M", Counter, Gauge, Histogram)


@dataclass(frozen=True)
class MetricSpec(Generic[M]):
    """One row of the table: a metric to build on each `GatewayMetrics` registry.

    Read on the class it is the row itself; read on an instance it is that instance's metric,
    which `GatewayMetrics.__init__` stores under the same name (so the request path reads a
    plain attribute, never this descriptor).
    """

    kind: type[M]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> M:
        """Register this metric on `registry` and return it."""
        options: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        return self.kind(
            self.name, self.help, self.labels, namespace=NAMESPACE, registry=registry, **options
        )

    @overload
    def __get__(self, instance: None, owner: type) -> MetricSpec[M]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> M: ...
    def __get__(self, instance: object, owner: type) -> MetricSpec[M] | M:
        if instance is None:
            return self
        raise AttributeError(f"metric {self.name!r} is read before GatewayMetrics built it")


def counter(name: str, help: str, *labels: str) -> MetricSpec[Counter]:
    """Declare a counter; the exposition adds `_total` to its name."""
    return MetricSpec(Counter, name, help, labels)


def gauge(name: str, help: str, *labels: str) -> MetricSpec[Gauge]:
    """Declare a gauge."""
    return MetricSpec(Gauge, name, help, labels)


def histogram(
    name: str, help: str, *labels: str, buckets: tuple[float, ...]
) -> MetricSpec[Histogram]:
    """Declare a histogram with its bucket bounds."""
    return MetricSpec(Histogram, name, help, labels, buckets)


class GatewayMetrics:
    """The gateway's metrics, registered on one registry (a fresh one per test)."""

    requests = counter("requests", "Downstream requests answered.", *RPM, "status")
    errors = counter("errors", "Requests that ended in an error, by error code.", *RPM, "code")
    fallbacks = counter(
        "fallbacks",
        "Requests served elsewhere than first chosen.",
        *("route", "from_pool", "to_pool", "reason"),
    )
    retries = counter(
        "upstream_retries", "Upstream attempts retried before the first byte.", "pool"
    )
    queue_wait = histogram(
        "queue_wait_seconds", "Time spent waiting for a slot.", "pool", buckets=LATENCY_BUCKETS
    )
    ttft = histogram(
        "time_to_first_token_seconds",
        "Time to the first streamed token.",
        *RPM,
        buckets=LATENCY_BUCKETS,
    )
    tpot = histogram(
        "time_per_output_token_seconds",
        "Time per output token after the first.",
        *RPM,
        buckets=TPOT_BUCKETS,
    )
    duration = histogram(
        "request_duration_seconds", "End-to-end request latency.", *RPM, buckets=LATENCY_BUCKETS
    )
    overhead = histogram(
        "overhead_seconds",
        "Time spent in the gateway itself, upstream and queue excluded.",
        "route",
        buckets=OVERHEAD_BUCKETS,
    )
    loop_lag = histogram(
        "event_loop_lag_seconds",
        "How late the event loop ran a timer due every 10 ms: what a request waits behind.",
        buckets=LOOP_LAG_BUCKETS,
    )
    gc_pause = histogram(
        "gc_pause_seconds",
        "Pauses of the serving process's garbage collections, generations 1 and 2.",
        "generation",
        buckets=GC_PAUSE_BUCKETS,
    )
    prompt_tokens = counter("prompt_tokens", "Prompt tokens, as backends counted them.", *RPM)
    completion_tokens = counter(
        "completion_tokens", "Completion tokens, as backends counted them.", *RPM
    )
    ejections = counter("backend_ejections", "Backends ejected by outlier detection.", "pool")
    parks = counter("backend_parks", "Backends parking switched off, once drained.", "pool")
    wakeups = counter("backend_wakeups", "Parked backends parking woke.", "pool")
    parking_hook_failures = counter(
        "parking_hook_failures",
        "Parking hook calls that failed: a backend left in service, or a wake-up tried again.",
        *("pool", "action"),
    )
    energy = counter("energy_joules", "Measured energy attributed to requests.", "pool")
    cost = counter(
        "cost_usd",
        "Cost of the measured energy and device time attributed to requests, in US dollars.",
        "pool",
    )
    prediction_ratio = histogram(
        "cost_model_observed_over_predicted",
        "Observed over predicted, per request: 1 is a perfect prediction.",
        *("pool", "target"),
        buckets=RATIO_BUCKETS,
    )
    model_mape = gauge(
        "cost_model_mape",
        "Held-out mean absolute percentage error of the current cost model.",
        *("pool", "target"),
    )
    model_version = gauge(
        "cost_model_version", "Version of the cost model serving decisions (0: the physics prior)."
    )
    slo_unmeetable = counter(
        "slo_unmeetable", "Requests for which no pool was predicted to meet the SLO.", "route"
    )
    # Attainment is met / (met + missed); the targets are the request's own: its class's,
    # narrowed or widened by x-slo-ttft-ms and x-slo-tpot-ms where the policy allows them.
    slo_requests = counter(
        "slo_requests",
        "Finished requests judged against their SLO targets, by result (met, missed).",
        *("route", "pool", "slo_class", "result"),
    )
    policy_version = gauge(
        "policy_version",
        "Version of the routing policy serving requests (0: not from the version store).",
    )
    policy_reloads = counter(
        "policy_reloads",
        "Attempts to switch to a new active policy version, by result (ok, invalid, error).",
        "result",
    )
    power_scrape_failures = counter("power_scrape_failures", "Backend power readings that failed.")
    records_written = counter("records_written", "Request records written to the database.")
    records_dropped = counter(
        "records_dropped",
        "Request records lost past the documented limit: the writer queue was full, or "
        "the database was unreachable and memory and the spill file were full.",
    )
    request_minutes_written = counter(
        "request_minutes_written",
        "Rows of the traffic's summary (a minute's requests of one route, pool, model, endpoint, "
        "SLO class and streaming) written to the database.",
    )
    request_minutes_dropped = counter(
        "request_minutes_dropped",
        "Rows of the traffic's summary lost past the documented limit (queue, memory and spill "
        "file full).",
    )
    shadow_minutes_written = counter(
        "shadow_minutes_written",
        "Rows of the shadow copies' summary (a minute's copies of one route, candidate pool, "
        "primary pool, kind and sampling) written to the database.",
    )
    shadow_minutes_dropped = counter(
        "shadow_minutes_dropped",
        "Rows of the shadow copies' summary lost past the documented limit (queue, memory and "
        "spill file full).",
    )
    # Records the database could not take, per table (request_records, shadow_records, ...).
    records_buffered = gauge(
        "records_buffered",
        "Records waiting to be written after a failed insert, held in memory or on disk.",
        *("table", "where"),
    )
    records_spilled = counter(
        "records_spilled",
        "Records written to the local spill file because memory for held records was full.",
        "table",
    )
    records_replayed = counter(
        "records_replayed",
        "Records read back from the spill file and written to the database.",
        "table",
    )
    records_rejected = counter(
        "records_rejected",
        "Records the database refused (a constraint, e.g. a duplicate decision id).",
        "table",
    )
    record_write_failures = counter(
        "record_write_failures",
        "Batch inserts that failed because the database was unreachable; kept and retried.",
        "table",
    )

    shadow_sent = counter("shadow_sent", "Shadow copies sent upstream.", *SHADOW)
    shadow_dropped = counter(
        "shadow_dropped",
        "Shadow copies not sent (queue or budget full, no slot, primary failed...).",
        *SHADOW,
        "reason",
    )
    shadow_failed = counter(
        "shadow_failed",
        "Shadow copies that the candidate failed to answer, by error code, or answered with"
        " no usable answer, by kind (null, empty, cut_short, broken).",
        *SHADOW,
        "code",
    )
    shadow_compared = counter(
        "shadow_compared", "Shadow copies answered by both sides and compared.", *SHADOW
    )
    shadow_embeddings = counter(
        "shadow_embeddings",
        "Differing answer pairs sent to the embedding route for semantic similarity, by"
        " outcome: measured, over_budget, no_backend, no_slot, failed.",
        *("model", "outcome"),
    )
    shadow_exact_matches = counter(
        "shadow_exact_matches",
        "Compared copies whose text matched the primary's exactly.",
        *SHADOW,
    )
    shadow_normalized_matches = counter(
        "shadow_normalized_matches",
        "Compared copies whose text matched after normalising case, punctuation, spaces.",
        *SHADOW,
    )
    shadow_similarity = histogram(
        "shadow_similarity_ratio",
        "Token-level similarity of the copy's answer to the primary's (0..1).",
        *SHADOW,
        buckets=SIMILARITY_BUCKETS,
    )
    shadow_duration = histogram(
        "shadow_duration_seconds",
        "Upstream latency of shadow copies, end to end.",
        *SHADOW,
        buckets=LATENCY_BUCKETS,
    )
    shadow_records_written = counter(
        "shadow_records_written", "Shadow records written to the database."
    )
    shadow_records_dropped = counter(
        "shadow_records_dropped",
        "Shadow records lost past the documented limit (queue, memory and spill file full).",
    )
    attribution_updates_written = counter(
        "attribution_updates_written",
        "Request and shadow records given their measured energy in the database, after the "
        "record itself.",
    )
    attribution_updates_dropped = counter(
        "attribution_updates_dropped",
        "Energy updates lost past the documented limit (queue, memory and spill file full).",
    )
    attribution_delay = histogram(
        "attribution_delay_seconds",
        "From a request's end to its energy being final: the readings that cover it, and the "
        "requests it shared them with having ended (or a bounded wait for them).",
        buckets=LATENCY_BUCKETS,
    )
    draw_records_written = counter(
        "draw_records_written",
        "Rows of a backend's draw (its energy and time on and parked in a minute) written to "
        "the database.",
    )
    draw_records_dropped = counter(
        "draw_records_dropped",
        "Rows of a backend's draw lost past the documented limit (queue, memory and spill file "
        "full).",
    )

    # Shared state (REDIS_URL): whether this replica shares it now, and what it sees.
    shared_state_up = gauge(
        "shared_state_up",
        "1 while this replica shares slots, budgets and limits through Redis; 0 while it "
        "serves from local state (Redis unreachable, or not configured).",
    )
    shared_state_outages = counter(
        "shared_state_outages", "Times this replica lost Redis and switched to local state."
    )
    replicas = gauge(
        "replicas",
        "Gateway replicas alive as this replica last saw them in Redis (1 without Redis).",
    )
    rate_limited = counter(
        "rate_limited", "Requests refused because their tenant was over its rate limit.", "tenant"
    )

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        for attribute, row in self.table().items():
            setattr(self, attribute, row.build(self.registry))
        self.replicas.set(1)

    @classmethod
    def table(cls) -> dict[str, MetricSpec[Any]]:
        """Return the rows by attribute name, in the order they are declared and exported."""
        return {name: row for name, row in vars(cls).items() if isinstance(row, MetricSpec)}

    def child(self, metric: M, *labels: str) -> M:
        """Return a metric's labelled series, looked up once per label set.

        prometheus_client's labels() validates and locks on every call, which costs more than
        the update itself; the request path asks here instead.
        """
        key = (id(metric), labels)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = metric.labels(*labels)
        return series
