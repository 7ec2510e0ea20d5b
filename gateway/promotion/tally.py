"""Tallies of shadow copies: the judge's sufficient statistics, and what the report and the
console show of the copies, folded from single copies and added up from stored tallies.

Pure: a shadow record's columns (with its primary's energy and cost) in, counts and sums out.
gateway/promotion/shadow_minutes.py keeps a tally per minute and key, as copies are recorded;
what the tallies hold, and the error of reading a similarity from a pair's class, is said there.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import orjson

from gateway.compare.failures import ERROR, UPSTREAM
from gateway.compare.measures import SHOWN
from gateway.promotion.departures import (
    Tolerance,
    at_risk,
    decided,
    deciding,
    judged,
    tolerance_of,
)
from gateway.records.slo import Targets, meets_slo
from gateway.shadow.kinds import NOISE
from gateway.stats import sketch_bucket

# What `departs` and `tolerance` read of a pair: a pair's class. The rollout guards read these too.
MEASURES = (
    "exact_match",
    "similarity",
    "near_tie",
    "kl_divergence",
    "new_number",
    "json_diff",
    "embedding_cosine",
    "semantic_similarity",
)
# The least similar answered copies a row names, for the report's worst disagreements.
WORST = 5
# Buckets per unit of a similarity in a pair's class: the error a tolerance is read with.
BUCKETS = 1000
# The measures whose count and sum over answered copies a row keeps, for the report and console:
# every measure shown over many pairs, and what the report prices and weighs.
SUMMED = (
    *(name for name, _ in SHOWN),
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
Row = Mapping[Any, Any]

# The figures of a row, in ShadowMinute's order from `sent` to `candidate_cost_usd`.
FIGURES = (
    "sent", "answered", "failed", "primary_failed", "only_failed", "only_primary_failed",
    "slo_primary_met", "slo_met", "slo_only_primary", "slo_only_met", "priced", "cheaper",
    "energy_pairs", "primary_energy_j", "candidate_energy_j",
    "cost_pairs", "primary_cost_usd", "candidate_cost_usd", "floor_pairs",
)  # fmt: skip
_INDEX = {name: i for i, name in enumerate(FIGURES)}
_SENT, _ANSWERED, _FAILED, _PRIMARY_FAILED, _ONLY, _ONLY_PRIMARY = range(6)
_P_MET, _MET, _ONLY_P_MET, _ONLY_MET, _PRICED, _CHEAPER = range(6, 12)
_E_PAIRS, _P_ENERGY, _C_ENERGY, _C_PAIRS, _P_COST, _C_COST, _FLOOR = range(12, 19)


# The class of a judged pair whose copy failed: it departs whatever the tolerance, as a pair
# decided without one (None) does, and is kept apart so the rollout guard, whose copies are the
# former primary's answers, can leave the former primary's failures out of its agreement.
# Rows written before it was kept apart hold such pairs under (None, True, False).
FAILED = "failed"


def bucketed(value: float) -> float:
    """Return the lower edge of the bucket of 1/BUCKETS a similarity falls in."""
    i = math.floor(value * BUCKETS)
    if (i + 1) / BUCKETS <= value:  # the product rounded down across an edge
        i += 1
    elif i / BUCKETS > value:
        i -= 1
    return i / BUCKETS


def pair_class(r: Row) -> tuple[str | None, Any, bool]:
    """Return what the judge needs of a judged pair: how `departs` decides it without a
    tolerance (None, departs or not, exact match; `FAILED` for a copy that failed, which
    departs), or the similarity it is judged on against one, bucketed (its name, the bucket's
    lower edge, False)."""
    if r.get("failure"):
        return FAILED, True, bool(r.get("exact_match"))
    outcome = decided(r)
    if outcome is not None:
        return None, outcome, bool(r.get("exact_match"))
    name, value = deciding(r)
    return name, bucketed(value), False


def representative(name: str, value: float) -> dict[str, Any]:
    """Return a pair judged on one similarity, as `departs` reads one."""
    return {"exact_match": False, name: value}


def floor_of(r: Row) -> list[tuple[str, float]]:
    """Return the similarities a noise-floor pair gives `tolerance`, bucketed: none for a pair
    that failed or matched, else its semantic similarity, its embeddings' cosine where it has
    no semantic similarity, and its word similarity."""
    if r.get("failure") or r.get("primary_failure") or r.get("exact_match"):
        return []
    semantic, cosine = r.get("semantic_similarity"), r.get("embedding_cosine")
    found = []
    if semantic is not None:
        found.append(("semantic_similarity", bucketed(float(semantic))))
    elif cosine is not None:
        found.append(("embedding_cosine", bucketed(float(cosine))))
    if (words := r.get("similarity")) is not None:
        found.append(("similarity", bucketed(float(words))))
    return found


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
        "floor",
        "last_ts",
        "latency",
        "measures",
        "pairs",
        "worst",
    )

    def __init__(self) -> None:
        self.figures: list[float] = [0] * len(FIGURES)
        self.first_ts = math.inf
        self.last_ts = -math.inf
        self.failures: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.measures: dict[str, list[float]] = {}
        self.latency: dict[str, dict[int, int]] = {}
        self.pairs: dict[tuple[str | None, Any, bool], list[int]] = {}
        # The noise floor's similarities, by name and bucket, as `tolerance` reads them.
        self.floor: dict[str, dict[float, int]] = {}
        # [similarity (1 unmeasured), normalized match, exact match, decision id], least first.
        self.worst: list[list[Any]] = []

    def __getitem__(self, figure: str) -> float:
        return self.figures[_INDEX[figure]]

    def copy(self, r: Row, targets: Targets | None, n: int = 1) -> None:
        """Count one shadow copy (a shadow record's columns, with its primary's energy and cost),
        judged against `targets`, its request's SLO class's; or `n` copies alike."""
        f = self.figures
        f[_SENT] += n
        ts = r["ts"]
        self.first_ts, self.last_ts = min(self.first_ts, ts), max(self.last_ts, ts)
        failure, primary_failure = copy_failure(r), r.get("primary_failure")
        if failure is not None:
            f[_FAILED] += n
            f[_ONLY] += n * (primary_failure is None)
            _add(self.failures, failure, n)
        if primary_failure is not None:
            f[_PRIMARY_FAILED] += n
            f[_ONLY_PRIMARY] += n * (failure is None)
        primary_met, copy_met = met(r, "primary", targets), met(r, "candidate", targets)
        f[_P_MET] += n * primary_met
        f[_MET] += n * copy_met
        f[_ONLY_P_MET] += n * (primary_met and not copy_met)
        f[_ONLY_MET] += n * (copy_met and not primary_met)
        if judged(r):
            words = at_risk(r)
            counts = self.pairs.setdefault(pair_class(r), [0, 0, 0])
            counts[0] += n
            if words is not None:
                counts[1] += n
                counts[2] += n * words
            if r["kind"] == NOISE and not failure:
                f[_FLOOR] += n
                for name, bucket in floor_of(r):
                    _add(self.floor.setdefault(name, {}), bucket, n)
        if r["candidate_error"] is not None:
            _add(self.errors, r["candidate_error"], n)
            return
        f[_ANSWERED] += n
        similarity = r["similarity"]
        if r["exact_match"] is False or (similarity is not None and similarity < 1):
            least = [1.0 if similarity is None else similarity, bool(r["normalized_match"]),
                     bool(r["exact_match"]), r["decision_id"]]  # fmt: skip
            self._worst([least] * min(n, WORST))
        for name in LATENCIES:
            value = r[name]
            if value is not None:
                _add(self.latency.setdefault(name, {}), sketch_bucket(value), n)
        for name in SUMMED:
            value = r.get(name)
            if value is not None:
                summed = self.measures.setdefault(name, [0, 0.0])
                summed[0] += n
                summed[1] += n * float(value)
        for side in ("primary", "candidate"):
            tokens = _tokens(r, side)
            for measure in ("energy_j", "cost_usd"):
                value = r[f"{side}_{measure}"]
                if value is not None and tokens:
                    summed = self.measures.setdefault(f"{side}_{measure}_tokened", [0, 0.0])
                    summed[0] += n * tokens
                    summed[1] += n * value
        p_energy, c_energy = r["primary_energy_j"], r["candidate_energy_j"]
        if p_energy is not None and c_energy is not None:
            f[_E_PAIRS] += n
            f[_P_ENERGY] += n * p_energy
            f[_C_ENERGY] += n * c_energy
        p_cost, c_cost = r["primary_cost_usd"], r["candidate_cost_usd"]
        if p_cost is not None and c_cost is not None:
            f[_PRICED] += n
            f[_CHEAPER] += n * (c_cost < p_cost)
            f[_C_PAIRS] += n
            f[_P_COST] += n * p_cost
            f[_C_COST] += n * c_cost

    def _worst(self, more: list[list[Any]]) -> None:
        if more:
            self.worst = sorted(self.worst + more)[:WORST]

    def merge_worst(self, worst: str) -> None:
        """Add a stored row's least similar copies (its `worst` column)."""
        self._worst(orjson.loads(worst))

    def add(self, row: Row, latencies: Collection[str] = LATENCIES) -> None:
        """Add a stored row (shadow_minutes' columns; a JSON column left out of the read is
        left out of the tally, and so are the latencies not in `latencies`)."""
        f = self.figures
        for i, name in enumerate(FIGURES):
            f[i] += row[name]
        self.first_ts = min(self.first_ts, row["first_ts"])
        self.last_ts = max(self.last_ts, row["last_ts"])
        # The merges are written out: a call per entry took half the judge's time.
        for name in ("failures", "errors"):
            if row.get(name):
                counts = getattr(self, name)
                for key, n in orjson.loads(row[name]).items():
                    counts[key] = counts.get(key, 0) + n
        if row.get("measures"):
            for name, (n, total) in orjson.loads(row["measures"]).items():
                summed = self.measures.setdefault(name, [0, 0.0])
                summed[0] += n
                summed[1] += total
        if row.get("latency"):
            for name, sketch in orjson.loads(row["latency"]).items():
                if name not in latencies:
                    continue
                buckets = self.latency.setdefault(name, {})
                get = buckets.get
                for bucket, n in sketch.items():
                    b = int(bucket)
                    buckets[b] = get(b, 0) + n
        if row.get("worst"):
            self._worst(orjson.loads(row["worst"]))
        if row.get("floor"):
            for name, values in orjson.loads(row["floor"]).items():
                floor = self.floor.setdefault(name, {})
                get_ = floor.get
                for edge, n in values.items():
                    e = float(edge)
                    floor[e] = get_(e, 0) + n
        if row.get("pairs"):
            pairs = self.pairs
            for (name, value, exact), (n, measured, words) in orjson.loads(row["pairs"]):
                counts = pairs.get((name, value, exact))
                if counts is None:
                    pairs[name, value, exact] = [n, measured, words]
                else:
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
        self._worst(other.worst)
        for name, values in other.floor.items():
            floor = self.floor.setdefault(name, {})
            for edge, n in values.items():
                _add(floor, edge, n)
        for cls, (n, measured, words) in other.pairs.items():
            counts = self.pairs.setdefault(cls, [0, 0, 0])
            counts[0] += n
            counts[1] += measured
            counts[2] += words

    def mean(self, measure: str) -> float | None:
        """Return a measure's mean over the answered copies that have it (None: none has)."""
        n, total = self.measures.get(measure, (0, 0.0))
        return total / n if n else None

    def classes(self) -> Iterator[tuple[tuple[str | None, Any, bool], int, int, int]]:
        """Yield each class of judged pairs (`pair_class`), its count, how many of them have
        their words at risk known, and those words."""
        for cls, (n, measured, words) in self.pairs.items():
            yield cls, n, measured, words

    def floor_tolerance(self, paraphrase: float | None = None) -> Tolerance:
        """Return the tolerance of the noise floor these copies are (`tolerance_of`), read from
        the floor's counts: equal to `tolerance(self.floor_pairs(), paraphrase)`, without a
        row per pair."""
        floor = self.floor
        return tolerance_of(
            int(self["floor_pairs"]),
            floor.get("semantic_similarity", {}),
            floor.get("embedding_cosine", {}),
            floor.get("similarity", {}),
            paraphrase,
        )

    def floor_pairs(self) -> list[dict[str, Any]]:
        """Return the noise floor's pairs as `tolerance` reads them: as many as did not fail,
        with the similarities of those that differ, each at its bucket's lower edge (which
        pair held which similarity is not kept: `tolerance` reads each on its own)."""
        meaning = [
            representative(name, value)
            for name in ("semantic_similarity", "embedding_cosine")
            for value, n in self.floor.get(name, {}).items()
            for _ in range(n)
        ]
        words = [v for v, n in self.floor.get("similarity", {}).items() for _ in range(n)]
        pairs = []
        for i in range(max(len(meaning), len(words))):
            pair: dict[str, Any] = dict(meaning[i]) if i < len(meaning) else {"exact_match": False}
            if i < len(words):
                pair["similarity"] = words[i]
            pairs.append(pair)
        return pairs + [{"exact_match": True}] * (int(self["floor_pairs"]) - len(pairs))


def agreement(candidates: Tally, noise: Tally) -> dict[str, float | None]:
    """Each measure shown over many pairs (`SHOWN`): its rate or mean over the candidate's
    answered copies, and over the noise floor's (`noise_` before its name)."""
    figures = {shown.key(name): candidates.mean(name) for name, shown in SHOWN}
    return figures | {f"noise_{shown.key(name)}": noise.mean(name) for name, shown in SHOWN}
