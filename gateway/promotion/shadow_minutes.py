"""Shadow minutes: the shadow copies summarized as they are recorded, a row per minute and key.

What judges or reports shadow evidence reads these instead of every shadow record: the judge
(gateway/promotion/evidence.py, `gateway promote evaluate`), the weekly report and the console's
shadow summary. A row holds the copies whose primary arrived in one minute with one key (route,
candidate pool, primary pool, kind, sampled or not), folded into the judge's sufficient
statistics and what the report shows beside them:

- copies sent and answered, failures by kind and paired with the primary's (only the copy, only
  the primary, both), and upstream errors by code;
- SLO attainment of both sides of each copy, paired (gateway/records/slo.py), judged when the
  copy is recorded against its request's class as the policy then in force has it;
- paired energy and cost sums, and how many priced copies were cheaper;
- each measure's count and sum over answered copies (match rates, similarities, KL, energy and
  cost per side, and per token), and latency sketches of both sides (gateway/stats.py);
- the judged pairs (gateway/promotion/departures.py `judged`) by *class*: the values of what
  `departs` and `tolerance` read (`MEASURES`), similarities cut to buckets of 1/BUCKETS, with
  each class's count, how many of them have their words at risk known, and those words.

The judge reads the classes back as representative pairs (`Tally.classes`): each class's
similarities at the lower edge of its bucket, handed to the same `tolerance` and `departs` that
judge single pairs. So every count of the evidence is exact, and what depends on a similarity
is exact but for the pairs within one bucket of a tolerance: a noise floor's 1st percentile is
read at the lower edge of its bucket (at most 1/BUCKETS below the exact one), and a pair whose
similarity lies in the bucket at the tolerance, or between it and the exact tolerance, may be
counted as departing where the exact computation would not (or the other way round).

Rows add up: a minute and key may have several rows (replicas, a copy that ended minutes after
its request arrived), and every reader sums them. The serving process holds each copy it records
for SETTLE_S, for its energy and its primary's (which settle seconds after their answers), then
folds it into the open row of its minute, handed to the shadow writer once the minute has
settled (`ShadowMinutes`). `summarize` folds stored shadow records the same way: the migration
that adds this table runs it on the records written before, and a test checks the evidence read
from minutes against the one computed from records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

from gateway.compare.failures import ERROR, UPSTREAM
from gateway.db.schema import ShadowMinute
from gateway.promotion.departures import _fields_differ, at_risk, judged
from gateway.records.minutes import MINUTE_S, SETTLE_S, minute_of
from gateway.records.slo import Targets, meets_slo
from gateway.stats import sketch_bucket

# What `departs` and `tolerance` read of a pair: a pair's class. The rollout guards read these too.
MEASURES = (
    "exact_match",
    "similarity",
    "near_tie",
    "json_diff",
    "embedding_cosine",
    "semantic_similarity",
)
CLASS = ("failure", *MEASURES)
# Buckets per unit of a similarity in a pair's class: the error a tolerance is read with.
BUCKETS = 1000
# The measures whose count and sum over answered copies a row keeps, for the report and console.
SUMMED = (
    "exact_match",
    "normalized_match",
    "similarity",
    "near_tie",
    "kl_divergence",
    "semantic_similarity",
    "length_ratio",
    "embedding_cosine",
    "primary_energy_j",
    "candidate_energy_j",
    "primary_cost_usd",
    "candidate_cost_usd",
)
LATENCIES = tuple(
    f"{side}_{name}_ms" for side in ("primary", "candidate") for name in ("ttft", "tpot", "e2e")
)
# What a fold reads of a stored shadow record (with its primary's energy and cost and SLO class).
RECORD_COLUMNS = (
    "ts", "route", "kind", "sampled", "endpoint", "stream", "primary_pool", "candidate_pool",
    "primary_status", "candidate_status", "candidate_error", "failure", "primary_failure",
    *LATENCIES, "primary_prompt_tokens", "primary_completion_tokens",
    "candidate_prompt_tokens", "candidate_completion_tokens",
    "normalized_match", "kl_divergence", "length_ratio", *MEASURES,
    "reference_words", "first_divergence",
    "primary_energy_j", "candidate_energy_j", "primary_cost_usd", "candidate_cost_usd",
    "slo_class",
)  # fmt: skip

Key = tuple[float, str, str, str, str, bool]  # minute, route, candidate, primary, kind, sampled
Row = Mapping[Any, Any]
# The targets of a request's SLO class, by the class its request names (None: the default).
TargetsOf = Callable[[str | None], Targets | None]

# The figures of a row, in ShadowMinute's order from `sent` to `candidate_cost_usd`.
FIGURES = (
    "sent", "answered", "failed", "primary_failed", "only_failed", "only_primary_failed",
    "slo_primary_met", "slo_met", "slo_only_primary", "slo_only_met", "priced", "cheaper",
    "energy_pairs", "primary_energy_j", "candidate_energy_j",
    "cost_pairs", "primary_cost_usd", "candidate_cost_usd",
)  # fmt: skip
_INDEX = {name: i for i, name in enumerate(FIGURES)}
_SENT, _ANSWERED, _FAILED, _PRIMARY_FAILED, _ONLY, _ONLY_PRIMARY = range(6)
_P_MET, _MET, _ONLY_P_MET, _ONLY_MET, _PRICED, _CHEAPER = range(6, 12)
_E_PAIRS, _P_ENERGY, _C_ENERGY, _C_PAIRS, _P_COST, _C_COST = range(12, 18)


def bucketed(value: float) -> float:
    """Return the lower edge of the bucket of 1/BUCKETS a similarity falls in."""
    i = math.floor(value * BUCKETS)
    if (i + 1) / BUCKETS <= value:  # the product rounded down across an edge
        i += 1
    elif i / BUCKETS > value:
        i -= 1
    return i / BUCKETS


def pair_class(r: Row) -> tuple[Any, ...]:
    """Return what `departs` and `tolerance` read of a pair, its similarities bucketed."""
    values: list[Any] = [bool(r.get("failure"))]
    for name in MEASURES:
        value = r.get(name)
        if name == "json_diff":
            value = _fields_differ(value) if value is not None else None
        elif isinstance(value, float | int) and not isinstance(value, bool):
            value = bucketed(float(value))
        values.append(value)
    return tuple(values)


def representative(cls: Iterable[Any]) -> dict[str, Any]:
    """Return a pair of a class, as `departs` and `tolerance` read one."""
    row = dict(zip(CLASS, cls, strict=True))
    row["failure"] = "failed" if row["failure"] else None
    row["json_diff"] = '{"changed": 1}' if row["json_diff"] else None
    return row


def met(r: Row, side: str, targets: Targets | None) -> bool:
    """Say whether one side of a pair met the targets, each side timed from its send.

    A side whose answer failed missed them. A side without a token count is held to the
    budget of the other side's answer to the same request.
    """
    if r.get("failure" if side == "candidate" else "primary_failure"):
        return False
    other = "primary" if side == "candidate" else "candidate"
    tokens = r[f"{side}_completion_tokens"]
    return meets_slo(
        targets,
        r[f"{side}_status"] or 0,
        r[f"{side}_ttft_ms"],
        r[f"{side}_tpot_ms"],
        r[f"{side}_e2e_ms"],
        endpoint=r["endpoint"],
        stream=bool(r["stream"]),
        completion_tokens=tokens if tokens is not None else r[f"{other}_completion_tokens"],
    )


def copy_failure(r: Row) -> str | None:
    """Return how a copy failed; for a record stored before failures were classified, its
    upstream error."""
    if r.get("failure"):
        return str(r["failure"])
    error = r["candidate_error"]
    return None if error is None else UPSTREAM.get(error, ERROR)


def _tokens(r: Row, side: str) -> int | None:
    prompt, completion = r[f"{side}_prompt_tokens"], r[f"{side}_completion_tokens"]
    if prompt is None and completion is None:
        return None
    return (prompt or 0) + (completion or 0)


def _add(counts: dict[Any, int], key: Any, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


class Tally:
    """Shadow copies folded into figures, counts by kind, measures' sums, latency sketches and
    pairs by class: one row's worth (a minute and key) or any sum of rows."""

    __slots__ = (
        "errors",
        "failures",
        "figures",
        "first_ts",
        "last_ts",
        "latency",
        "measures",
        "pairs",
    )

    def __init__(self) -> None:
        self.figures: list[float] = [0] * len(FIGURES)
        self.first_ts = math.inf
        self.last_ts = -math.inf
        self.failures: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.measures: dict[str, list[float]] = {}
        self.latency: dict[str, dict[int, int]] = {}
        self.pairs: dict[tuple[Any, ...], list[int]] = {}

    def __getitem__(self, figure: str) -> float:
        return self.figures[_INDEX[figure]]

    def copy(self, r: Row, targets: Targets | None) -> None:
        """Count one shadow copy (a shadow record's columns, with its primary's energy and cost),
        judged against `targets`, its request's SLO class's."""
        f = self.figures
        f[_SENT] += 1
        ts = r["ts"]
        self.first_ts, self.last_ts = min(self.first_ts, ts), max(self.last_ts, ts)
        failure, primary_failure = copy_failure(r), r.get("primary_failure")
        if failure is not None:
            f[_FAILED] += 1
            f[_ONLY] += primary_failure is None
            _add(self.failures, failure)
        if primary_failure is not None:
            f[_PRIMARY_FAILED] += 1
            f[_ONLY_PRIMARY] += failure is None
        primary_met, copy_met = met(r, "primary", targets), met(r, "candidate", targets)
        f[_P_MET] += primary_met
        f[_MET] += copy_met
        f[_ONLY_P_MET] += primary_met and not copy_met
        f[_ONLY_MET] += copy_met and not primary_met
        if judged(r):
            words = at_risk(r)
            counts = self.pairs.setdefault(pair_class(r), [0, 0, 0])
            counts[0] += 1
            if words is not None:
                counts[1] += 1
                counts[2] += words
        if r["candidate_error"] is not None:
            _add(self.errors, r["candidate_error"])
            return
        f[_ANSWERED] += 1
        for name in LATENCIES:
            value = r[name]
            if value is not None:
                _add(self.latency.setdefault(name, {}), sketch_bucket(value))
        for name in SUMMED:
            value = r.get(name)
            if value is not None:
                summed = self.measures.setdefault(name, [0, 0.0])
                summed[0] += 1
                summed[1] += float(value)
        for side in ("primary", "candidate"):
            tokens = _tokens(r, side)
            for measure in ("energy_j", "cost_usd"):
                value = r[f"{side}_{measure}"]
                if value is not None and tokens:
                    summed = self.measures.setdefault(f"{side}_{measure}_tokened", [0, 0.0])
                    summed[0] += tokens
                    summed[1] += value
        p_energy, c_energy = r["primary_energy_j"], r["candidate_energy_j"]
        if p_energy is not None and c_energy is not None:
            f[_E_PAIRS] += 1
            f[_P_ENERGY] += p_energy
            f[_C_ENERGY] += c_energy
        p_cost, c_cost = r["primary_cost_usd"], r["candidate_cost_usd"]
        if p_cost is not None and c_cost is not None:
            f[_PRICED] += 1
            f[_CHEAPER] += c_cost < p_cost
            f[_C_PAIRS] += 1
            f[_P_COST] += p_cost
            f[_C_COST] += c_cost

    def add(self, row: Row) -> None:
        """Add a stored row (shadow_minutes' columns)."""
        f = self.figures
        for i, name in enumerate(FIGURES):
            f[i] += row[name]
        self.first_ts = min(self.first_ts, row["first_ts"])
        self.last_ts = max(self.last_ts, row["last_ts"])
        for name in ("failures", "errors"):
            if row[name]:
                into = getattr(self, name)
                for key, n in orjson.loads(row[name]).items():
                    _add(into, key, n)
        if row["measures"]:
            for name, (n, total) in orjson.loads(row["measures"]).items():
                summed = self.measures.setdefault(name, [0, 0.0])
                summed[0] += n
                summed[1] += total
        if row["latency"]:
            for name, sketch in orjson.loads(row["latency"]).items():
                into = self.latency.setdefault(name, {})
                for bucket, n in sketch.items():
                    _add(into, int(bucket), n)
        if row["pairs"]:
            for cls, (n, measured, words) in orjson.loads(row["pairs"]):
                counts = self.pairs.setdefault(tuple(cls), [0, 0, 0])
                counts[0] += n
                counts[1] += measured
                counts[2] += words

    def merge(self, other: Tally) -> None:
        """Add another tally's copies."""
        for i, value in enumerate(other.figures):
            self.figures[i] += value
        self.first_ts = min(self.first_ts, other.first_ts)
        self.last_ts = max(self.last_ts, other.last_ts)
        for name in ("failures", "errors"):
            into = getattr(self, name)
            for key, n in getattr(other, name).items():
                _add(into, key, n)
        for name, (n, total) in other.measures.items():
            summed = self.measures.setdefault(name, [0, 0.0])
            summed[0] += n
            summed[1] += total
        for name, sketch in other.latency.items():
            into = self.latency.setdefault(name, {})
            for bucket, n in sketch.items():
                _add(into, bucket, n)
        for cls, (n, measured, words) in other.pairs.items():
            counts = self.pairs.setdefault(cls, [0, 0, 0])
            counts[0] += n
            counts[1] += measured
            counts[2] += words

    def mean(self, measure: str) -> float | None:
        """Return a measure's mean over the answered copies that have it (None: none has)."""
        n, total = self.measures.get(measure, (0, 0.0))
        return total / n if n else None

    def classes(self) -> Iterator[tuple[dict[str, Any], int, int, int]]:
        """Yield each class's representative pair, its count, how many of them have their words
        at risk known, and those words."""
        for cls, (n, measured, words) in self.pairs.items():
            yield representative(cls), n, measured, words

    def row(self, key: Key) -> ShadowMinute:
        ts, route, candidate, primary, kind, sampled = key
        figures: dict[str, Any] = {
            name: float(value) if name in _FLOATS else int(value)
            for name, value in zip(FIGURES, self.figures, strict=True)
        }

        def dumped(value: Any) -> str | None:
            return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() if value else None

        return ShadowMinute(
            ts=ts,
            route=route,
            candidate_pool=candidate,
            primary_pool=primary,
            kind=kind,
            sampled=sampled,
            **figures,
            first_ts=self.first_ts,
            last_ts=self.last_ts,
            failures=dumped(self.failures),
            errors=dumped(self.errors),
            measures=dumped(self.measures),
            latency=dumped(self.latency),
            pairs=dumped([[list(cls), counts] for cls, counts in self.pairs.items()]),
        )


_FLOATS = {"primary_energy_j", "candidate_energy_j", "primary_cost_usd", "candidate_cost_usd"}


def key_of(r: Row) -> Key:
    """Return the minute and key a shadow copy is counted under."""
    return (
        minute_of(r["ts"]),
        r["route"],
        r["candidate_pool"],
        r["primary_pool"],
        r["kind"],
        bool(r["sampled"]),
    )


def settled(now: float) -> float:
    """Return the time before which every minute's rows have been handed on to the writer, a
    minute's margin for its rounds included: a reader takes the minutes before it and the
    shadow records after it."""
    return minute_of(now - 2 * SETTLE_S) - MINUTE_S


def summarize(rows: Iterable[Row], targets: TargetsOf) -> list[ShadowMinute]:
    """Fold stored shadow records (`RECORD_COLUMNS`) into minutes."""
    tallies: dict[Key, Tally] = {}
    for r in rows:
        key = key_of(r)
        tally = tallies.get(key)
        if tally is None:
            tally = tallies[key] = Tally()
        tally.copy(r, targets(r["slo_class"]))
    return [tally.row(key) for key, tally in sorted(tallies.items())]


# Primaries whose energy is kept for their copies, at most: it settles seconds after the answer.
MAX_PRIMARIES = 100_000


class ShadowMinutes:
    """Hold each recorded copy until its energy and its primary's have settled, fold it into the
    open row of its minute, and hand on the rows of minutes that have settled (`take`).

    O(1) per copy and per primary's energy: dictionary updates and a few additions.
    """

    def __init__(self, targets: TargetsOf, max_primaries: int = MAX_PRIMARIES):
        self._targets = targets
        self._tallies: dict[Key, Tally] = {}
        # Copies held for their energy: (decision id, kind, candidate backend) → (row, class, due).
        self._held: dict[tuple[str, str, str | None], tuple[dict[str, Any], str | None, float]] = {}
        self._primaries: dict[str, tuple[float | None, float | None]] = {}
        self._max_primaries = max_primaries

    def copy(self, row: dict[str, Any], slo_class: str | None, now: float) -> None:
        """Hold a recorded copy (a shadow record's row) until its energy has settled."""
        self._held[(row["decision_id"], row["kind"], row["candidate_backend"])] = (
            row,
            slo_class,
            now + SETTLE_S,
        )

    def copy_energy(
        self, decision_id: str, kind: str, backend: str, energy_j: float | None, cost: float | None
    ) -> None:
        """Add a held copy's energy and cost on its candidate, once settled."""
        held = self._held.get((decision_id, kind, backend))
        if held is not None:
            held[0]["candidate_energy_j"], held[0]["candidate_cost_usd"] = energy_j, cost

    def primary_energy(self, decision_id: str, energy_j: float | None, cost: float | None) -> None:
        """Keep a request's energy and cost, for the copies of it."""
        primaries = self._primaries
        if len(primaries) >= self._max_primaries:  # the oldest have had their copies folded
            del primaries[next(iter(primaries))]
        primaries[decision_id] = (energy_j, cost)

    def take(self, now: float) -> list[ShadowMinute]:
        """Fold the copies held long enough, and hand on the rows of the minutes settled by
        `now` (every row when `now` is infinite)."""
        due = [key for key, (_, _, at) in self._held.items() if at <= now]
        for key in due:
            row, slo_class, _ = self._held.pop(key)
            energy = self._primaries.get(row["decision_id"])
            if energy is not None:
                if row.get("primary_energy_j") is None:
                    row["primary_energy_j"] = energy[0]
                if row.get("primary_cost_usd") is None:
                    row["primary_cost_usd"] = energy[1]
            key_ = key_of(row)
            tally = self._tallies.get(key_)
            if tally is None:
                tally = self._tallies[key_] = Tally()
            tally.copy(row, self._targets(slo_class))
        settled = now - SETTLE_S
        done = [key for key in self._tallies if key[0] + MINUTE_S <= settled]
        return [self._tallies.pop(key).row(key) for key in done]
