"""The judge: promote, hold or reject a candidate pool from its shadow evidence.

Pure statistics, no I/O. Every criterion is decided with a confidence sequence: an interval that
holds at every sample size at once (with probability 1 - alpha), so looking at the evidence every
day, or after every batch, does not inflate the chance of a false promotion the way repeated
fixed-sample tests would. Proportions use Robbins' beta-mixture sequence, rates per word its
gamma-mixture analogue (mixture martingales with Ville's inequality: Howard et al.,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", 2021).

Criteria, each a non-inferiority test against a margin from the policy:

- quality: the candidate's temperature-0 answers depart in meaning from the primary's
  (gateway/promotion/departures.py) at most `departure_margin` times per word at risk more
  than the noise floor's (the primary's own pool asked again), so near-tie flips a bf16 GPU
  makes too are no evidence against an int8 or analog part. Per word at risk, as a precision
  check judges (gateway/promotion/precision/rates.py), because a share of departing answers
  grows with the answers' length and a rate per word does not;
- quality_sampled: the same on sampled traffic (temperature > 0), with
  `sampled_departure_margin`: two samples differ in words, and the noise floor's samples say
  how much; judged only where sampled pairs were compared;
- slo: the share of the candidate's copies that meet their SLO class's targets
  (gateway/records/slo.py) is at most `slo_margin` below the share of the primary's answers
  that do, on the same requests: a cheaper chip may be slower, and one that meets every target
  is what promotion is for. The p95 ratios of time to first token and end to end are reported
  beside the verdict, as information;
- failures: the share of requests whose copy failed where the primary's answer did not
  (gateway/compare/failures.py: an error, a timeout, a broken stream, a null, empty or
  cut-short answer) is at most `failure_margin` above the share where only the primary's answer
  failed. Only the requests where one side failed count: the share of them where it was the
  candidate, and how many there are, each get a confidence sequence at alpha / 2, and the
  difference of the two sides' failure rates is bounded from both (one side failing 10% of
  answers, the other none, is rejected after about 150 to 250 copies; two sides failing alike
  never are). A failed copy also counts as a departure and as a missed SLO.

- benefit: the candidate serves more than half of the same requests for less than the primary
  (a sign test on paired costs), so a candidate that is merely as good is never promoted.

Energy and cost saved per request are reported with the verdict.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PROMOTE, HOLD, REJECT = "promote", "hold", "reject"
PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
# Departures per word at risk a candidate may make beyond the noise floor's: one answer in a
# hundred changing in meaning, over the words a real fleet's pair puts at risk (11.97 at
# temperature 0, 10.72 sampled), rounded down. Where they come from, and why not a precision
# check's limit: docs/promotion.md, "The criteria".
DEPARTURE_MARGIN = 0.0008
SAMPLED_DEPARTURE_MARGIN = 0.0009
# Each check in an operator's words: what it is, and what failing it means.
NAMES = {
    "quality": "quality at temperature 0",
    "quality_sampled": "quality of sampled answers",
    "slo": "SLO attainment",
    "failures": "failed answers",
    "benefit": "cost benefit",
}
FAILED = {
    "quality": "its temperature-0 answers depart in meaning from the primary's more often per"
    " word than two answers of the primary's own pool do, beyond the margin",
    "quality_sampled": "its sampled answers depart in meaning from the primary's more often per"
    " word than two samples of the primary's own pool do, beyond the margin",
    "slo": "fewer of its copies meet the route's SLO than the primary's answers do, beyond"
    " the margin",
    "failures": "more of its answers fail (errors, timeouts, empty or cut-short answers) than"
    " the primary's do, beyond the margin",
    "benefit": "it is not cheaper than the primary on most requests",
}


@dataclass(frozen=True, slots=True)
class Criteria:
    """Margins and evidence requirements for a promotion."""

    departure_margin: float = DEPARTURE_MARGIN
    sampled_departure_margin: float = SAMPLED_DEPARTURE_MARGIN
    slo_margin: float = 0.01
    failure_margin: float = 0.01
    alpha: float = 0.05
    min_samples: int = 500
    min_window_s: float = 7 * 86400.0


class Histogram:
    """Counts of latencies in fixed log-spaced bins: exact enough, and O(bins) to query."""

    __slots__ = ("counts", "n")

    # 0.1 ms to ~17 min in bins 2% apart: a quantile read off it is within 2% of the exact one.
    EDGES = tuple(0.1 * 1.02**i for i in range(815))

    def __init__(self, values: Sequence[float] = ()):
        self.counts = [0] * (len(self.EDGES) + 1)
        self.n = 0
        for value in values:
            self.add(value)

    def add(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_right(self.EDGES, value)] += count
        self.n += count

    def edge_at(self, level: float, upper: bool) -> float:
        """Return the lower (or upper) edge of the bin holding the level-quantile."""
        if level <= 0:
            return 0.0
        if level >= 1:
            return math.inf
        target, seen = level * self.n, 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= target and count:
                if upper:
                    return self.EDGES[i] if i < len(self.EDGES) else math.inf
                return self.EDGES[i - 1] if i > 0 else 0.0
        return math.inf

    def quantile(self, level: float) -> float:
        """Return the level-quantile, taken as the geometric middle of its bin."""
        low, high = self.edge_at(level, upper=False), self.edge_at(level, upper=True)
        if low <= 0 or math.isinf(high):
            return high if low <= 0 else low
        return math.sqrt(low * high)


@dataclass(slots=True)
class Agreement:
    """Compared pairs of one kind of traffic (temperature 0, or sampled), the candidate's and
    the noise floor's: how many of each departed in meaning, over how many words at risk
    (gateway/promotion/departures.py), and how many matched exactly. Pairs whose words at
    risk are unknown (stored before the primary's length was measured) are counted apart."""

    compared: int = 0
    departed: int = 0
    words: int = 0
    exact: int = 0
    noise_compared: int = 0
    noise_departed: int = 0
    noise_words: int = 0
    noise_exact: int = 0
    unmeasured: int = 0  # pairs of either side left out: their words at risk are unknown
    tolerance: str = ""  # what made a pair depart, in words

    def scaled(self, factor: int) -> Agreement:
        """Return the counts as they would read with factor times the pairs at the same rates."""
        return Agreement(
            max(self.compared, 1) * factor,
            self.departed * factor,
            max(self.words, 1) * factor,
            self.exact * factor,
            max(self.noise_compared, 1) * factor,
            self.noise_departed * factor,
            max(self.noise_words, 1) * factor,
            self.noise_exact * factor,
            self.unmeasured,
            self.tolerance,
        )


@dataclass(slots=True)
class Attainment:
    """Answered copies judged against their SLO class, each beside the primary's answer to the
    same request: how many of each side met every target, and where the two sides differ."""

    pairs: int = 0
    primary_met: int = 0
    candidate_met: int = 0
    only_primary: int = 0  # the primary's answer met its targets, the candidate's copy did not
    only_candidate: int = 0

    def add(self, primary: bool, candidate: bool) -> None:
        self.pairs += 1
        self.primary_met += primary
        self.candidate_met += candidate
        self.only_primary += primary and not candidate
        self.only_candidate += candidate and not primary

    def scaled(self, factor: int) -> Attainment:
        """Return the counts as they would read with factor times the pairs at the same rates."""
        return Attainment(
            max(self.pairs, 1) * factor,
            self.primary_met * factor,
            self.candidate_met * factor,
            self.only_primary * factor,
            self.only_candidate * factor,
        )


@dataclass(slots=True)
class Failures:
    """Copies beside the primary's answers to the same requests: how many failed on each side
    (gateway/compare/failures.py), and where only one side did; the copy's failures by kind."""

    pairs: int = 0
    candidate: int = 0
    primary: int = 0
    only_candidate: int = 0
    only_primary: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, primary: str | None, candidate: str | None) -> None:
        self.pairs += 1
        self.candidate += candidate is not None
        self.primary += primary is not None
        self.only_candidate += candidate is not None and primary is None
        self.only_primary += primary is not None and candidate is None
        if candidate is not None:
            self.kinds[candidate] = self.kinds.get(candidate, 0) + 1

    def scaled(self, factor: int) -> Failures:
        """Return the counts as they would read with factor times the pairs at the same rates."""
        return Failures(
            max(self.pairs, 1) * factor,
            self.candidate * factor,
            self.primary * factor,
            self.only_candidate * factor,
            self.only_primary * factor,
        )


@dataclass(slots=True)
class Evidence:
    """What the shadow records of one route and candidate pool say."""

    route: str
    candidate: str
    greedy: Agreement = field(default_factory=Agreement)  # temperature 0
    sampled: Agreement = field(default_factory=Agreement)  # temperature > 0
    errors: int = 0  # candidate copies that got no answer: HTTP errors, timeouts, broken
    sent: int = 0  # candidate copies sent
    failures: Failures = field(default_factory=Failures)
    slo: Attainment = field(default_factory=Attainment)
    # Reported beside the verdict, not judged on: the SLO check decides latency.
    primary_ttft_ms: Histogram = field(default_factory=Histogram)
    candidate_ttft_ms: Histogram = field(default_factory=Histogram)
    primary_e2e_ms: Histogram = field(default_factory=Histogram)
    candidate_e2e_ms: Histogram = field(default_factory=Histogram)
    cheaper: int = 0  # copies whose candidate cost less than the primary, same request
    priced: int = 0  # copies with both costs measured
    primary_energy_j: float | None = None  # mean per request
    candidate_energy_j: float | None = None
    primary_cost_usd: float | None = None
    candidate_cost_usd: float | None = None
    first_ts: float | None = None
    last_ts: float | None = None


@dataclass(slots=True)
class Check:
    """One criterion's result with the numbers behind it."""

    name: str
    result: str
    estimate: float | None
    interval: tuple[float, float] | None
    threshold: float
    samples: int
    detail: str


@dataclass(slots=True)
class Verdict:
    """The judge's decision for one route and candidate, with its evidence."""

    route: str
    candidate: str
    outcome: str
    reason: str
    checks: list[Check] = field(default_factory=list)
    samples_needed: int | None = None
    window_s: float = 0.0
    benefit: dict[str, float | None] = field(default_factory=dict)
    latency: dict[str, float | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "candidate": self.candidate,
            "outcome": self.outcome,
            "reason": self.reason,
            "samples_needed": self.samples_needed,
            "window_days": round(self.window_s / 86400, 2),
            "benefit": self.benefit,
            "latency": self.latency,
            "checks": [
                {
                    "name": c.name,
                    "result": c.result,
                    "estimate": c.estimate,
                    "interval": c.interval,
                    "threshold": c.threshold,
                    "samples": c.samples,
                    "detail": c.detail,
                }
                for c in self.checks
            ],
        }


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def bernoulli_interval(successes: int, n: int, alpha: float) -> tuple[float, float]:
    """Return a confidence sequence for a success probability after n trials.

    The set of p where the beta-mixture likelihood ratio (Jeffreys prior) stays below 1/alpha:
    by Ville's inequality it covers the true p at every n at once with probability 1 - alpha,
    and it is narrow where the variance is small (agreement near 1, errors near 0).
    """
    if n <= 0:
        return (0.0, 1.0)
    mixture = _log_beta(successes + 0.5, n - successes + 0.5) - _log_beta(0.5, 0.5)
    limit = math.log(1 / alpha)

    def outside(p: float) -> bool:
        log_p = successes * math.log(p) + (n - successes) * math.log1p(-p)
        return mixture - log_p >= limit

    centre = min(max(successes / n, 1e-12), 1 - 1e-12)

    def edge(lo: float, hi: float, inside_at_hi: bool) -> float:
        for _ in range(60):
            mid = (lo + hi) / 2
            if outside(mid) == inside_at_hi:
                lo = mid
            else:
                hi = mid
        return hi if inside_at_hi else lo

    low = 0.0 if not outside(1e-12) else edge(1e-12, centre, inside_at_hi=True)
    high = 1.0 if not outside(1 - 1e-12) else edge(centre, 1 - 1e-12, inside_at_hi=False)
    return (low, high)


# The gamma mixture's prior on a rate per word: Jeffreys' shape, and a scale of one word, since
# a pair departs at most once and puts at least one word at risk (a rate is at most 1).
_PRIOR_SHAPE, _PRIOR_WORDS = 0.5, 1.0
_TINY = 1e-300


def poisson_interval(count: int, exposure: int, alpha: float) -> tuple[float, float]:
    """Return a confidence sequence for a rate per unit after `count` events in `exposure`.

    The set of rates r where the gamma-mixture likelihood ratio of a Poisson process stays below
    1/alpha: by Ville's inequality it covers the true rate at every exposure at once with
    probability 1 - alpha. Words at risk are Bernoulli trials, for which the Poisson ratio is a
    supermartingale (1 + x <= e^x), so it covers them too. Cut at 1, as a rate per word is.
    """
    if exposure <= 0:
        return (0.0, 1.0)
    shape, scale = _PRIOR_SHAPE, _PRIOR_WORDS
    # log of the mixture's evidence, without the part that depends on r
    mixture = (
        shape * math.log(scale)
        - math.lgamma(shape)
        + math.lgamma(shape + count)
        - (shape + count) * math.log(scale + exposure)
    )
    limit = math.log(1 / alpha)

    def outside(r: float) -> bool:
        return mixture - count * math.log(r) + r * exposure >= limit

    def edge(inside: float, beyond: float) -> float:
        # The log ratio is convex in r with its least at count / exposure: one crossing a side.
        for _ in range(100):
            mid = (inside + beyond) / 2
            if mid in (inside, beyond):  # as near as floats go: nothing would move again
                break
            if outside(mid):
                beyond = mid
            else:
                inside = mid
        return inside

    centre = count / exposure
    low = 0.0 if count == 0 or not outside(_TINY) else edge(centre, _TINY)
    high = 1.0 if not outside(1.0) else edge(centre, 1.0)
    return (low, high)


def _quality(name: str, a: Agreement, margin: float, alpha: float, traffic: str) -> Check:
    left_out = (
        f"; {a.unmeasured} pairs stored before the primary's length in words was measured are"
        " left out"
        if a.unmeasured
        else ""
    )
    if a.words == 0 or a.noise_words == 0:
        return Check(
            name,
            UNDECIDED,
            None,
            None,
            margin,
            min(a.compared, a.noise_compared),
            f"needs {traffic} pairs from the candidate ({a.compared}) and from the noise floor"
            f" ({a.noise_compared}){left_out}",
        )
    r_c, r_n = a.departed / a.words, a.noise_departed / a.noise_words
    c_low, c_high = poisson_interval(a.departed, a.words, alpha / 2)
    n_low, n_high = poisson_interval(a.noise_departed, a.noise_words, alpha / 2)
    low, high = c_low - n_high, c_high - n_low
    result = PASS if high <= margin else FAIL if low > margin else UNDECIDED
    return Check(
        name,
        result,
        r_c - r_n,
        (low, high),
        margin,
        min(a.compared, a.noise_compared),
        f"{a.departed} of {a.compared} {traffic} pairs depart in meaning, {1000 * r_c:.3g} per"
        f" 1,000 of their {a.words:,} words at risk; the noise floor's {a.noise_departed} of"
        f" {a.noise_compared}, {1000 * r_n:.3g} per 1,000 of {a.noise_words:,}; exact match"
        f" {a.exact / a.compared:.1%} against {a.noise_exact / a.noise_compared:.1%}"
        f" ({a.tolerance or 'default tolerance'}){left_out}",
    )


def _slo(a: Attainment, margin: float, alpha: float) -> Check:
    """Non-inferiority of paired attainment: only the pairs where the two sides differ count.

    The deficit is the share of pairs the primary met and the candidate missed less the share
    the other way round; each share gets a confidence sequence at alpha / 2 (a union bound).
    """
    if a.pairs == 0:
        return Check("slo", UNDECIDED, None, None, margin, 0, "no answered copies yet")
    lost_low, lost_high = bernoulli_interval(a.only_primary, a.pairs, alpha / 2)
    won_low, won_high = bernoulli_interval(a.only_candidate, a.pairs, alpha / 2)
    low, high = lost_low - won_high, lost_high - won_low
    result = PASS if high <= margin else FAIL if low > margin else UNDECIDED
    return Check(
        "slo",
        result,
        (a.only_primary - a.only_candidate) / a.pairs,
        (low, high),
        margin,
        a.pairs,
        f"{a.candidate_met / a.pairs:.1%} of {a.pairs} copies met their SLO class's targets,"
        f" {a.primary_met / a.pairs:.1%} of the primary's answers to the same requests",
    )


def _p95_ratios(e: Evidence) -> dict[str, float | None]:
    """Return each side's p95 and the candidate's over the primary's (information only)."""
    shown: dict[str, float | None] = {}
    for what, primary, candidate in (
        ("ttft", e.primary_ttft_ms, e.candidate_ttft_ms),
        ("e2e", e.primary_e2e_ms, e.candidate_e2e_ms),
    ):
        p = primary.quantile(0.95) if primary.n else None
        c = candidate.quantile(0.95) if candidate.n else None
        shown[f"primary_{what}_p95_ms"], shown[f"candidate_{what}_p95_ms"] = p, c
        shown[f"{what}_p95_ratio"] = c / p if p and c is not None else None
    return shown


def _failures(f: Failures, margin: float, alpha: float) -> Check:
    """Bound the candidate's failure rate minus the primary's from the requests where exactly
    one side failed (module docstring): the share of them that were the candidate's, q, and
    their share of all requests, d, each within a confidence sequence at alpha / 2; the
    difference is (2q - 1) d."""
    if f.pairs == 0:
        return Check("failures", UNDECIDED, None, None, margin, 0, "no copies sent")
    either = f.only_candidate + f.only_primary
    q_low, q_high = bernoulli_interval(f.only_candidate, either, alpha / 2)
    d_low, d_high = bernoulli_interval(either, f.pairs, alpha / 2)
    low = (2 * q_low - 1) * (d_low if q_low >= 0.5 else d_high)
    high = (2 * q_high - 1) * (d_high if q_high >= 0.5 else d_low)
    result = PASS if high <= margin else FAIL if low > margin else UNDECIDED
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(f.kinds.items()))
    return Check(
        "failures",
        result,
        (f.only_candidate - f.only_primary) / f.pairs,
        (low, high),
        margin,
        f.pairs,
        f"{f.candidate} of {f.pairs} copies failed{f' ({kinds})' if kinds else ''}, and"
        f" {f.primary} of the primary's answers to the same requests; only the copy on"
        f" {f.only_candidate}, only the primary on {f.only_primary}",
    )


def _benefit(e: Evidence, c: Criteria, alpha: float) -> Check:
    if e.priced == 0:
        return Check("benefit", UNDECIDED, None, None, 0.5, 0, "no copies with both costs yet")
    share = e.cheaper / e.priced
    low, high = bernoulli_interval(e.cheaper, e.priced, alpha)
    result = PASS if low > 0.5 else FAIL if high < 0.5 else UNDECIDED
    return Check(
        "benefit",
        result,
        share,
        (max(low, 0.0), min(high, 1.0)),
        0.5,
        e.priced,
        "share of requests the candidate serves for less than the primary",
    )


def _samples_needed(e: Evidence, checks: list[Check], c: Criteria, alpha: float) -> int | None:
    """Estimate how many more pairs would decide the undecided checks, if estimates hold."""
    undecided = {ch.name for ch in checks if ch.result == UNDECIDED}
    for factor in (2**k for k in range(1, 9)):
        scaled = _scaled(e, factor)
        rechecked = {check.name: check for check in _checks(scaled, c, alpha)}
        if all(rechecked[name].result != UNDECIDED for name in undecided if name in rechecked):
            return max(0, _pairs(scaled) - _pairs(e))
    return None


def _scaled(e: Evidence, factor: int) -> Evidence:
    """Return the evidence as it would read with factor times the samples at the same rates."""
    grow = lambda count: count * factor  # noqa: E731
    return Evidence(
        e.route,
        e.candidate,
        greedy=e.greedy.scaled(factor) if e.greedy.compared else e.greedy,
        sampled=e.sampled.scaled(factor) if e.sampled.compared else e.sampled,
        slo=e.slo.scaled(factor),
        failures=e.failures.scaled(factor),
        errors=grow(e.errors),
        sent=grow(max(e.sent, 1)),
        cheaper=grow(e.cheaper),
        priced=grow(max(e.priced, 1)),
    )


def _pairs(e: Evidence) -> int:
    """Compared pairs on both sides: the fewer of the candidate's and the noise floor's."""
    return min(
        e.greedy.compared + e.sampled.compared, e.greedy.noise_compared + e.sampled.noise_compared
    )


def _checks(e: Evidence, c: Criteria, each: float) -> list[Check]:
    """Every check: quality (per kind of traffic), SLO attainment, failures and benefit."""
    checks = [_quality("quality", e.greedy, c.departure_margin, each, "temperature-0")]
    if e.sampled.compared:
        checks.append(
            _quality("quality_sampled", e.sampled, c.sampled_departure_margin, each, "sampled")
        )
    return [
        *checks,
        _slo(e.slo, c.slo_margin, each),
        _failures(e.failures, c.failure_margin, each),
        _benefit(e, c, each),
    ]


def judge(e: Evidence, c: Criteria, now: float, alpha: float | None = None) -> Verdict:
    """Decide promote, hold or reject for one route and candidate from its evidence."""
    alpha = c.alpha if alpha is None else alpha
    # The criteria share the error budget (a union bound): each of at most five gets alpha / 5.
    each = alpha / 5
    checks = _checks(e, c, each)
    if not e.greedy.compared and e.sampled.compared:
        checks.pop(0)  # sampled traffic only: its own check decides quality
    window = 0.0 if e.first_ts is None else now - e.first_ts
    benefit = {
        "energy_j_saved_per_request": _saved(e.primary_energy_j, e.candidate_energy_j),
        "cost_usd_saved_per_request": _saved(e.primary_cost_usd, e.candidate_cost_usd),
    }
    verdict = Verdict(
        e.route,
        e.candidate,
        HOLD,
        "",
        checks,
        window_s=window,
        benefit=benefit,
        latency=_p95_ratios(e),
    )
    failed = [ch.name for ch in checks if ch.result == FAIL]
    if failed:
        verdict.outcome = REJECT
        verdict.reason = "rejected: " + "; ".join(FAILED[name] for name in failed)
        return verdict
    samples = _pairs(e)
    if all(ch.result == PASS for ch in checks):
        if samples < c.min_samples:
            verdict.reason = f"{samples} samples, {c.min_samples} required"
            verdict.samples_needed = c.min_samples - samples
        elif window < c.min_window_s:
            verdict.reason = (
                f"{window / 86400:.1f} days of evidence, {c.min_window_s / 86400:.1f} required"
            )
            verdict.samples_needed = 0
        else:
            verdict.outcome = PROMOTE
            verdict.reason = "every criterion passes"
        return verdict
    undecided = [ch.name for ch in checks if ch.result == UNDECIDED]
    verdict.reason = "not enough evidence yet on " + ", ".join(NAMES[n] for n in undecided)
    verdict.samples_needed = _samples_needed(e, checks, c, each)
    return verdict


def _saved(primary: float | None, candidate: float | None) -> float | None:
    if primary is None or candidate is None:
        return None
    return primary - candidate
