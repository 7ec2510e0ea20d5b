"""Request minutes: the traffic summarized as it is recorded, a row per minute and key.

What reports on traffic reads these instead of every request record: the weekly report
(gateway/report/records.py) and the console's traffic and energy views (gateway/ops/views.py).
A row holds the requests that arrived in one minute with one key (route, pool, model, endpoint,
SLO class, streamed or not): their count, errors and SLO met, their tokens, energy and cost
(with the tokens of the requests whose energy and cost are known, for the per-1k-token figures),
the cost model's absolute percentage errors, and sketches of their latencies (gateway/stats.py:
time to first token and per output token of every request that has one, end to end of the
successful ones). Tenants are not a key: with them a busy minute has nearly a row per request.

Rows add up: a minute and key may have several rows (replicas, a request that ended minutes
after it arrived, an energy update after its request's row was written), and every reader sums
them. The serving process folds requests into open rows in memory (`Minutes`) and hands a
minute's rows to the record writer once the minute has settled, so they are written, held
through an outage and spilled like the records themselves (gateway/records/requests.py).
`summarize` folds stored records the same way: the migration that adds this table runs it on
the records written before, and a test checks the report read from minutes against the one
read from records.

A request meets its SLO by its class's targets when it ended (gateway/records/slo.py), under
the policy then in force.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from gateway.db.schema import RequestMinute
from gateway.policy.definition import Policy
from gateway.records.slo import Targets, meets_slo, record_meets_slo
from gateway.stats import sketch_bucket

MINUTE_S = 60.0
# A minute's rows are handed on once this long after it ends: most of its requests (stamped
# with their arrival) have ended and their energy settled by then; later ones add a row.
SETTLE_S = 60.0
# Requests whose energy is awaited, at most: it settles seconds after the request ends.
MAX_AWAITED = 100_000

# What `summarize` reads of a stored request record.
RECORD_COLUMNS = (
    "ts", "route", "pool", "model", "endpoint", "slo_class", "stream", "status",
    "prompt_tokens", "completion_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
    "predicted_e2e_ms", "energy_j", "cost_usd", "predicted_energy_j",
)  # fmt: skip

Key = tuple[float, str | None, str | None, str, str, str | None, bool]
# The SLO targets of a request's class (None for the policy's default class).
TargetsOf = Callable[[str | None], Targets | None]


# The figures of an open row, in RequestMinute's order from `requests` to `energy_ape_n`.
_FIGURES = 17
(
    REQUESTS, ERRORS, SLO_MET, PROMPT, COMPLETION,
    ENERGY_N, ENERGY, ENERGY_TOKENED, ENERGY_TOKENS,
    COST_N, COST, COST_TOKENED, COST_TOKENS,
    E2E_APE, E2E_APE_N, ENERGY_APE, ENERGY_APE_N,
) = range(_FIGURES)  # fmt: skip


class Cell:
    """An open row: figures and sketches, added to until the row is handed on."""

    __slots__ = ("figures", "sketches")

    def __init__(self) -> None:
        self.figures: list[float] = [0] * _FIGURES
        self.sketches: tuple[dict[int, int], ...] = ({}, {}, {})

    def request(
        self,
        status: int,
        met: bool,
        prompt: int | None,
        completion: int | None,
        times: tuple[float | None, float | None, float | None],
        predicted_e2e_ms: float | None,
    ) -> None:
        """Count a request that ended (its energy comes with `energy`)."""
        f = self.figures
        f[REQUESTS] += 1
        f[ERRORS] += status != 200
        f[SLO_MET] += met
        f[PROMPT] += prompt or 0
        f[COMPLETION] += completion or 0
        ttft, tpot, e2e = times
        ok = status == 200
        if e2e and predicted_e2e_ms is not None and ok:
            f[E2E_APE] += abs(e2e - predicted_e2e_ms) / e2e
            f[E2E_APE_N] += 1
        for sketch, value in zip(self.sketches, (ttft, tpot, e2e if ok else None), strict=True):
            if value is not None:
                bucket = sketch_bucket(value)
                sketch[bucket] = sketch.get(bucket, 0) + 1

    def energy(
        self,
        energy_j: float | None,
        cost_usd: float | None,
        tokens: int | None,
        predicted_energy_j: float | None,
    ) -> None:
        """Add a request's energy and cost; `predicted_energy_j` only for a successful one."""
        f = self.figures
        if energy_j is not None:
            f[ENERGY_N] += 1
            f[ENERGY] += energy_j
            if tokens:
                f[ENERGY_TOKENED] += energy_j
                f[ENERGY_TOKENS] += tokens
            if energy_j and predicted_energy_j is not None:
                f[ENERGY_APE] += abs(energy_j - predicted_energy_j) / energy_j
                f[ENERGY_APE_N] += 1
        if cost_usd is not None:
            f[COST_N] += 1
            f[COST] += cost_usd
            if tokens:
                f[COST_TOKENED] += cost_usd
                f[COST_TOKENS] += tokens

    def row(self, key: Key) -> RequestMinute:
        ttft, tpot, e2e = (
            orjson.dumps(s, option=orjson.OPT_NON_STR_KEYS).decode() if s else None
            for s in self.sketches
        )
        ts, route, pool, model, endpoint, slo_class, stream = key
        f = self.figures
        return RequestMinute(
            ts=ts,
            route=route,
            pool=pool,
            model=model,
            endpoint=endpoint,
            slo_class=slo_class,
            stream=stream,
            requests=int(f[REQUESTS]),
            errors=int(f[ERRORS]),
            slo_met=int(f[SLO_MET]),
            prompt_tokens=int(f[PROMPT]),
            completion_tokens=int(f[COMPLETION]),
            energy_n=int(f[ENERGY_N]),
            energy_j=float(f[ENERGY]),
            energy_j_tokened=float(f[ENERGY_TOKENED]),
            energy_tokens=int(f[ENERGY_TOKENS]),
            cost_n=int(f[COST_N]),
            cost_usd=float(f[COST]),
            cost_usd_tokened=float(f[COST_TOKENED]),
            cost_tokens=int(f[COST_TOKENS]),
            e2e_ape=float(f[E2E_APE]),
            e2e_ape_n=int(f[E2E_APE_N]),
            energy_ape=float(f[ENERGY_APE]),
            energy_ape_n=int(f[ENERGY_APE_N]),
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=e2e,
        )


def tokens(prompt: int | None, completion: int | None) -> int | None:
    """Return a request's tokens, as the report counts them (None when neither is known)."""
    if prompt is None and completion is None:
        return None
    return (prompt or 0) + (completion or 0)


def minute_of(ts: float) -> float:
    """Return the start of the minute a time falls in."""
    return math.floor(ts / MINUTE_S) * MINUTE_S


def settled(now: float) -> float:
    """Return the time before which every minute's rows have been handed on to the writer, a
    minute's margin for its rounds included: a reader takes the minutes before it and the
    request records after it."""
    return minute_of(now - SETTLE_S) - MINUTE_S


def targets_of(policy: Policy) -> TargetsOf:
    """Return the targets of the policy's SLO classes, the default class for None."""
    return lambda name: policy.slo_classes.get(name or policy.default_slo_class)


class Minutes:
    """Fold finished requests, and their energy once settled, into open rows per minute and
    key, in memory; `take` hands on the rows of minutes that have settled.

    O(1) per request: a dictionary lookup, a few additions and a logarithm per latency.
    """

    def __init__(self, targets: TargetsOf, max_awaited: int = MAX_AWAITED):
        self._targets = targets
        self._cells: dict[Key, Cell] = {}
        # Requests whose energy is still to come: decision id → (key, tokens, predicted energy).
        self._awaited: OrderedDict[str, tuple[Key, int | None, float | None]] = OrderedDict()
        self._max_awaited = max_awaited

    def request(self, record: Any) -> None:
        """Count a finished request's record (a RequestRecord); expect its energy if it had a
        backend."""
        key = (
            minute_of(record.ts),
            record.route,
            record.pool,
            record.model,
            record.endpoint,
            record.slo_class,
            record.stream,
        )
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        met = meets_slo(
            self._targets(record.slo_class),
            record.status,
            record.ttft_ms,
            record.tpot_ms,
            record.e2e_ms,
            endpoint=record.endpoint,
            stream=record.stream,
            completion_tokens=record.completion_tokens,
        )
        cell.request(
            record.status,
            met,
            record.prompt_tokens,
            record.completion_tokens,
            (record.ttft_ms, record.tpot_ms, record.e2e_ms),
            record.predicted_e2e_ms,
        )
        if record.energy_j is not None or record.cost_usd is not None:
            cell.energy(
                record.energy_j,
                record.cost_usd,
                tokens(record.prompt_tokens, record.completion_tokens),
                record.predicted_energy_j if record.status == 200 else None,
            )
        elif record.backend is not None:
            awaited = self._awaited
            # The oldest, whose energy never came, goes: an OrderedDict drops it at once, where a
            # dict that lost its first keys walks past their empty slots to find the next.
            if len(awaited) >= self._max_awaited:
                awaited.popitem(last=False)
            awaited[record.decision_id] = (
                key,
                tokens(record.prompt_tokens, record.completion_tokens),
                record.predicted_energy_j if record.status == 200 else None,
            )

    def energy(self, decision_id: str, energy_j: float | None, cost_usd: float | None) -> None:
        """Add a request's energy and cost, settled after its record was counted."""
        awaited = self._awaited.pop(decision_id, None)
        if awaited is None:
            return
        key, tokens_, predicted = awaited
        cell = self._cells.get(key)
        if cell is None:  # its minute was handed on: the energy makes a row of its own
            cell = self._cells[key] = Cell()
        cell.energy(energy_j, cost_usd, tokens_, predicted)

    def take(self, until: float = math.inf) -> list[RequestMinute]:
        """Hand on the rows of the minutes that ended by `until`, and forget them."""
        due = [key for key in self._cells if key[0] + MINUTE_S <= until]
        return [self._cells.pop(key).row(key) for key in due]


def summarize(rows: Iterable[Mapping[Any, Any]], targets: TargetsOf) -> list[RequestMinute]:
    """Fold stored request records (request_records' columns, energy included) into minutes."""
    cells: dict[Key, Cell] = {}
    for r in rows:
        key = (
            minute_of(r["ts"]),
            r["route"],
            r["pool"],
            r["model"],
            r["endpoint"],
            r["slo_class"],
            bool(r["stream"]),
        )
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = Cell()
        status = r["status"]
        cell.request(
            status,
            record_meets_slo(targets(r["slo_class"]), r),
            r["prompt_tokens"],
            r["completion_tokens"],
            (r["ttft_ms"], r["tpot_ms"], r["e2e_ms"]),
            r["predicted_e2e_ms"],
        )
        cell.energy(
            r["energy_j"],
            r["cost_usd"],
            tokens(r["prompt_tokens"], r["completion_tokens"]),
            r["predicted_energy_j"] if status == 200 else None,
        )
    return [cell.row(key) for key, cell in sorted(cells.items(), key=_order)]


def _order(item: tuple[Key, Cell]) -> tuple[Any, ...]:
    return tuple("" if v is None else v for v in item[0])
