"""The metrics table keeps the house style: a namespace, unit suffixes, bounded labels."""

from __future__ import annotations

import ast
import inspect
import re

from prometheus_client import Counter, Histogram, generate_latest

from gateway.metrics import NAMESPACE, GatewayMetrics

# Labels whose values come from the policy or a small fixed set. Widen this only for a label of
# that kind: a label per tenant key, request or prompt would grow the series without bound.
BOUNDED_LABELS = {
    *("route", "pool", "from_pool", "to_pool", "candidate", "model", "slo_class", "tenant"),
    *("status", "code", "reason", "result", "outcome", "kind", "target", "generation"),
    *("table", "where", "action"),
}
UNBOUNDED = re.compile(r"key|_id$|^id$|request|user|prompt|message")
# A name that speaks of time or energy ends in its unit.
TIME_WORDS = re.compile(r"duration|latency|wait|lag|pause|time")
UNIT_SUFFIXES = ("_seconds", "_ratio")
# Declared before the suffix rule; renaming it would break the dashboards that chart it.
RATIO_NAMED_BEFORE_THE_RULE = {"cost_model_observed_over_predicted"}
ROW_FACTORIES = {"counter", "gauge", "histogram"}


def test_every_row_of_the_class_body_is_one_metric_under_its_own_attribute() -> None:
    body = ast.parse(inspect.getsource(GatewayMetrics)).body[0]
    assert isinstance(body, ast.ClassDef)
    written = [
        target.id
        for node in body.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in ROW_FACTORIES
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    # A second row under the same attribute would silently replace the first.
    assert written == list(GatewayMetrics.table())


def test_metric_names_are_unique_and_exported_under_the_namespace() -> None:
    names = [row.name for row in GatewayMetrics.table().values()]
    assert len(names) == len(set(names))
    exposition = generate_latest(GatewayMetrics().registry).decode()
    exported = re.findall(r"^# TYPE (\S+) ", exposition, flags=re.M)
    assert exported
    assert [name for name in exported if not name.startswith(f"{NAMESPACE}_")] == []


def test_counters_leave_the_total_suffix_to_the_client() -> None:
    counters = [row.name for row in GatewayMetrics.table().values() if row.kind is Counter]
    assert [name for name in counters if name.endswith("_total")] == []
    exposition = generate_latest(GatewayMetrics().registry).decode()
    for name in counters:
        assert f"# TYPE {NAMESPACE}_{name}_total counter" in exposition


def test_histograms_and_times_are_named_for_their_unit() -> None:
    rows = GatewayMetrics.table().values()
    histograms = [row.name for row in rows if row.kind is Histogram]
    assert [
        name
        for name in histograms
        if not name.endswith(UNIT_SUFFIXES) and name not in RATIO_NAMED_BEFORE_THE_RULE
    ] == []
    assert [
        row.name
        for row in rows
        if TIME_WORDS.search(row.name) and not row.name.endswith("_seconds")
    ] == []
    assert [
        row.name for row in rows if "energy" in row.name and not row.name.endswith("_joules")
    ] == []


def test_labels_are_bounded() -> None:
    labels = {label: name for name, row in GatewayMetrics.table().items() for label in row.labels}
    assert {label: name for label, name in labels.items() if label not in BOUNDED_LABELS} == {}
    assert [label for label in BOUNDED_LABELS if UNBOUNDED.search(label)] == []


def test_each_instance_builds_the_table_on_its_own_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.child(first.requests, "chat", "gpu", "llama", "200").inc()
    assert first.requests is not second.requests
    assert isinstance(first.requests, Counter)
    assert b'gateway_requests_total{model="llama"' in generate_latest(first.registry)
    assert b"gateway_requests_total{" not in generate_latest(second.registry)
    # Alone until Redis says otherwise.
    assert b"gateway_replicas 1.0" in generate_latest(second.registry)


def test_child_returns_the_same_series_for_the_same_labels() -> None:
    metrics = GatewayMetrics()
    series = metrics.child(metrics.queue_wait, "gpu")
    assert metrics.child(metrics.queue_wait, "gpu") is series
    assert metrics.child(metrics.queue_wait, "asic") is not series
