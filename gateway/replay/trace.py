"""Read a request trace: arrival times and token counts, as the Azure LLM traces give them.

The format is a CSV with the columns `TIMESTAMP`, `ContextTokens` and `GeneratedTokens`
(traces/README.md). Prompt text is not part of it: routing needs only token counts.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(ValueError):
    """The trace file is missing, unreadable or not in the expected CSV format."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives, how many tokens it reads and writes, and, where
    the trace says (request records do; the Azure traces do not), its model, SLO class, tenant,
    endpoint and whether it streamed. What it does not say, the replay gives its defaults."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    model: str | None = None
    slo_class: str | None = None
    tenant: str | None = None
    endpoint: str = "chat"
    stream: bool = True


def read_trace(
    path: str | Path, *, limit: int | None = None, rate_scale: float = 1.0
) -> list[TraceRequest]:
    """Read a trace; arrivals count from the first request and are compressed by `rate_scale`."""
    if rate_scale <= 0:
        raise TraceError(f"rate scale must be positive, got {rate_scale}")
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{path}: the trace lacks the columns {missing} "
                    f"(expected {', '.join(COLUMNS)}; found {reader.fieldnames})"
                )
            rows: list[tuple[datetime, int, int]] = []
            for line, row in enumerate(reader, start=2):
                if limit is not None and len(rows) >= limit:
                    break
                try:
                    rows.append(
                        (
                            datetime.fromisoformat(row["TIMESTAMP"]),
                            int(row["ContextTokens"]),
                            int(row["GeneratedTokens"]),
                        )
                    )
                except ValueError as exc:
                    raise TraceError(f"{path}:{line}: cannot read the row {row}: {exc}") from exc
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror}") from exc
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [
        TraceRequest((at - start).total_seconds() / rate_scale, max(prompt, 1), max(output, 1))
        for at, prompt, output in rows
    ]
