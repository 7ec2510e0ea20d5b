"""A precision check's figures and verdict, folded from what each prompt of its suite gave.

Each pair of answers is measured as shadow copies are (gateway/compare/measures.py, with the
semantic similarity of their windows on the fleet's embedding model, gateway/compare/meaning.py)
and a pair *departs* by the judge's rule (gateway/promotion/departures.py). The figures:

| figure | meaning |
| --- | --- |
| `top1_agreement` | share of compared prompts whose answers are identical |
| `mean_kl` | mean KL(reference ‖ candidate) per token up to the first difference (top-5) |
| `near_tie_share` | of the prompts that differ, the share whose first difference is a near tie |
| `harmful_share` | share of compared prompts whose answers depart in meaning |
| `departure_rate` | departures per word at risk (rates.py), what the verdict judges answers by |
| `noise_*` | the same between the reference's two answers |
| `excess` | the candidate's departure rate minus the noise floor's, on the prompts both compared |
| `ci` | 95% intervals: Wilson's for shares, the score interval for rates, MOVER for `excess` |

Where the suite's prompts are labelled (gateway/promotion/precision/labels.py), `labelled`
scores them: the share of questions the candidate answers wrong where the reference's first
answer is right (`turned_wrong`), and the same share of the reference's second answers.

The verdict is `pass` when the candidate departs at most `max_departure_rate` per word more
often than the noise floor on the same prompts (the upper end of the interval of the difference,
gateway/promotion/precision/rates.py: `excess`), in all and in each band of answer length
(`bands`: long answers that match cannot dilute short ones that depart), at most
`max_turned_wrong` more labelled answers turn wrong than the floor's (the paired interval,
paired.py), and at most `max_error_share` of the candidate's requests failed
(gateway/promotion/precision/limits.py): an error, a timeout, or a null, empty or cut-short
answer (gateway/compare/failures.py), except an answer cut short after a benign near-tie flip,
which departs instead (`cut_after_tie`, gateway/promotion/departures.py). A wrong
fact is a failure even where its words and meaning stay close to the right one. `gate` says
whether the suite is one whose pass opens the go-live gate (enough different prompts, room in
every answer, and a labelled part or the pool's reason for having none) and how many labelled
questions it holds. `fallbacks` counts the pairs measured with less than the check asks for:
without logprobs on a side (no KL, no near tie), or split into different tokens where the texts
are equal (the tokenizers differ: KL and near ties compare unlike tokens, so the check leaves
them out of every candidate pair).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import stats
from gateway.compare.measures import JUDGED
from gateway.promotion.departures import Tolerance, compared, departs, tolerance, words_at_risk
from gateway.promotion.precision.comparison import Plan, Suite
from gateway.promotion.precision.limits import (
    DEFAULT_LIMITS,
    MIN_DISTINCT_PROMPTS,
    MIN_MAX_TOKENS,
    Limits,
)
from gateway.promotion.precision.paired import Paired, wilson_interval
from gateway.promotion.precision.rates import Rate, excess_interval, words_needed
from gateway.promotion.precision.reasons import reasons

PASS, FAIL = "pass", "fail"
# Edges of the length bands, in words of the reference's answer: a short fact, an explanation,
# a long answer (`bands`).
BANDS = (32, 128)
# What a check keeps of each departing pair in its result: the measures the departure rule
# decided by, and whether the answer was cut short after a benign flip; never the answers' texts.
KEPT = (*JUDGED, "cut_after_tie")

Row = dict[str, Any]


@dataclass(slots=True)
class Outcome:
    """What one prompt of the suite gave: the candidate's pair and the noise floor's pair."""

    line: int
    candidate: Row | None = None  # None: the reference did not answer, the prompt is left out
    noise: Row | None = None  # None: the reference's second answer failed
    reference_error: str | None = None
    embedding_failed: int = 0
    # A labelled prompt (gateway/promotion/precision/labels.py): whether each answer states it.
    reference_right: bool | None = None
    candidate_right: bool | None = None
    noise_right: bool | None = None  # the reference's second answer


def judge_check(
    plan: Plan, suite: Suite, outcomes: Sequence[Outcome], limits: Limits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """Fold a suite's outcomes into the check's figures, verdict and reasons."""
    answered = [(o.line, o.candidate) for o in outcomes if o.candidate is not None]
    failed = [(line, r["candidate_error"]) for line, r in answered if r.get("candidate_error")]
    pairs = [(line, r) for line, r in answered if compared(r)]
    fallbacks = {
        "without_logprobs": sum(bool(r.get("without_logprobs")) for _, r in pairs),
        "tokens_differ": sum(bool(r.get("tokens_differ")) for _, r in pairs),
    }
    if fallbacks["tokens_differ"]:
        for _, r in pairs:
            r["near_tie"] = r["kl_divergence"] = None
    noise = [o.noise for o in outcomes if o.noise is not None and compared(o.noise)]
    tol = tolerance(noise, plan.paraphrase)
    departing = [(line, r) for line, r in pairs if departs(r, tol)]
    noise_departing = sum(departs(r, tol) for r in noise)
    n, k = len(pairs), len(departing)
    exact = sum(bool(r.get("exact_match")) for _, r in pairs)
    alpha = limits.alpha
    # The verdict compares like with like: the candidate's departures per word at risk and the
    # floor's, on the prompts where both were compared.
    both = [
        (o.candidate, o.noise)
        for o in outcomes
        if o.candidate is not None
        and o.noise is not None
        and compared(o.candidate)
        and compared(o.noise)
    ]
    rate = Rate.count((departs(c, tol), at_risk(c)) for c, _ in both)
    floor = Rate.count((departs(f, tol), at_risk(f)) for _, f in both)
    excess_ci = excess_interval(rate, floor, alpha)
    error_share = len(failed) / len(answered) if answered else 0.0
    banded = bands(both, tol, limits, alpha)
    departs_ok = (
        rate.words > 0
        and excess_ci[1] <= limits.max_departure_rate + 1e-12
        and all(band["passes"] for band in banded)
    )
    scored = labelled(outcomes, alpha)
    labels_ok = scored is None or scored["ci"]["excess"][1] <= limits.max_turned_wrong + 1e-12
    errors_ok = error_share <= limits.max_error_share + 1e-12
    result: dict[str, Any] = {
        "pool": plan.pool,
        "reference": plan.reference,
        "suite": suite.name,
        "suite_file": suite.file,
        "suite_sha256": suite.sha256,
        "models": suite.models,
        "prompts": len(suite.bodies),
        "distinct_prompts": suite.distinct_prompts,
        "fewest_max_tokens": suite.fewest_max_tokens,
        "gate": gate(suite, plan.unlabelled),
        "fallbacks": fallbacks,
        "compared": n,
        "candidate_errors": len(failed),
        "reference_errors": len(outcomes) - len(answered),
        "top1_agreement": exact / n if n else None,
        "mean_kl": stats.mean([r for _, r in pairs], "kl_divergence"),
        # Of the answers that differ, the share whose first difference is a near tie.
        "near_tie_share": stats.share(
            [r for _, r in pairs if r.get("exact_match") is False], "near_tie"
        ),
        "harmful_share": k / n if n else None,
        "paired_prompts": len(both),
        "words_at_risk": rate.words,
        "departure_rate": rate.value,
        "noise_words_at_risk": floor.words,
        "noise_departure_rate": floor.value,
        "excess": (None if rate.value is None or floor.value is None else rate.value - floor.value),
        "bands": banded,
        "noise_pairs": len(noise),
        "noise_top1_agreement": (
            sum(bool(r.get("exact_match")) for r in noise) / len(noise) if noise else None
        ),
        "noise_mean_kl": stats.mean(noise, "kl_divergence"),
        "noise_harmful_share": noise_departing / len(noise) if noise else None,
        "ci": {
            "level": 1 - alpha,
            "top1_agreement": list(wilson_interval(exact, n, alpha)),
            "harmful_share": list(wilson_interval(k, n, alpha)),
            "noise_harmful_share": list(wilson_interval(noise_departing, len(noise), alpha)),
            "departure_rate": list(rate.interval(alpha)),
            "noise_departure_rate": list(floor.interval(alpha)),
            "excess": list(excess_ci),
        },
        "labelled": scored,
        "tolerance": {"meaning": tol.meaning, "words": tol.words, "noise_pairs": tol.noise_pairs},
        "limits": {
            "max_departure_rate": limits.max_departure_rate,
            "max_turned_wrong": limits.max_turned_wrong,
            "max_error_share": limits.max_error_share,
        },
        "embedding_model": plan.embedding_model,
        "embeddings_failed": sum(o.embedding_failed for o in outcomes),
        "verdict": PASS if departs_ok and labels_ok and errors_ok else FAIL,
        "reasons": [],
        "departures": [{"line": line, **_kept(r)} for line, r in departing],
        "errors": [{"line": line, "error": error} for line, error in failed],
    }
    result["reasons"] = reasons(result, departs_ok, errors_ok, alpha)
    return result


def bands(
    both: Sequence[tuple[Row, Row]], tol: Tolerance, limits: Limits, alpha: float
) -> list[dict[str, Any]]:
    """Judge the paired prompts band by band of the reference's answer length (`BANDS`), so
    that long answers matching word for word cannot dilute short ones departing: each band is
    held to the limit on its own. A band with too few words at risk to show the limit is
    judged with the next longer one (the longest with the one before it)."""
    grouped: list[tuple[int, int | None, list[tuple[Row, Row]]]] = []
    carry: list[tuple[Row, Row]] = []
    start, above = 0, -1
    needed = words_needed(limits.max_departure_rate, alpha) if limits.max_departure_rate else 0
    for high in (*BANDS, None):
        carry += [p for p in both if above < _length(p) and (high is None or _length(p) <= high)]
        if carry and sum(at_risk(c) for c, _ in carry) >= needed:
            grouped.append((start, high, carry))
            carry, start = [], (high or 0)
        above = high if high is not None else above
    if carry:
        if grouped:
            first, _, kept = grouped.pop()
            grouped.append((first, None, kept + carry))
        else:
            grouped.append((start, None, carry))
    judged = []
    for low, high, pairs in grouped:
        rate = Rate.count((departs(c, tol), at_risk(c)) for c, _ in pairs)
        floor = Rate.count((departs(f, tol), at_risk(f)) for _, f in pairs)
        ci = excess_interval(rate, floor, alpha)
        judged.append(
            {
                "words": f"{low + 1}-{high}" if high is not None else f"{low + 1}+",
                "prompts": len(pairs),
                "departures": rate.departures,
                "words_at_risk": rate.words,
                "noise_departures": floor.departures,
                "ci": list(ci),
                "passes": rate.words > 0 and ci[1] <= limits.max_departure_rate + 1e-12,
            }
        )
    return judged


def _length(pair: tuple[Row, Row]) -> int:
    candidate, noise = pair
    return int(candidate.get("reference_words") or noise.get("reference_words") or 0)


def labelled(outcomes: Sequence[Outcome], alpha: float) -> dict[str, Any] | None:
    """Score the labelled prompts: the share the candidate answers wrong where the reference's
    first answer is right, against the same share of the reference's second answers (the noise
    floor) on the same prompts, with intervals at 1 - `alpha`; None where the suite has no
    labels."""
    scored = [o for o in outcomes if o.candidate is not None and o.candidate_right is not None]
    if not scored:
        return None
    n = len(scored)
    wrong = sum(bool(o.reference_right and not o.candidate_right) for o in scored)
    floor = [o for o in scored if o.noise_right is not None]
    noise_wrong = sum(bool(o.reference_right and not o.noise_right) for o in floor)
    paired = Paired.count(
        (
            bool(o.reference_right and not o.candidate_right),
            bool(o.reference_right and not o.noise_right),
        )
        for o in floor
    )
    return {
        "questions": n,
        "reference_right": sum(bool(o.reference_right) for o in scored),
        "candidate_right": sum(bool(o.candidate_right) for o in scored),
        "turned_wrong": wrong,
        "turned_right": sum(bool(o.candidate_right and not o.reference_right) for o in scored),
        "noise_questions": len(floor),
        "noise_turned_wrong": noise_wrong,
        "excess": paired.excess(),
        "ci": {
            "turned_wrong": list(wilson_interval(wrong, n, alpha)),
            "noise_turned_wrong": list(wilson_interval(noise_wrong, len(floor), alpha)),
            "excess": list(paired.interval(alpha)),
        },
    }


def at_risk(row: Mapping[str, Any]) -> int:
    """Return a compared pair's words at risk (gateway/promotion/precision/rates.py)."""
    return words_at_risk(
        row.get("exact_match"), row.get("first_divergence"), row.get("reference_words") or 0
    )


def gate(suite: Suite, unlabelled: str | None = None) -> dict[str, Any]:
    """Say whether a pass on `suite` opens the go-live gate: the minimums it falls short of
    (`lacks`), and how many labelled questions it holds against the labelled part a go-live
    suite needs, which the pool's `go_live.unlabelled` may excuse (`unlabelled`, its reason).
    It opens only when it lacks nothing and holds its labelled part or is excused, as
    gateway/policy/apply.py counts a check: a pass on an unlabelled suite opens no gate for a
    pool whose go_live gives no reason. Apply reads the labels again under the policy in force."""
    lacks = []
    if suite.distinct_prompts < MIN_DISTINCT_PROMPTS:
        lacks.append(f"{suite.distinct_prompts} different prompts, {MIN_DISTINCT_PROMPTS} needed")
    if suite.fewest_max_tokens < MIN_MAX_TOKENS:
        lacks.append(
            f"a prompt allows {suite.fewest_max_tokens} tokens of answer, {MIN_MAX_TOKENS} needed"
        )
    labelled = sum(isinstance(body.get("expected"), str) for _, body in suite.bodies)
    return {
        "opens": not lacks and (labelled >= MIN_DISTINCT_PROMPTS or unlabelled is not None),
        "lacks": lacks,
        "labelled": labelled,
        "labelled_needed": MIN_DISTINCT_PROMPTS,
        "unlabelled": unlabelled,
    }


def _kept(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: row.get(name) for name in KEPT}
