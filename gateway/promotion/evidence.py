"""Promotion evaluations: gather each candidate's shadow evidence, judge it, keep the verdict.

The edge around gateway/promotion/judge.py: it reads shadow records (and the primaries' measured
costs from their request records), hands the evidence to the judge, and stores every verdict with
its evidence so the decision can be audited and shown in the weekly report.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from gateway.compare.failures import ERROR, UPSTREAM
from gateway.db.schema import (
    promotion_evaluations,
    request_of_copy,
    request_records,
    shadow_records,
)
from gateway.policy.model import Policy
from gateway.promotion import departures
from gateway.promotion.departures import at_risk, departs, judged, tolerance
from gateway.promotion.judge import Agreement, Criteria, Evidence, Verdict, judge
from gateway.records.slo import Targets, meets_slo
from gateway.shadow.sample import CANDIDATE, NOISE

EvidenceByKey = dict[tuple[str, str], Evidence]
# The targets of a request's SLO class, by the class its request record names (None: none kept).
TargetsOf = Callable[[str | None], Targets | None]
# The paraphrase similarity of the embedding model a route's pairs are compared with (None: none
# declared), where the meaning tolerance starts (gateway/promotion/departures.py).
ParaphraseOf = Callable[[str], float | None]
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


def _met(r: dict[str, Any], side: str, targets: Targets | None) -> bool:
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


def gather(
    rows: Iterable[dict[str, Any]],
    targets_of: TargetsOf,
    paraphrase_of: ParaphraseOf = lambda route: None,
) -> EvidenceByKey:
    """Fold shadow rows into evidence per (route, candidate pool).

    Every copy counts, as the answer the client would have seen. Pairs are split into
    temperature-0 and sampled traffic; each kind's noise-floor pairs set the tolerance its
    pairs are held to (gateway/promotion/departures.py, the meaning tolerance starting at the
    route's embedding model's paraphrase similarity, `paraphrase_of`), and are the floor of every
    candidate of their route. A copy that failed (gateway/compare/failures.py) departs, misses
    its SLO, and counts against the candidate beside the primary's own failures on the same
    requests; a pair whose primary's answer failed is the primary's failure. Departures are
    counted over words at risk; pairs stored before the primary's length in words was measured
    are left out of them (their matching answers cannot say how many words they put at risk)
    and counted as unmeasured. Each copy and the primary's answer are judged against the
    targets of the request's SLO class (`targets_of`).
    """
    evidence: dict[tuple[str, str], Evidence] = {}
    noise: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    pairs: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == NOISE:
            if judged(r):
                noise.setdefault((r["route"], bool(r["sampled"])), []).append(r)
            continue
        e = evidence.setdefault(
            (r["route"], r["candidate_pool"]), Evidence(r["route"], r["candidate_pool"])
        )
        e.sent += 1
        ts = r["ts"]
        e.first_ts = ts if e.first_ts is None else min(e.first_ts, ts)
        e.last_ts = ts if e.last_ts is None else max(e.last_ts, ts)
        e.failures.add(r.get("primary_failure"), _failure(r))
        if judged(r):
            pairs.setdefault((r["route"], r["candidate_pool"], bool(r["sampled"])), []).append(r)
        targets = targets_of(r.get("slo_class"))
        e.slo.add(_met(r, "primary", targets), _met(r, "candidate", targets))
        if r["candidate_error"] is not None:
            e.errors += 1
            continue
        for name, value in (
            ("primary_ttft_ms", r["primary_ttft_ms"]),
            ("candidate_ttft_ms", r["candidate_ttft_ms"]),
            ("primary_e2e_ms", r["primary_e2e_ms"]),
            ("candidate_e2e_ms", r["candidate_e2e_ms"]),
        ):
            if value is not None:
                getattr(e, name).add(value)
        primary_cost, candidate_cost = r["primary_cost_usd"], r["candidate_cost_usd"]
        if primary_cost is not None and candidate_cost is not None:
            e.priced += 1
            e.cheaper += candidate_cost < primary_cost
    tolerances = {
        (route, sampled): tolerance(floor, paraphrase_of(route))
        for (route, sampled), floor in noise.items()
    }
    for e in evidence.values():
        for sampled, agreement in ((False, e.greedy), (True, e.sampled)):
            floor = noise.get((e.route, sampled), [])
            held_to = tolerances.get((e.route, sampled), tolerance((), paraphrase_of(e.route)))
            own = pairs.get((e.route, e.candidate, sampled), [])
            _count(agreement, own, floor, held_to)
    return evidence


def _failure(r: dict[str, Any]) -> str | None:
    """Return how a copy failed; for a record stored before failures were classified, its
    upstream error."""
    if r.get("failure"):
        return str(r["failure"])
    error = r["candidate_error"]
    return None if error is None else UPSTREAM.get(error, ERROR)


def _count(
    agreement: Agreement,
    own: list[dict[str, Any]],
    floor: list[dict[str, Any]],
    held_to: departures.Tolerance,
) -> None:
    """Count each side's measured pairs, their departures and words at risk."""
    measured = [(r, words) for r in own if (words := at_risk(r)) is not None]
    noise = [(r, words) for r in floor if (words := at_risk(r)) is not None]
    agreement.compared = len(measured)
    agreement.departed = sum(departs(r, held_to) for r, _ in measured)
    agreement.words = sum(words for _, words in measured)
    agreement.exact = sum(bool(r["exact_match"]) for r, _ in measured)
    agreement.noise_compared = len(noise)
    agreement.noise_departed = sum(departs(r, held_to) for r, _ in noise)
    agreement.noise_words = sum(words for _, words in noise)
    agreement.noise_exact = sum(bool(r["exact_match"]) for r, _ in noise)
    agreement.unmeasured = len(own) + len(floor) - len(measured) - len(noise)
    agreement.tolerance = held_to.describe()


# What `departs` reads of a shadow record: all the rollout guards read of the copies.
MEASURES = (
    "exact_match",
    "similarity",
    "near_tie",
    "kl_divergence",
    "json_diff",
    "embedding_cosine",
    "semantic_similarity",
)


def add_paired_means(rows: Iterable[dict[str, Any]], evidence: EvidenceByKey) -> None:
    """Set each candidate's mean energy and cost per request, primary and candidate, over the
    answered copies where both sides have the measure (the judge's benefit test and the weekly
    report read these)."""
    answered: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == CANDIDATE and r["candidate_error"] is None:
            answered[r["route"], r["candidate_pool"]].append(r)
    for key, e in evidence.items():
        copies = answered.get(key, [])
        e.primary_energy_j, e.candidate_energy_j = _paired_means(copies, "energy_j")
        e.primary_cost_usd, e.candidate_cost_usd = _paired_means(copies, "cost_usd")


def _paired_means(rows: list[dict[str, Any]], measure: str) -> tuple[float | None, float | None]:
    pairs = [
        (r[f"primary_{measure}"], r[f"candidate_{measure}"])
        for r in rows
        if r[f"primary_{measure}"] is not None and r[f"candidate_{measure}"] is not None
    ]
    if not pairs:
        return None, None
    return math.fsum(p for p, _ in pairs) / len(pairs), math.fsum(c for _, c in pairs) / len(pairs)


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


def load_evidence(
    db: sa.Engine, policy: Policy, since: float, route: str | None = None
) -> EvidenceByKey:
    """Read the shadow records since `since` into evidence per route and candidate."""
    rows = shadow_rows(db, since, route=route)
    evidence = gather(rows, slo_targets(policy), paraphrases(policy))
    add_paired_means(rows, evidence)
    return evidence


def evaluate(
    db: sa.Engine, policy: Policy, *, route: str | None = None, now: float | None = None
) -> list[Verdict]:
    """Judge every route and candidate with evidence in the promotion window; store verdicts."""
    now = time.time() if now is None else now
    rules = criteria(policy)
    # Twice the minimum window: enough history to see it, bounded so old behaviour fades.
    since = now - max(2 * rules.min_window_s, 86400.0)
    verdicts = [judge(e, rules, now) for e in load_evidence(db, policy, since, route).values()]
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
