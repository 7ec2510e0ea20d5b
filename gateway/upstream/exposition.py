"""Prometheus' text exposition format, read: the samples of one metric, with their labels.

Enough of the format for the gauges and counters the metering scrape reads (DCGM's energy
counter, serving engines' load): `name{label="value",...} value [timestamp]` lines, comments
and other metrics skipped, label values unescaped, a malformed line ignored rather than
trusted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    """Yield (labels, value) for every well-formed sample of the metric `name`."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            parsed = _labels(rest)
            if parsed is None:
                continue
            labels, rest = parsed
        elif rest.startswith((" ", "\t")):
            labels = {}
        else:
            continue  # another metric whose name starts with this one
        fields = rest.split()
        if not 1 <= len(fields) <= 2:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            yield labels, value


def total(text: str, name: str, where: Mapping[str, str] | None = None) -> float | None:
    """Sum the samples of `name` whose labels include `where`; None when there are none."""
    values = _matching(text, name, where)
    return sum(values) if values else None


def largest(text: str, name: str, where: Mapping[str, str] | None = None) -> float | None:
    """Return the largest sample of `name` whose labels include `where`, or None."""
    values = _matching(text, name, where)
    return max(values) if values else None


def _matching(text: str, name: str, where: Mapping[str, str] | None) -> list[float]:
    return [
        value
        for labels, value in samples(text, name)
        if not where or all(labels.get(k) == v for k, v in where.items())
    ]


def _labels(rest: str) -> tuple[dict[str, str], str] | None:
    """Parse `{a="x",b="y"}` at the start of `rest`; return the labels and what follows."""
    labels: dict[str, str] = {}
    i, n = 1, len(rest)
    while True:
        while i < n and rest[i] in " ,":
            i += 1
        if i < n and rest[i] == "}":
            return labels, rest[i + 1 :]
        equals = rest.find("=", i)
        if equals < 0 or equals + 1 >= n or rest[equals + 1] != '"':
            return None
        key = rest[i:equals].strip()
        value: list[str] = []
        i = equals + 2
        while i < n and rest[i] != '"':
            if rest[i] == "\\" and i + 1 < n:
                value.append(ESCAPES.get(rest[i + 1], "\\" + rest[i + 1]))
                i += 2
            else:
                value.append(rest[i])
                i += 1
        if i >= n:
            return None
        labels[key] = "".join(value)
        i += 1
