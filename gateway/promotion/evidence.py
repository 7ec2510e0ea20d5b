"""Promotion evaluations: gather each candidate's shadow evidence, judge it, keep the verdict.

The edge around gateway/promotion/judge.py: it reads the shadow minutes (gateway/promotion/
shadow_minutes.py; the last minutes, not yet settled, folded from their shadow records and the
primaries' request records), hands the evidence to the judge, and stores every verdict with its
evidence so the decision can be audited and shown in the weekly report. What it reads is the
same size whatever the traffic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sqlalchemy as sa

from gateway.db.schema import (
    promotion_evaluations,
    request_of_copy,
    request_records,
    shadow_minutes,
    shadow_records,
)
from gateway.policy.definition import Policy
from gateway.promotion import departures
from gateway.promotion.departures import departs, tolerance
from gateway.promotion.judge import (
    Agreement,
    Attainment,
    Criteria,
    Evidence,
    Failures,
    Verdict,
    judge,
)
from gateway.promotion.shadow_minutes import DAY_S, settled, summarize
from gateway.promotion.tally import FAILED, Tally, representative
from gateway.records.slo import Targets
from gateway.shadow.kinds import NOISE
from gateway.stats import sketch_value

EvidenceByKey = dict[tuple[str, str], Evidence]
# The targets of a request's SLO class, by the class its request record names (None: none kept).
TargetsOf = Callable[[str | None], Targets | None]
# The paraphrase similarity of the embedding model a route's pairs are compared with (None: none
# declared), where the meaning tolerance starts (gateway/promotion/departures.py).
ParaphraseOf = Callable[[str], float | None]
Row = Mapping[Any, Any]
# A shadow record is read whole but for these: answer texts are never read to judge or report.
LEFT_OUT = ("id", "primary_text", "candidate_text", "text_expires_at")


def criteria(policy: Policy) -> Criteria:
    """Return the judge's criteria from the policy's promotion settings."""
    p = policy.promotion
    return Criteria(
        departure_margin=p.departure_margin,
        sampled_departure_margin=p.sampled_departure_margin,
        slo_margin=p.slo_margin,
        failure_margin=p.failure_margin,
        alpha=p.alpha,
        min_samples=p.min_samples,
        min_window_s=p.min_window_days * 86400,
    )


def slo_targets(policy: Policy) -> TargetsOf:
    """Return the targets of a class by name: the policy's default class where none is named."""
    return lambda name: policy.slo_classes.get(name or policy.default_slo_class)


def gather(
    rows: Iterable[Row],
    targets_of: TargetsOf,
    paraphrase_of: ParaphraseOf = lambda route: None,
) -> EvidenceByKey:
    """Fold shadow rows into evidence per (route, candidate pool), as their minutes read
    (`shadow_minutes.summarize`, then `from_minutes`): each copy and the primary's answer are
    judged against the targets of the request's SLO class (`targets_of`)."""
    return from_minutes((m.row() for m in summarize(rows, targets_of)), paraphrase_of)


# The latencies a verdict shows (their p95), of the minutes' sketches.
JUDGED_LATENCIES = ("primary_ttft_ms", "candidate_ttft_ms", "primary_e2e_ms", "candidate_e2e_ms")


def from_minutes(
    minutes: Iterable[Row], paraphrase_of: ParaphraseOf = lambda route: None
) -> EvidenceByKey:
    """Fold shadow minutes (gateway/promotion/shadow_minutes.py) into evidence per (route,
    candidate pool).

    Every copy counts, as the answer the client would have seen. Pairs are split into
    temperature-0 and sampled traffic; each kind's noise-floor pairs set the tolerance its
    pairs are held to (gateway/promotion/departures.py, the meaning tolerance starting at the
    route's embedding model's paraphrase similarity, `paraphrase_of`), and are the floor of every
    candidate of their route. A copy that failed (gateway/compare/failures.py) departs, misses
    its SLO, and counts against the candidate beside the primary's own failures on the same
    requests; a pair whose primary's answer failed is the primary's failure. Departures are
    counted over words at risk; pairs stored before the primary's length in words was measured
    are left out of them (their matching answers cannot say how many words they put at risk)
    and counted as unmeasured. Mean energy and cost per request, each side, are over the
    answered copies where both sides have the measure.
    """
    copies: dict[tuple[str, str, bool], Tally] = {}
    floors: dict[tuple[str, bool], Tally] = {}
    for row in minutes:
        route, sampled = row["route"], bool(row["sampled"])
        if row["kind"] == NOISE:
            tally = floors.get((route, sampled))
            if tally is None:
                tally = floors[route, sampled] = Tally()
        else:
            tally = copies.get((route, row["candidate_pool"], sampled))
            if tally is None:
                tally = copies[route, row["candidate_pool"], sampled] = Tally()
        tally.add(row, JUDGED_LATENCIES)
    tolerances = {
        key: floor.floor_tolerance(paraphrase_of(key[0])) for key, floor in floors.items()
    }
    evidence: dict[tuple[str, str], Evidence] = {}
    for route, candidate in sorted({(route, candidate) for route, candidate, _ in copies}):
        e = evidence[route, candidate] = Evidence(route, candidate)
        whole = Tally()
        for sampled, agreement in ((False, e.greedy), (True, e.sampled)):
            own = copies.get((route, candidate, sampled), Tally())
            whole.merge(own)
            held_to = tolerances.get((route, sampled)) or tolerance((), paraphrase_of(route))
            _count(agreement, own, floors.get((route, sampled), Tally()), held_to)
        _add(e, whole)
    return evidence


def _add(e: Evidence, t: Tally) -> None:
    """Set a candidate's copies, failures, SLO, latency and costs from its tally."""
    e.sent = int(t["sent"])
    e.errors = int(t["sent"] - t["answered"])
    e.first_ts, e.last_ts = t.first_ts, t.last_ts
    e.failures = Failures(
        e.sent,
        int(t["failed"]),
        int(t["primary_failed"]),
        int(t["only_failed"]),
        int(t["only_primary_failed"]),
        dict(t.failures),
    )
    e.slo = Attainment(
        e.sent,
        int(t["slo_primary_met"]),
        int(t["slo_met"]),
        int(t["slo_only_primary"]),
        int(t["slo_only_met"]),
    )
    for name in JUDGED_LATENCIES:
        histogram = getattr(e, name)
        for bucket, n in t.latency.get(name, {}).items():
            histogram.add(sketch_value(bucket), n)
    e.priced, e.cheaper = int(t["priced"]), int(t["cheaper"])
    for measure, pairs in (("energy_j", "energy_pairs"), ("cost_usd", "cost_pairs")):
        if t[pairs]:
            for side in ("primary", "candidate"):
                setattr(e, f"{side}_{measure}", t[f"{side}_{measure}"] / t[pairs])


def _count(agreement: Agreement, own: Tally, floor: Tally, held_to: departures.Tolerance) -> None:
    """Count each side's measured pairs, their departures and words at risk."""
    for side, tally in (("", own), ("noise_", floor)):
        compared = departed = words = exact = 0
        for (name, value, matched), n, measured, at_risk in tally.classes():
            compared += measured
            words += at_risk
            if name is None or name == FAILED:  # decided whatever the tolerance
                departed += measured * value
                exact += measured * matched
            else:
                departed += measured * departs(representative(name, value), held_to)
            agreement.unmeasured += n - measured
        setattr(agreement, f"{side}compared", compared)
        setattr(agreement, f"{side}departed", departed)
        setattr(agreement, f"{side}words", words)
        setattr(agreement, f"{side}exact", exact)
    agreement.tolerance = held_to.describe()


def paraphrases(policy: Policy) -> ParaphraseOf:
    """Return, by route, the paraphrase similarity its shadow targets' embedding model declares
    (the highest where they name several); None where none declares one."""
    figures: dict[str, float | None] = {}
    for route in policy.routes:
        declared = [
            figure
            for target in route.shadow
            if (semantic := target.compare.semantic_similarity) is not None
            and (spec := policy.models.get(semantic.model)) is not None
            and (figure := spec.paraphrase_similarity) is not None
        ]
        figures[route.name] = max(declared, default=None)
    return lambda route: figures.get(route)


def shadow_rows(
    db: sa.Engine, since: float, until: float | None = None, route: str | None = None
) -> list[dict[str, Any]]:
    """Read the shadow records from `since` (to `until`), with what their primaries' request
    records add: the request's SLO class, and its measured energy and cost where the copy
    carries none."""
    c, r = shadow_records.c, request_records.c
    joined = {
        "primary_energy_j": sa.func.coalesce(c.primary_energy_j, r.energy_j),
        "primary_cost_usd": sa.func.coalesce(c.primary_cost_usd, r.cost_usd),
    }
    columns = [
        joined[col.name].label(col.name) if col.name in joined else col
        for col in shadow_records.columns
        if col.name not in LEFT_OUT
    ]
    query = (
        sa.select(*columns, r.slo_class)
        .select_from(shadow_records.outerjoin(request_records, request_of_copy(since, until)))
        .where(c.ts >= since)
    )
    if until is not None:
        query = query.where(c.ts < until)
    if route is not None:
        query = query.where(c.route == route)
    with db.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query)]


# What the judge and the rollout guard read of a stored row: not what only the report and the
# console show (the measures' sums, upstream errors by code, the worst pairs).
JUDGED_COLUMNS = tuple(
    c for c in shadow_minutes.columns if c.name not in ("id", "measures", "errors", "worst")
)


def read_minutes(
    db: sa.Engine,
    policy: Policy,
    since: float,
    *,
    route: str | None = None,
    primary_pool: str | None = None,
    kind: str | None = None,
    overlapping: bool = False,
    now: float | None = None,
) -> list[Row]:
    """Read the shadow minutes (days and hours once compacted) that start from `since` and
    match the filters; the minutes not settled by `now` are folded here from their shadow
    records. The one read of shadow evidence that the judge (`load_evidence`) and the rollout
    guard (gateway/promotion/rollout.py) share.

    A row is read whole or not at all: a window is cut where its first row starts, to the
    minute within the last hour, the hour within the last day or two, the day before
    (gateway/promotion/shadow_minutes.py `compact`). With `overlapping`, the row that
    `since` falls in is read too, so no copy after `since` is left out (and a row's worth
    before it may be in).
    """
    now = time.time() if now is None else now
    horizon = max(since, settled(now))
    m = shadow_minutes.c
    starts = (
        sa.and_(m.ts > since - DAY_S, m.ts + m.span_s > since) if overlapping else m.ts >= since
    )
    query = sa.select(*JUDGED_COLUMNS).where(starts, m.ts < horizon)
    for column, value in ((m.route, route), (m.primary_pool, primary_pool), (m.kind, kind)):
        if value is not None:
            query = query.where(column == value)
    with db.connect() as conn:
        minutes: list[Row] = list(conn.execute(query).mappings())
    recent = [
        r
        for r in shadow_rows(db, horizon, route=route)
        if (primary_pool is None or r["primary_pool"] == primary_pool)
        and (kind is None or r["kind"] == kind)
    ]
    minutes += [folded.row() for folded in summarize(recent, slo_targets(policy))]
    return minutes


def load_evidence(
    db: sa.Engine,
    policy: Policy,
    since: float,
    route: str | None = None,
    *,
    now: float | None = None,
) -> EvidenceByKey:
    """Read the shadow minutes that start from `since` into evidence per route and candidate
    (`read_minutes`)."""
    minutes = read_minutes(db, policy, since, route=route, now=now)
    return from_minutes(minutes, paraphrases(policy))


def window(rules: Criteria, now: float) -> float:
    """Return where the promotion window starts: twice the minimum window before `now` (a day
    at least), enough history to see it, bounded so old behaviour fades; from the start of
    that day (UTC), so the window is read in whole compacted days."""
    since = now - max(2 * rules.min_window_s, DAY_S)
    return since - since % DAY_S


def evaluate(
    db: sa.Engine, policy: Policy, *, route: str | None = None, now: float | None = None
) -> list[Verdict]:
    """Judge every route and candidate with evidence in the promotion window; store verdicts."""
    now = time.time() if now is None else now
    rules = criteria(policy)
    evidence = load_evidence(db, policy, window(rules, now), route, now=now)
    verdicts = [judge(e, rules, now) for e in evidence.values()]
    if verdicts:
        with db.begin() as conn:
            conn.execute(
                promotion_evaluations.insert(),
                [
                    {
                        "ts": now,
                        "route": v.route,
                        "candidate": v.candidate,
                        "outcome": v.outcome,
                        "reason": v.reason,
                        "evidence": json.dumps(v.as_dict()),
                    }
                    for v in verdicts
                ],
            )
    return verdicts


def latest(db: sa.Engine) -> list[dict[str, Any]]:
    """Return the newest stored verdict of every route and candidate."""
    p = promotion_evaluations.c
    newest = (
        sa.select(p.route, p.candidate, sa.func.max(p.id).label("id"))
        .group_by(p.route, p.candidate)
        .subquery()
    )
    query = sa.select(p.ts, p.evidence).join(newest, newest.c.id == p.id).order_by(p.route)
    with db.connect() as conn:
        return [{"evaluated_at": row.ts, **json.loads(row.evidence)} for row in conn.execute(query)]
