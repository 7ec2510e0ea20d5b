"""Read Prometheus text exposition: its samples, and the sum of a series."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse Prometheus text into (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if line.startswith("#") or match is None:
            continue
        name, labels, value = match.groups()
        samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def metric_value(text: str, name: str, **labels: str) -> float:
    """Return the sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for sample, sample_labels, value in parse_metrics(text)
        if sample == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )
