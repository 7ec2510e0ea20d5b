"""The report's numbers: pure folds of a period's rows into plain values.

Rows are dictionaries with the columns of request_minutes (summed over a period, per key),
shadow_minutes, shadow_drops, parking_events and backend_energy (as gateway/report/records.py
reads them) and the stored precision checks' results, so the numbers can be checked against
rows built by hand. The projected savings alone read request records, a bounded sample of them,
and the worst disagreements the few shadow records the minutes name.
Values that could not be measured are None, never zero.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.compare.measures import MEASURES
from gateway.costmodel.predict import Prediction
from gateway.energy.draw import MINUTE_S
from gateway.policy.definition import Policy
from gateway.policy.tariffs import DAY_S, rate_at
from gateway.promotion.judge import Criteria
from gateway.promotion.tally import WORST, Tally, agreement
from gateway.report.period import Period
from gateway.shadow.sample import CANDIDATE, NOISE
from gateway.stats import percentile, sketch_percentile, sketch_value, total

Row = Mapping[str, Any]
Predict = Callable[[str, str, int, int, int], Prediction]
# The judge's verdicts by (route, candidate), as gateway/report/verdicts.py gives them.
Verdicts = Mapping[tuple[str, str], Mapping[str, Any]]

QUANTILES = (50, 95, 99)
LATENCIES = ("ttft", "tpot", "e2e")
# Largest number of points a CDF keeps: enough for a smooth curve, small enough for the page.
CDF_POINTS = 200


# The whole report --------------------------------------------------------------------------


def build(
    policy: Policy,
    period: Period,
    *,
    traffic: Sequence[Row],
    traffic_before: Sequence[Row],
    samples: Mapping[str, Sample],
    shadows: Sequence[Row],
    disagreements: Mapping[tuple[str, str], Sequence[Row]],
    drops: Sequence[Row],
    cost_model: Mapping[str, Any] | None,
    stored_verdicts: Sequence[Mapping[str, Any]],
    predict: Predict,
    now: float,
    rules: Criteria,
    verdicts: Verdicts,
    verdicts_before: Verdicts,
    checks: Sequence[Mapping[str, Any]] = (),
    parking: Sequence[Row] = (),
    draw: Sequence[Row] = (),
) -> dict[str, Any]:
    """Fold the rows of the period (and the history before it) into the report's numbers.

    `traffic` and `traffic_before` are the request minutes of the period and of the one
    before; `samples` each route's requests the projected savings are predicted from; `shadows`
    the shadow minutes of both periods, and `disagreements` each candidate's shadow records
    that its minutes of the period name as least similar.
    `parking` is every parking event up to the period's end (a backend parked before it began
    is parked at its start); `draw` the backends' energy and time (backend_energy) of the
    period and the one before.

    `verdicts` and `verdicts_before` are the judge's under `rules` at the end of the period and
    of the one before; `checks` are each pool's newest precision check by the end of the period.
    """
    previous = period.previous()
    this_shadows = _within(shadows, period)
    before_shadows = _within(shadows, previous)
    stored = {(v["route"], v["candidate"]): v for v in stored_verdicts}

    keys = sorted(
        {(m["route"], m["candidate_pool"]) for m in this_shadows if m["kind"] == CANDIDATE}
        | {
            (d["route"], d["candidate_pool"])
            for d in _within(drops, period)
            if d["kind"] == CANDIDATE
        }
        | set(verdicts)
    )
    candidates = []
    for route, pool in keys:
        current = candidate_numbers(
            route,
            pool,
            this_shadows,
            _within(drops, period),
            traffic,
            period,
            disagreements.get((route, pool), ()),
        )
        before = candidate_numbers(
            route, pool, before_shadows, _within(drops, previous), traffic_before, previous
        )
        current["projected_savings"] = projected_savings(
            samples.get(route, Sample()), pool, policy, predict
        )
        current["verdict"] = verdicts.get((route, pool))
        current["stored_verdict"] = stored.get((route, pool))
        current["change"] = change(current, before, verdicts_before.get((route, pool)))
        candidates.append(current)

    fleet = fleet_numbers(traffic)
    requests, requests_before = _count(traffic), _count(traffic_before)
    return {
        "period": period.as_dict(),
        "previous_period": previous.as_dict(),
        "generated_at": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "fleet": {
            "headline": fleet_headline(draw, requests, requests_before, policy, period),
            **fleet,
            "slo": slo_attainment(traffic, policy),
            "cost_model": cost_model_error(traffic, cost_model),
            "change": _fleet_change(fleet, fleet_numbers(traffic_before)),
            "hardware": hardware(policy),
        },
        "criteria": {
            "departure_margin": rules.departure_margin,
            "sampled_departure_margin": rules.sampled_departure_margin,
            "slo_margin": rules.slo_margin,
            "failure_margin": rules.failure_margin,
            "alpha": rules.alpha,
            "min_samples": rules.min_samples,
            "min_window_days": rules.min_window_s / 86400,
        },
        "candidates": candidates,
        "precision_checks": [precision_check(c) for c in checks],
        "parking": parking_numbers(parking, policy, period),
    }


WAKEUPS_SHOWN = 50


def parking_numbers(
    events: Sequence[Row], policy: Policy, period: Period, bucket_s: float = 86400.0
) -> dict[str, Any]:
    """Fold parking events into each parking pool's backends on and parked, the mean of each
    `bucket_s` (a day in the weekly report; the console's are shorter), its parks, wake-ups
    and hook failures, and the energy parked backends did not draw (counted as each is woken:
    the pool's idle draw less what its meter read while it was parked).

    A backend is parked from its `parked` event to its next `wake` (or the period's end). The
    weekly report and the console's fleet page both show this.
    """
    events = sorted(events, key=lambda e: e["ts"])
    parked_at: dict[tuple[str, str], float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        key = (e["pool"], e["backend"])
        if e["event"] == "parked":
            parked_at.setdefault(key, e["ts"])
        elif e["event"] == "wake" and key in parked_at:
            spans.setdefault(e["pool"], []).append((parked_at.pop(key), e["ts"]))
    for (pool, _), since in parked_at.items():
        spans.setdefault(pool, []).append((since, period.until))
    within = _within(events, period)
    starts = [
        period.since + bucket_s * i
        for i in range(math.ceil((period.until - period.since) / bucket_s - 1e-9))
    ]
    pools = []
    for name, spec in policy.pools.items():
        mine = [e for e in within if e["pool"] == name]
        if spec.parking is None and not mine and name not in spans:
            continue
        total = len(spec.backends)

        def parked_s(since: float, until: float, pool: str = name) -> float:
            return sum(max(0.0, min(b, until) - max(a, since)) for a, b in spans.get(pool, []))

        daily = []
        for start in starts:
            end = min(start + bucket_s, period.until)
            parked = parked_s(start, end) / (end - start)
            at = datetime.fromtimestamp(start, UTC)
            daily.append(
                {
                    "day": at.date().isoformat()
                    if bucket_s >= 86400
                    else at.isoformat(timespec="minutes").replace("+00:00", "Z"),
                    "parked": parked,
                    "active": total - parked,
                }
            )
        woken = [e for e in mine if e["event"] == "ready" and e["seconds"] is not None]
        pools.append(
            {
                "pool": name,
                "backends": total,
                "min_active": spec.parking.min_active if spec.parking else None,
                "parked_mean": parked_s(period.since, period.until) / (period.until - period.since),
                "parks": sum(e["event"] == "parked" for e in mine),
                "wakeups": sum(e["event"] == "wake" for e in mine),
                "failures": sum(e["event"] == "failed" for e in mine),
                "saved_j": sum(e["saved_j"] or 0.0 for e in mine if e["event"] == "wake"),
                "wakeup_s_p50": percentile([e["seconds"] for e in woken], 50) if woken else None,
                "daily": daily,
            }
        )
    wakeups = [
        {
            "at": datetime.fromtimestamp(e["ts"], UTC).isoformat(timespec="seconds"),
            "pool": e["pool"],
            "backend": e["backend"],
            "reason": e["reason"],
        }
        for e in within
        if e["event"] == "wake"
    ]
    return {"pools": pools, "wakeups": wakeups[-WAKEUPS_SHOWN:], "wakeups_total": len(wakeups)}


def _within(rows: Iterable[Row], period: Period) -> list[Row]:
    return [r for r in rows if period.since <= r["ts"] < period.until]


# Fleet -------------------------------------------------------------------------------------

# What the headline compares with the previous period.
HEADLINE_CHANGES = (
    "energy_j",
    "energy_j_per_request",
    "cost_usd",
    "cost_usd_per_request",
    "carbon_g",
    "device_hours",
)


def fleet_headline(
    draw: Sequence[Row],
    requests: int,
    requests_before: int,
    policy: Policy,
    period: Period,
) -> dict[str, Any]:
    """Return the fleet's energy, cost and carbon over the period (`fleet_draw`), with how far
    each moved from the period before. The weekly report and the console's fleet page lead with
    it."""
    now = fleet_draw(_within(draw, period), requests, policy, period)
    previous = period.previous()
    before = fleet_draw(_within(draw, previous), requests_before, policy, previous)
    return {**now, "change": {name: _delta(now[name], before[name]) for name in HEADLINE_CHANGES}}


def fleet_draw(
    draw: Sequence[Row], requests: int, policy: Policy, period: Period
) -> dict[str, Any]:
    """Fold the backends' minutes (backend_energy) into the fleet's energy, cost and carbon.

    - Energy is every joule the backends drew, idle included, parked too: what their meters
      read, or estimated from nominal figures where none read (`estimated_j` says how much).
    - Device-hours are each backend's time on, and parked unless its pool's parking releases
      what it parks (`mode: release`: nothing drawn, no hours paid), as the routing benchmark
      counts them.
    - Cost is the device-hours at `usd_per_hour` plus each minute's energy at the electricity
      price in force on its pool then (its tariff's window, else its `price`); carbon likewise at
      the carbon intensity, and None when the policy gives none. A pool the policy no longer
      has is counted in energy and hours, not in cost or carbon.

    Several replicas each record every backend they meter: a backend's minute counts at most
    once, its rows scaled to the minute's length when together they cover more of it.
    """
    minutes: dict[tuple[float, str, str], list[float]] = {}
    for r in draw:
        figures = minutes.setdefault((r["ts"], r["pool"], r["backend"]), [0.0] * 4)
        figures[0] += r["on_s"]
        figures[1] += r["parked_s"]
        figures[2] += r["energy_j"]
        figures[3] += r["estimated_j"]
    carbon_known = any(
        spec.price.g_co2_per_kwh > 0
        or any(w.g_co2_per_kwh > 0 for w in policy.tariffs.get(spec.tariff or "", ()))
        for spec in policy.pools.values()
    )
    pools: dict[str, dict[str, Any]] = {}
    for (ts, pool, backend), (on_s, parked_s, energy_j, estimated_j) in sorted(minutes.items()):
        covered = on_s + parked_s
        scale = min(1.0, MINUTE_S / covered) if covered > 0 else 1.0
        p = pools.setdefault(
            pool,
            {
                "pool": pool,
                "backends": set(),
                "energy_j": 0.0,
                "estimated_j": 0.0,
                "on_hours": 0.0,
                "parked_hours": 0.0,
                "energy_usd": 0.0 if pool in policy.pools else None,
                "carbon_g": 0.0 if pool in policy.pools and carbon_known else None,
            },
        )
        p["backends"].add(backend)
        p["energy_j"] += energy_j * scale
        p["estimated_j"] += estimated_j * scale
        p["on_hours"] += on_s * scale / 3600
        p["parked_hours"] += parked_s * scale / 3600
        if p["energy_usd"] is not None:
            rate = rate_at(policy, pool, ts % DAY_S)
            p["energy_usd"] += energy_j * scale * rate.usd_per_j
            if p["carbon_g"] is not None:
                p["carbon_g"] += energy_j * scale * rate.g_co2_per_j
    rows = []
    for p in pools.values():
        spec = policy.pools.get(p["pool"])
        released = spec is not None and spec.parking is not None and spec.parking.mode == "release"
        hours = p["on_hours"] + (0.0 if released else p["parked_hours"])
        p["backends"] = len(p["backends"])
        p["device_hours"] = hours
        p["hours_usd"] = None if spec is None else hours * spec.price.usd_per_hour
        p["cost_usd"] = None if spec is None else p["hours_usd"] + p["energy_usd"]
        rows.append(p)
    recorded = {ts for ts, _, _ in minutes}
    energy = math.fsum(p["energy_j"] for p in rows) if rows else None
    cost = total(rows, "cost_usd")
    carbon = total(rows, "carbon_g")
    return {
        "energy_j": energy,
        "estimated_j": total(rows, "estimated_j"),
        "energy_j_per_request": None if energy is None or not requests else energy / requests,
        "device_hours": total(rows, "device_hours"),
        "on_hours": total(rows, "on_hours"),
        "parked_hours": total(rows, "parked_hours"),
        "hours_usd": total(rows, "hours_usd"),
        "energy_usd": total(rows, "energy_usd"),
        "cost_usd": cost,
        "cost_usd_per_request": None if cost is None or not requests else cost / requests,
        "carbon_g": carbon,
        "carbon_g_per_request": None if carbon is None or not requests else carbon / requests,
        "requests": requests,
        # The share of the period's minutes some backend's draw was recorded in.
        "recorded_share": min(1.0, len(recorded) * MINUTE_S / (period.until - period.since)),
        "pools": sorted(rows, key=lambda p: p["pool"]),
    }


def _count(traffic: Iterable[Row], column: str = "requests") -> int:
    return sum(r[column] for r in traffic)


def _sum(traffic: Iterable[Row], column: str, known: str) -> float | None:
    """Return the sum of a column over minutes, None when no request had it measured."""
    rows = [r for r in traffic if r[known]]
    return math.fsum(r[column] for r in rows) if rows else None


def _ratio(numerator: float, denominator: float, scale: float = 1.0) -> float | None:
    return None if not denominator else numerator / denominator * scale


def fleet_numbers(traffic: Sequence[Row]) -> dict[str, Any]:
    """Return traffic, errors, tokens, energy and cost per pool and in total, from the period's
    request minutes; per request and per 1k tokens over the requests whose figure is known."""
    pools = []
    for pool in sorted({r["pool"] or "(none)" for r in traffic}):
        rows = [r for r in traffic if (r["pool"] or "(none)") == pool]
        energy = _sum(rows, "energy_j", "energy_n")
        pools.append(
            {
                "pool": pool,
                "requests": _count(rows),
                "errors": _count(rows, "errors"),
                "prompt_tokens": _count(rows, "prompt_tokens"),
                "completion_tokens": _count(rows, "completion_tokens"),
                "energy_j": energy,
                "cost_usd": _sum(rows, "cost_usd", "cost_n"),
                "energy_j_per_request": None
                if energy is None
                else energy / _count(rows, "energy_n"),
                "energy_j_per_1k_tokens": _ratio(
                    math.fsum(r["energy_j_tokened"] for r in rows),
                    _count(rows, "energy_tokens"),
                    1000,
                ),
                "cost_usd_per_1k_tokens": _ratio(
                    math.fsum(r["cost_usd_tokened"] for r in rows),
                    _count(rows, "cost_tokens"),
                    1000,
                ),
            }
        )
    return {
        "requests": _count(traffic),
        "errors": _count(traffic, "errors"),
        "energy_j": _sum(traffic, "energy_j", "energy_n"),
        "cost_usd": _sum(traffic, "cost_usd", "cost_n"),
        "pools": pools,
    }


def hardware(policy: Policy) -> list[dict[str, Any]]:
    """Return what each pool of the policy runs on: kind, precision, memory, serving engine and
    versions."""
    return [
        {
            "pool": name,
            "kind": pool.kind,
            "live": pool.live,
            "backends": len(pool.backends),
            "precision": pool.precision,
            "memory_gb": pool.memory_gb,
            "engine": pool.engine,
            **pool.versions(),
        }
        for name, pool in policy.pools.items()
    ]


def slo_attainment(traffic: Sequence[Row], policy: Policy) -> list[dict[str, Any]]:
    """Return, per SLO class, the share of requests that met its targets (counted as each
    ended, gateway/records/slo.py)."""
    out = []
    for name in sorted({r["slo_class"] or policy.default_slo_class for r in traffic}):
        rows = [r for r in traffic if (r["slo_class"] or policy.default_slo_class) == name]
        spec = policy.slo_classes.get(name)
        targets = (
            (spec.ttft_ms, spec.tpot_ms, spec.e2e_ms) if spec is not None else (None, None, None)
        )
        requests, met = _count(rows), _count(rows, "slo_met")
        out.append(
            {
                "slo_class": name,
                "targets_ms": dict(zip(LATENCIES, targets, strict=True)),
                "requests": requests,
                "met": met,
                "attainment": met / requests if requests else None,
            }
        )
    return out


def cost_model_error(traffic: Sequence[Row], stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the cost model's error on the period's successful requests (their mean absolute
    percentage error, summed as they were recorded) and held out at training."""
    observed = []
    for pool in sorted({r["pool"] for r in traffic if r["pool"]}):
        rows = [r for r in traffic if r["pool"] == pool]
        for target in ("e2e", "energy"):
            n = _count(rows, f"{target}_ape_n")
            mape = _ratio(math.fsum(r[f"{target}_ape"] for r in rows), n)
            observed.append({"pool": pool, "target": target, "requests": n, "mape": mape})
    held_out = []
    if stored is not None:
        for pool, models in sorted(stored["scores"].items()):
            for model, targets in sorted(models.items()):
                for target, score in sorted(targets.items()):
                    held_out.append(
                        {
                            "pool": pool,
                            "model": model,
                            "target": target,
                            "observations": score.get("observations"),
                            "mape": score.get("mape"),
                            "prior_mape": score.get("prior_mape"),
                        }
                    )
    return {
        "version": None if stored is None else stored["version"],
        "trained_at": None
        if stored is None
        else datetime.fromtimestamp(stored["created"], UTC).isoformat().replace("+00:00", "Z"),
        "observed": observed,
        "held_out": held_out,
    }


def _fleet_change(current: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: _delta(current[name], before[name]) for name in ("requests", "energy_j", "cost_usd")
    }


# Precision checks --------------------------------------------------------------------------

_CHECK_FIELDS = (
    "pool",
    "reference",
    "suite",
    "suite_sha256",
    "ts",
    "prompts",
    "distinct_prompts",
    "gate",
    "compared",
    "top1_agreement",
    "mean_kl",
    "near_tie_share",
    "harmful_share",
    "noise_harmful_share",
    "words_at_risk",
    "departure_rate",
    "noise_departure_rate",
    "excess",
    "labelled",
    "ci",
    "verdict",
    "reasons",
)


def precision_check(result: Mapping[str, Any]) -> dict[str, Any]:
    """Return what the report shows of a stored precision check: its figures and verdict."""
    return {name: result.get(name) for name in _CHECK_FIELDS}


# Per route and candidate -------------------------------------------------------------------


class Copies:
    """A route's candidate's shadow minutes of a period folded (gateway/promotion/
    shadow_minutes.py): its copies and its route's noise floor, temperature-0 and sampled, for
    the week and for each of its days."""

    def __init__(self, route: str, pool: str, minutes: Iterable[Row], period: Period):
        days = math.ceil(period.days)
        self.daily = [{key: Tally() for key in _KINDS} for _ in range(days)]
        primaries: set[str] = set()
        for m in minutes:
            if m["route"] != route or (m["kind"] == CANDIDATE and m["candidate_pool"] != pool):
                continue
            day = min(int((m["ts"] - period.since) // DAY_S), days - 1)
            self.daily[day][m["kind"], bool(m["sampled"])].add(m)
            if m["kind"] == CANDIDATE:
                primaries.add(m["primary_pool"])
        self.primary_pools = sorted(primaries)
        self.kinds = {key: Tally() for key in _KINDS}
        for day_ in self.daily:
            for key, tally in day_.items():
                self.kinds[key].merge(tally)
        self.sent = Tally()
        self.sent.merge(self.kinds[CANDIDATE, False])
        self.sent.merge(self.kinds[CANDIDATE, True])
        self.noise = Tally()
        self.noise.merge(self.kinds[NOISE, False])
        self.noise.merge(self.kinds[NOISE, True])


_KINDS = tuple((kind, sampled) for kind in (CANDIDATE, NOISE) for sampled in (False, True))


def candidate_numbers(
    route: str,
    pool: str,
    minutes: Sequence[Row],
    drops: Sequence[Row],
    traffic: Sequence[Row],
    period: Period,
    disagreements: Sequence[Row] = (),
) -> dict[str, Any]:
    """Return volume, latency, accuracy, errors, energy and cost of one route's candidate, from
    its shadow minutes; `disagreements` are the records its minutes name as least similar."""
    copies = Copies(route, pool, minutes, period)
    sent = copies.sent
    samples, answered = int(sent["sent"]), int(sent["answered"])
    dropped = Counter[str]()
    for d in drops:
        if d["kind"] == CANDIDATE and (d["route"], d["candidate_pool"]) == (route, pool):
            dropped[d["reason"]] += d["count"]
    return {
        "route": route,
        "candidate": pool,
        "primary_pools": copies.primary_pools,
        "volume": {
            "requests": sum(r["requests"] for r in traffic if r["route"] == route),
            "shadow_samples": samples,
            "answered": answered,
            "dropped": sum(dropped.values()),
            "dropped_by_reason": dict(sorted(dropped.items())),
            "noise_samples": int(copies.noise["sent"]),
        },
        "latency": latency(sent),
        "accuracy": {
            "greedy": accuracy(copies.kinds[CANDIDATE, False], copies.kinds[NOISE, False]),
            "sampled": accuracy(copies.kinds[CANDIDATE, True], copies.kinds[NOISE, True]),
            "daily": daily_accuracy(copies.daily, period),
        },
        "worst_disagreements": worst_disagreements(disagreements),
        "errors": {
            "count": samples - answered,
            "rate": (samples - answered) / samples if samples else None,
            "by_code": dict(sorted(sent.errors.items())),
        },
        "energy": {
            side: {
                "j_per_request": sent.mean(f"{side}_energy_j"),
                "j_per_1k_tokens": _per_1k(sent, f"{side}_energy_j"),
            }
            for side in ("primary", "candidate")
        },
        "cost": {
            side: {
                "usd_per_request": sent.mean(f"{side}_cost_usd"),
                "usd_per_1k_tokens": _per_1k(sent, f"{side}_cost_usd"),
            }
            for side in ("primary", "candidate")
        },
    }


def _per_1k(copies: Tally, value: str) -> float | None:
    """Return Σvalue / Σtokens × 1000 over the answered copies where both are known."""
    mean = copies.mean(f"{value}_tokened")
    return None if mean is None else mean * 1000


def _cdf(sketch: Mapping[int, int]) -> list[float]:
    """Return at most CDF_POINTS evenly spaced order statistics of a sketch, enough to draw the
    curve, each within the sketch's error."""
    ordered = sorted(sketch.items())
    n = sum(sketch.values())
    if not n:
        return []
    ranks = range(n) if n <= CDF_POINTS else (
        round(i * (n - 1) / (CDF_POINTS - 1)) for i in range(CDF_POINTS)
    )  # fmt: skip
    points, seen, at = [], 0, 0
    for rank in ranks:
        while seen + ordered[at][1] <= rank:
            seen += ordered[at][1]
            at += 1
        points.append(sketch_value(ordered[at][0]))
    return points


def latency(copies: Tally) -> dict[str, Any]:
    """Return p50/p95/p99 and CDF points of both sides' latencies over the answered copies,
    read from the minutes' sketches (within gateway/stats.py's SKETCH_RELATIVE_ERROR)."""
    out: dict[str, Any] = {}
    for name in LATENCIES:
        out[name] = {}
        for side in ("primary", "candidate"):
            sketch = copies.latency.get(f"{side}_{name}_ms", {})
            out[name][side] = {
                **{f"p{q}": sketch_percentile(sketch, q) for q in QUANTILES},
                "n": sum(sketch.values()),
                "cdf": _cdf(sketch),
            }
    return out


def accuracy(answered: Tally, noise: Tally) -> dict[str, Any]:
    """Return the measures shown over pairs of the candidate's answers beside the noise floor's."""
    return {
        "samples": int(answered["answered"]),
        "noise_samples": int(noise["answered"]),
        **agreement(answered, noise),
    }


def daily_accuracy(
    daily: Sequence[Mapping[tuple[str, bool], Tally]], period: Period
) -> list[dict[str, Any]]:
    """Return the accuracy of each UTC day of the period (temperature-0 match rates)."""
    days = []
    for i, day in enumerate(daily):
        start = period.since + i * 86400
        greedy, both = day[CANDIDATE, False], Tally()
        both.merge(greedy)
        both.merge(day[CANDIDATE, True])
        days.append(
            {
                "date": datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d"),
                "samples": int(both["answered"]),
                "exact_match_rate": greedy.mean("exact_match"),
                "normalized_match_rate": greedy.mean("normalized_match"),
                "mean_similarity": both.mean("similarity"),
                "noise_exact_match_rate": day[NOISE, False].mean("exact_match"),
            }
        )
    return days


_DISAGREEMENT_FIELDS = (
    "decision_id",
    "model",
    "tenant",
    "endpoint",
    "stream",
    "sampled",
    "temperature",
    "primary_backend",
    "candidate_backend",
    *MEASURES,
    "primary_completion_tokens",
    "candidate_completion_tokens",
)


def worst_disagreements(answered: Sequence[Row], shown: int = WORST) -> list[dict[str, Any]]:
    """Return the metadata of the least similar answers, never their texts.

    A saved report is kept for ever; a route's stored texts only for its `text_retention_h`, so
    the report names each pair by its decision id instead of copying it.
    """

    def badness(r: Row) -> tuple[float, int, int]:
        similarity = r["similarity"] if r["similarity"] is not None else 1.0
        return (similarity, bool(r["normalized_match"]), bool(r["exact_match"]))

    disagreeing = [r for r in answered if r["exact_match"] is False or (r["similarity"] or 1) < 1]
    out = []
    for r in sorted(disagreeing, key=badness)[:shown]:
        entry = {name: r.get(name) for name in _DISAGREEMENT_FIELDS}
        entry["time"] = datetime.fromtimestamp(r["ts"], UTC).isoformat().replace("+00:00", "Z")
        out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """A route's requests the projected savings are predicted from (request_records' columns),
    and what their sums are multiplied by to stand for the whole period's: 1 when they are all
    of its requests."""

    rows: Sequence[Row] = ()
    scale: float = 1.0


def projected_savings(
    sample: Sample, candidate: str, policy: Policy, predict: Predict
) -> dict[str, Any]:
    """Predict what the route's answered requests would have cost on the candidate instead.

    Both sides come from the cost model (the same model on both sides keeps its bias out of the
    difference), at the concurrency each request saw, capped at the candidate's slots. Requests
    the candidate cannot serve (model not listed, context too long) are left out and counted.
    Predicted for the sample's requests, scaled to the period's (`sampled` says how many).
    """
    spec = policy.pools.get(candidate)
    eligible, skipped = [], 0
    for r in sample.rows:
        tokens = (r["prompt_tokens"], r["completion_tokens"])
        if r["status"] != 200 or r["pool"] not in policy.pools or None in tokens:
            continue
        if r["pool"] == candidate:
            continue
        if spec is None or r["model"] not in spec.models or sum(tokens) > spec.max_context:
            skipped += 1
            continue
        eligible.append(r)
    primary_cost = primary_energy = candidate_cost = candidate_energy = 0.0
    for r in eligible:
        concurrent = max(r["concurrent"] or 1, 1)
        on_primary = predict(
            r["pool"], r["model"], r["prompt_tokens"], r["completion_tokens"], concurrent
        )
        on_candidate = predict(
            candidate,
            r["model"],
            r["prompt_tokens"],
            r["completion_tokens"],
            min(concurrent, spec.slots_per_backend if spec else 1),
        )
        primary_cost += on_primary.cost_usd
        primary_energy += on_primary.energy_j
        candidate_cost += on_candidate.cost_usd
        candidate_energy += on_candidate.energy_j
    k = sample.scale

    def scaled(value: float) -> float | None:
        return value * k if eligible else None

    return {
        "requests": round(len(eligible) * k),
        "not_servable": round(skipped * k),
        "sampled": len(sample.rows),
        "primary_cost_usd": scaled(primary_cost),
        "candidate_cost_usd": scaled(candidate_cost),
        "cost_usd_saved": scaled(primary_cost - candidate_cost),
        "primary_energy_j": scaled(primary_energy),
        "candidate_energy_j": scaled(candidate_energy),
        "energy_j_saved": scaled(primary_energy - candidate_energy),
    }


# Against the previous period ---------------------------------------------------------------


def _delta(current: float | None, before: float | None) -> dict[str, float | None]:
    return {
        "previous": before,
        "change": None if current is None or before is None else current - before,
    }


def change(
    current: Mapping[str, Any], before: Mapping[str, Any], verdict_before: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Return the headline numbers of the previous period and how far they moved."""

    def pick(numbers: Mapping[str, Any]) -> dict[str, float | None]:
        latency_e2e = numbers["latency"]["e2e"]
        return {
            "shadow_samples": numbers["volume"]["shadow_samples"],
            "exact_match_rate": numbers["accuracy"]["greedy"]["exact_match_rate"],
            "mean_similarity": numbers["accuracy"]["greedy"]["mean_similarity"],
            "error_rate": numbers["errors"]["rate"],
            "candidate_e2e_p95_ms": latency_e2e["candidate"]["p95"],
            "primary_e2e_p95_ms": latency_e2e["primary"]["p95"],
            "candidate_cost_usd_per_1k_tokens": numbers["cost"]["candidate"]["usd_per_1k_tokens"],
        }

    now, then = pick(current), pick(before)
    return {
        "measures": {name: _delta(now[name], then[name]) for name in now},
        "previous_outcome": None if verdict_before is None else verdict_before["outcome"],
    }
