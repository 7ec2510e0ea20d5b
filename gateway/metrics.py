"""Every Prometheus metric the gateway exports, declared in one place.

Labels are bounded: route, pool, backend, model, slo_class and tenant names (from the policy),
status (HTTP code), error codes and other small fixed sets; never tenant keys or request ids.
Fleet gauges are read from the live state at scrape time (gateway/fleet/collector.py), so the
request path never updates them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "gateway"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
SIMILARITY_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
# The loop's timers tick in milliseconds (libuv): lag under 2 ms is the clock's, not a stall.
LOOP_LAG_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)


class GatewayMetrics:
    """The gateway's metrics, registered on one registry (a fresh one per test)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        rpm = ["route", "pool", "model"]
        self.requests = Counter(
            "requests",
            "Downstream requests answered.",
            [*rpm, "status"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.errors = Counter(
            "errors",
            "Requests that ended in an error, by error code.",
            [*rpm, "code"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.fallbacks = Counter(
            "fallbacks",
            "Requests served elsewhere than first chosen.",
            ["route", "from_pool", "to_pool", "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.retries = Counter(
            "upstream_retries",
            "Upstream attempts retried before the first byte.",
            ["pool"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.queue_wait = Histogram(
            "queue_wait_seconds",
            "Time spent waiting for a slot.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.ttft = Histogram(
            "time_to_first_token_seconds",
            "Time to the first streamed token.",
            rpm,
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.tpot = Histogram(
            "time_per_output_token_seconds",
            "Time per output token after the first.",
            rpm,
            buckets=TPOT_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.duration = Histogram(
            "request_duration_seconds",
            "End-to-end request latency.",
            rpm,
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.overhead = Histogram(
            "overhead_seconds",
            "Time spent in the gateway itself, upstream and queue excluded.",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.loop_lag = Histogram(
            "event_loop_lag_seconds",
            "How late the event loop ran a timer due every 10 ms: what a request waits behind.",
            buckets=LOOP_LAG_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.gc_pause = Histogram(
            "gc_pause_seconds",
            "Pauses of the serving process's garbage collections, generations 1 and 2.",
            ["generation"],
            buckets=GC_PAUSE_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "prompt_tokens",
            "Prompt tokens, as backends counted them.",
            rpm,
            namespace=NAMESPACE,
            registry=r,
        )
        self.completion_tokens = Counter(
            "completion_tokens",
            "Completion tokens, as backends counted them.",
            rpm,
            namespace=NAMESPACE,
            registry=r,
        )
        self.ejections = Counter(
            "backend_ejections",
            "Backends ejected by outlier detection.",
            ["pool"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.energy = Counter(
            "energy_joules",
            "Measured energy attributed to requests.",
            ["pool"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.cost = Counter(
            "cost_usd",
            "Cost of the measured energy and device time attributed to requests, in US dollars.",
            ["pool"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.prediction_ratio = Histogram(
            "cost_model_observed_over_predicted",
            "Observed over predicted, per request: 1 is a perfect prediction.",
            ["pool", "target"],
            buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4),
            namespace=NAMESPACE,
            registry=r,
        )
        self.model_mape = Gauge(
            "cost_model_mape",
            "Held-out mean absolute percentage error of the current cost model.",
            ["pool", "target"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.model_version = Gauge(
            "cost_model_version",
            "Version of the cost model serving decisions (0: the physics prior).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.slo_unmeetable = Counter(
            "slo_unmeetable",
            "Requests for which no pool was predicted to meet the SLO.",
            ["route"],
            namespace=NAMESPACE,
            registry=r,
        )
        # Attainment is met / (met + missed); the targets are the request's own: its class's,
        # narrowed or widened by x-slo-ttft-ms and x-slo-tpot-ms where the policy allows them.
        self.slo_requests = Counter(
            "slo_requests",
            "Finished requests judged against their SLO targets, by result (met, missed).",
            ["route", "pool", "slo_class", "result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.policy_version = Gauge(
            "policy_version",
            "Version of the routing policy serving requests (0: not from the version store).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.policy_reloads = Counter(
            "policy_reloads",
            "Attempts to switch to a new active policy version, by result (ok, invalid, error).",
            ["result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.power_scrape_failures = Counter(
            "power_scrape_failures",
            "Backend power readings that failed.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.records_written = Counter(
            "records_written",
            "Request records written to the database.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.records_dropped = Counter(
            "records_dropped",
            "Request records lost past the documented limit: the writer queue was full, or "
            "the database was unreachable and memory and the spill file were full.",
            namespace=NAMESPACE,
            registry=r,
        )
        # Records the database could not take, per table (request_records, shadow_records).
        self.records_buffered = Gauge(
            "records_buffered",
            "Records waiting to be written after a failed insert, held in memory or on disk.",
            ["table", "where"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.records_spilled = Counter(
            "records_spilled",
            "Records written to the local spill file because memory for held records was full.",
            ["table"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.records_replayed = Counter(
            "records_replayed",
            "Records read back from the spill file and written to the database.",
            ["table"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.records_rejected = Counter(
            "records_rejected",
            "Records the database refused (a constraint, e.g. a duplicate decision id).",
            ["table"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.record_write_failures = Counter(
            "record_write_failures",
            "Batch inserts that failed because the database was unreachable; kept and retried.",
            ["table"],
            namespace=NAMESPACE,
            registry=r,
        )

        # Shadow traffic: `candidate` is the pool that answered the copy (for kind="noise",
        # the primary's own pool); match rates are matches_total / compared_total.
        shadow = ["route", "candidate", "kind"]
        self.shadow_sent = Counter(
            "shadow_sent",
            "Shadow copies sent upstream.",
            shadow,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_dropped = Counter(
            "shadow_dropped",
            "Shadow copies not sent (queue or budget full, no slot, primary failed...).",
            [*shadow, "reason"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_failed = Counter(
            "shadow_failed",
            "Shadow copies that the candidate failed to answer, by error code.",
            [*shadow, "code"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_compared = Counter(
            "shadow_compared",
            "Shadow copies answered by both sides and compared.",
            shadow,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_embeddings = Counter(
            "shadow_embeddings",
            "Differing answer pairs sent to the embedding route for semantic similarity, by"
            " outcome: measured, over_budget, no_backend, no_slot, failed.",
            ("model", "outcome"),
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_exact_matches = Counter(
            "shadow_exact_matches",
            "Compared copies whose text matched the primary's exactly.",
            shadow,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_normalized_matches = Counter(
            "shadow_normalized_matches",
            "Compared copies whose text matched after normalising case, punctuation, spaces.",
            shadow,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_similarity = Histogram(
            "shadow_similarity_ratio",
            "Token-level similarity of the copy's answer to the primary's (0..1).",
            shadow,
            buckets=SIMILARITY_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_duration = Histogram(
            "shadow_duration_seconds",
            "Upstream latency of shadow copies, end to end.",
            shadow,
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_records_written = Counter(
            "shadow_records_written",
            "Shadow records written to the database.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.shadow_records_dropped = Counter(
            "shadow_records_dropped",
            "Shadow records lost past the documented limit (queue, memory and spill file full).",
            namespace=NAMESPACE,
            registry=r,
        )

        # Shared state (REDIS_URL): whether this replica shares it now, and what it sees.
        self.shared_state_up = Gauge(
            "shared_state_up",
            "1 while this replica shares slots, budgets and limits through Redis; 0 while it "
            "serves from local state (Redis unreachable, or not configured).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.shared_state_outages = Counter(
            "shared_state_outages",
            "Times this replica lost Redis and switched to local state.",
            namespace=NAMESPACE,
            registry=r,
        )
        self.replicas = Gauge(
            "replicas",
            "Gateway replicas alive as this replica last saw them in Redis (1 without Redis).",
            namespace=NAMESPACE,
            registry=r,
        )
        self.replicas.set(1)
        self.rate_limited = Counter(
            "rate_limited",
            "Requests refused because their tenant was over its rate limit.",
            ["tenant"],
            namespace=NAMESPACE,
            registry=r,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """Return a metric's labelled series, looked up once per label set.

        prometheus_client's labels() validates and locks on every call, which costs more than
        the update itself; the request path asks here instead.
        """
        key = (id(metric), labels)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = metric.labels(*labels)
        return series
