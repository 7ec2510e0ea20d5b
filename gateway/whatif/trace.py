"""Read a request trace: arrival times, token counts and, where the trace has them, the prompts'
prefix blocks.

Two formats (traces/README.md), told apart by the file's suffix (`.csv`, `.jsonl`) or else by its
first character:

- the Azure LLM traces: a CSV with the columns `TIMESTAMP`, `ContextTokens` and
  `GeneratedTokens`;
- Mooncake's: one JSON object a line, `timestamp` (milliseconds from the start), `input_length`,
  `output_length` and `hash_ids`, the chained ids of the prompt's 512-token blocks (equal ids,
  equal prefixes).

Prompt text is part of neither: routing needs only token counts, and the blocks say which
prompts share a prefix (the Azure traces say none do).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_LINE = (
    "a JSON object with timestamp (ms), input_length, output_length and hash_ids"
    f" (a list of integers, one a {MOONCAKE_BLOCK_TOKENS}-token block)"
)


class TraceError(ValueError):
    """The trace file is missing, unreadable or not in one of the expected formats."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives, how many tokens it reads and writes, and, where
    the trace says (request records do; the Azure traces do not), its model, SLO class, tenant,
    endpoint and whether it streamed. What it does not say, the replay gives its defaults.

    `blocks` are the chained ids of its prompt's prefix blocks, `block_tokens` tokens each
    (Mooncake's traces have them; without them no prompt shares a prefix)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    model: str | None = None
    slo_class: str | None = None
    tenant: str | None = None
    endpoint: str = "chat"
    stream: bool = True
    blocks: tuple[int, ...] = ()
    block_tokens: int = 0


def conversation(request: TraceRequest) -> str | None:
    """Name the conversation a request continues, as a client naming its session would, or None
    for a prompt of fewer than two prefix blocks.

    Mooncake's traces name no session. Every prompt of its conversation trace opens with the same
    block (a system prompt all share), and a conversation's later turns repeat its earlier
    prompts, so the first two blocks name it: requests that share them continue one another.
    """
    if len(request.blocks) < 2:
        return None
    return f"{request.blocks[0]}:{request.blocks[1]}"


def read_trace(
    path: str | Path, *, limit: int | None = None, rate_scale: float = 1.0
) -> list[TraceRequest]:
    """Read a trace; arrivals count from the first request and are compressed by `rate_scale`."""
    if rate_scale <= 0:
        raise TraceError(f"rate scale must be positive, got {rate_scale}")
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            mooncake = path.suffix == ".jsonl" or (path.suffix != ".csv" and handle.read(1) == "{")
            handle.seek(0)
            requests = _mooncake(path, handle, limit) if mooncake else _azure(path, handle, limit)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror}") from exc
    return [replace(r, arrival_s=r.arrival_s / rate_scale) for r in requests]


def _azure(path: Path, handle: Iterable[str], limit: int | None) -> list[TraceRequest]:
    """Read the Azure CSV, arrivals in seconds from the first."""
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
        except (TypeError, ValueError) as exc:  # TypeError: a row short of a column
            raise TraceError(f"{path}:{line}: cannot read the row {row}: {exc}") from exc
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [
        TraceRequest((at - start).total_seconds(), max(prompt, 1), max(output, 1))
        for at, prompt, output in rows
    ]


def _mooncake(path: Path, handle: Iterable[str], limit: int | None) -> list[TraceRequest]:
    """Read Mooncake's JSONL, arrivals in seconds from the first."""
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    for line, text in enumerate(handle, start=1):
        if limit is not None and len(rows) >= limit:
            break
        if text.strip():
            rows.append(_mooncake_line(text, f"{path}:{line}"))
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    start = rows[0][0]
    return [
        TraceRequest(
            (at - start) / 1000,
            max(prompt, 1),
            max(output, 1),
            blocks=blocks,
            block_tokens=MOONCAKE_BLOCK_TOKENS,
        )
        for at, prompt, output, blocks in rows
    ]


def _mooncake_line(text: str, where: str) -> tuple[float, int, int, tuple[int, ...]]:
    """Return one line's arrival (ms), input and output tokens and blocks, or say what is wrong."""
    try:
        entry: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise TraceError(
            f"{where}: the line is not JSON ({exc}); expected {MOONCAKE_LINE}"
        ) from exc
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: expected {MOONCAKE_LINE}, got {text.strip()[:80]}")
    missing = [field for field in MOONCAKE_FIELDS if field not in entry]
    if missing:
        raise TraceError(f"{where}: the line lacks {', '.join(missing)}; expected {MOONCAKE_LINE}")
    at, prompt, output, ids = (entry[field] for field in MOONCAKE_FIELDS)
    if not _number(at) or at < 0:
        raise TraceError(f"{where}: timestamp must be milliseconds >= 0, got {at!r}")
    for field, value in (("input_length", prompt), ("output_length", output)):
        if not _integer(value) or value < 0:
            raise TraceError(f"{where}: {field} must be an integer >= 0, got {value!r}")
    if not isinstance(ids, list) or not all(_integer(block) for block in ids):
        raise TraceError(f"{where}: hash_ids must be a list of integers, got {ids!r:.80}")
    blocks = math.ceil(prompt / MOONCAKE_BLOCK_TOKENS)
    if len(ids) != blocks:
        raise TraceError(
            f"{where}: {len(ids)} hash_ids for {prompt} input tokens, which make {blocks}"
            f" blocks of {MOONCAKE_BLOCK_TOKENS}"
        )
    return float(at), prompt, output, tuple(ids)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
