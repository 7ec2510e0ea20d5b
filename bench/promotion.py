"""Calibrate the judge: measured pairs of answers, weeks of shadow traffic on a virtual clock.

    python -m bench.promotion --fleet real --seed 0 --out docs/results/promotion-real-seed0.json
    python -m bench.promotion --fleet held-out --seed 0 --out R.json
    python -m bench.promotion --fleet held-out --scenario digits --scenario timeouts --out R.json
    python -m bench.promotion --fleet simulated --seed 0 --out docs/results/promotion-seed0.json
    python -m bench.promotion --fleet simulated --natural-lengths --seed 0 --out R.json

1. Pairs (bench/pairs.py): each candidate's answers and the noise floor's, compared as the mirror
   compares shadow copies, at temperature 0 and sampled at 0.7; on the real fleet with every
   labelled answer marked right or wrong.
2. Weeks: shadow traffic at the conversation trace's rate (19,366 requests an hour), 5% of it
   copied to the candidate and a quarter of that to the noise floor, 0.2% of copies failing
   (an upstream error, on either). Each copy is a shadow record as the mirror writes one, its
   pair drawn from the measured pairs (`Drawn`); the records are folded into rows as the shadow
   minutes fold them (gateway/promotion/shadow_minutes.py, a row per look and key), and every
   6 hours the judge (gateway/promotion/judge.py) decides on the evidence `from_minutes` reads
   of every row so far: the live judge's read, so the tolerance is the floor's copies' own and a
   failed copy departs and misses its SLO as it does live. A run's decision is the first
   promote or reject it says; one that says neither holds.

Every scenario's candidate is cheaper on 90% of requests and meets the SLO as the primary does
(but `worse_latency`), so that quality alone decides. The quality null is a candidate that
departs exactly `departure_margin` more often per word at risk than the noise floor, over as
many words per pair (the floor's own pairs, each that does not depart departing instead with a
chance of the margin times its words at risk): the most a judge may let through, so it must
promote it at most alpha of the time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import pairs
from bench.pairs import Measured, Rates
from gateway.compare.failures import ERROR
from gateway.compare.measures import MEASURES
from gateway.promotion.departures import Tolerance, at_risk, departs
from gateway.promotion.evidence import from_minutes
from gateway.promotion.judge import PROMOTE, REJECT, Criteria, Evidence, judge
from gateway.promotion.shadow_minutes import summarize_alike
from gateway.records.slo import Budget, Targets
from gateway.shadow.kinds import CANDIDATE, NOISE
from simulator.profile import load_profile

REQUESTS_PER_HOUR = 19_366
SHADOW_RATE = 0.05
NOISE_SHARE = 0.25
ERROR_RATE = 0.002
# Pairs judged against the SLO: the share where only one side misses, load spikes and slow
# prompts that either pool can meet or miss (the rest both meet, or both miss).
ONLY_PRIMARY_MISSES = ONLY_CANDIDATE_MISSES = 0.002
BOTH_MISS = 0.005

Row = Mapping[str, Any]
Copies = tuple[dict[str, Any], int]  # a shadow record, and how many copies it stands for
ROUTE, PRIMARY_POOL, CANDIDATE_POOL = "chat", "gpu", "candidate"
# Every copy's SLO class, and the times of a side that meets it and of one that misses it.
SLO = Budget(ttft_ms=1000.0, tpot_ms=100.0)
MET = {"ttft_ms": 300.0, "tpot_ms": 30.0, "e2e_ms": 3270.0}
MISSED = {"ttft_ms": 3000.0, "tpot_ms": 30.0, "e2e_ms": 5970.0}


def _timed(primary: Mapping[str, float], candidate: Mapping[str, float]) -> dict[str, float]:
    return {f"{side}_{name}": value for side, times in (("primary", primary), ("candidate",
            candidate)) for name, value in times.items()}  # fmt: skip


# (primary met, candidate met) as the cells are drawn: only the primary misses, only the
# candidate, both, neither.
SLO_CELLS = (_timed(MISSED, MET), _timed(MET, MISSED), _timed(MISSED, MISSED), _timed(MET, MET))
# A request's energy and cost on the primary, and on a candidate cheaper or dearer than it.
CHEAPER = {"primary_energy_j": 20.0, "candidate_energy_j": 8.0,
           "primary_cost_usd": 1e-4, "candidate_cost_usd": 4e-5}  # fmt: skip
DEARER = {**CHEAPER, "candidate_energy_j": 30.0, "candidate_cost_usd": 1.5e-4}
# What a shadow record holds beside its pair's measures (gateway/shadow/records.py).
COPY: dict[str, Any] = {
    "decision_id": "",
    "route": ROUTE,
    "kind": CANDIDATE,
    "endpoint": "chat",
    "stream": True,
    "primary_pool": PRIMARY_POOL,
    "candidate_pool": CANDIDATE_POOL,
    "primary_status": 200,
    "candidate_status": 200,
    "candidate_error": None,
    "failure": None,
    "primary_failure": None,
    "primary_prompt_tokens": 200,
    "primary_completion_tokens": 100,
    "candidate_prompt_tokens": 200,
    "candidate_completion_tokens": 100,
    "primary_energy_j": None,
    "candidate_energy_j": None,
    "primary_cost_usd": None,
    "candidate_cost_usd": None,
    "slo_class": None,
}
# What a pair measured for the calibration gives a shadow record: the mirror's measures, how
# the copy failed (the real fleet's empty or cut-short answers) or was cut after a tie, and how
# the primary's answer failed beside it (a sampled answer stopping short of the copy's).
PAIR_COLUMNS = (
    *(name for name in MEASURES if name != "measures"),
    "candidate_error",
    "failure",
    "primary_failure",
    "cut_after_tie",
)
# A copy the candidate's pool answered with an error.
FAILED_COPY = {
    **dict.fromkeys(PAIR_COLUMNS),
    "candidate_status": 502,
    "candidate_error": "upstream_error",
    "failure": ERROR,
    "candidate_completion_tokens": None,
}
# A pair whose answers part in meaning whatever the tolerance a floor sets (the quality null's).
DEPARTING = {
    "exact_match": False,
    "normalized_match": False,
    "near_tie": False,
    "kl_divergence": None,
    "json_diff": None,
    "cut_after_tie": None,
    "embedding_cosine": None,
    "semantic_similarity": 0.0,
    "similarity": 0.0,
}


@dataclass(frozen=True)
class Scenario:
    """A candidate, its traffic, how long the judge watches it, and what a sound judge says."""

    candidate: str  # a simulator profile, or a part of bench.pairs' REAL_PARTS or HELD_OUT_PARTS
    truth: str  # "promote", "reject" or "not promote"
    harmful_rate: float = 0.0  # simulated: the share of its answers with a harmful error
    excess: float | None = None  # the quality null: departs this much per word above the floor
    sampled_share: float = 0.0
    slo_loss: float = 0.0  # share of requests where only the candidate misses, beyond noise
    cheaper: float = 0.9
    days: float = 7.0
    kinds: tuple[str, ...] = ()  # held out: the prompt kinds of its traffic (every kind if none)


DEPARTURE_MARGIN = Criteria().departure_margin
# The simulated analog part, fit to the real one (bench/precision_fit.py).
CIM_HARMFUL_RATE = load_profile("cim").precision.harmful_rate
EVERYDAY, NUMBERS = pairs.EVERYDAY_KINDS, pairs.NUMBER_KINDS
SCENARIOS = {
    "simulated": {
        "aa": Scenario("gpu", "promote"),
        "quality_null": Scenario("gpu", "not promote", excess=DEPARTURE_MARGIN),
        "benign": Scenario("asic", "promote"),
        "harmful": Scenario("cim", "reject", harmful_rate=CIM_HARMFUL_RATE, days=14.0),
        "sampled": Scenario("asic", "promote", sampled_share=0.7, days=14.0),
        "worse_latency": Scenario("gpu", "reject", slo_loss=0.03),
    },
    "real": {
        "aa": Scenario("f16", "promote"),
        "quality_null": Scenario("f16", "not promote", excess=DEPARTURE_MARGIN),
        "benign": Scenario("q8_0", "promote"),
        "harmful": Scenario("analog", "reject", days=14.0),
        "subtle": Scenario("subtle", "reject", days=14.0),
        "sampled": Scenario("q8_0", "promote", sampled_share=0.7, days=14.0),
    },
    # Parts and prompts no threshold was fitted on (bench/pairs.py, `held_out`): traffic of
    # everyday prompts, or of everyday questions answered by a number.
    "held-out": {
        "aa": Scenario("f16", "promote", kinds=EVERYDAY),
        "quality_null": Scenario("f16", "not promote", excess=DEPARTURE_MARGIN, kinds=EVERYDAY),
        "benign": Scenario("q8_0", "promote", kinds=EVERYDAY),
        "benign_q6_k": Scenario("q6_k", "promote", kinds=EVERYDAY),
        "sampled": Scenario("q6_k", "promote", sampled_share=0.7, days=14.0, kinds=EVERYDAY),
        "analog_10db": Scenario("analog_10db", "reject", days=14.0, kinds=EVERYDAY),
        "analog_8db": Scenario("analog_8db", "reject", days=14.0, kinds=EVERYDAY),
        "empty": Scenario("empty", "reject", days=14.0, kinds=EVERYDAY),
        "cut": Scenario("cut", "reject", days=14.0, kinds=EVERYDAY),
        "errors": Scenario("errors", "reject", days=14.0, kinds=EVERYDAY),
        "timeouts": Scenario("timeouts", "reject", days=14.0, kinds=EVERYDAY),
        "paraphrase": Scenario("paraphrase", "promote", kinds=EVERYDAY),
        "benign_numbers": Scenario("q8_0", "promote", kinds=NUMBERS),
        "digits": Scenario("digits", "reject", days=14.0, kinds=NUMBERS),
    },
}
# What each truth is held to: the share of runs that must end so.
TARGETS = {
    "promote": ("promote_rate", ">=", 0.90),
    "not promote": ("promote_rate", "<=", 0.05),
    "reject": ("reject_rate", ">=", 0.95),
}
# Looser bounds where the evidence is harder: a part wrong on a few percent of answers, and
# mostly sampled traffic, whose pairs differ in words by design (decided within 14 days, and
# decided right: a benign part rejected is no decision to count).
LOOSER = {"subtle": ("reject_rate", ">=", 0.80), "sampled": ("promote_rate", ">=", 0.80)}


def run(
    scenario: Scenario,
    traffic: Mapping[bool, Traffic],
    criteria: Criteria,
    rng: np.random.Generator,
    *,
    look_hours: float,
    paraphrase: float | None = None,
) -> tuple[str, float | None, Evidence]:
    """Simulate one candidate's shadow stream; return its decision, the day it came, and the
    evidence it was decided on (the last look's, where it holds)."""
    evidence = Evidence(ROUTE, CANDIDATE_POOL)
    looks = weeks(scenario, traffic, rng, look_hours=look_hours, paraphrase=paraphrase)
    for now, _, evidence in looks:
        outcome = judge(evidence, criteria, now).outcome
        if outcome in (PROMOTE, REJECT):
            return outcome, now / 86400, evidence
    return "hold", None, evidence


def weeks(
    scenario: Scenario,
    traffic: Mapping[bool, Traffic],
    rng: np.random.Generator,
    *,
    look_hours: float,
    paraphrase: float | None = None,
) -> Iterator[tuple[float, list[Copies], Evidence]]:
    """Yield, at every look, its time, the shadow copies recorded since the last one, and the
    evidence the live judge reads of every copy so far: the copies folded into rows as the
    shadow minutes are (`summarize_alike`, a row per look and key), read back by `from_minutes`
    with the embedding model's `paraphrase` similarity, as a route declaring it reads them."""
    span = look_hours * 3600
    rows: list[Row] = []
    for look in range(int(scenario.days * 24 / look_hours)):
        copies = _look(scenario, traffic, rng, look * span, REQUESTS_PER_HOUR * look_hours)
        rows += [m.row() for m in summarize_alike(copies, slo_targets, span)]
        evidence = from_minutes(rows, lambda route: paraphrase)
        yield (look + 1) * span, copies, evidence[ROUTE, CANDIDATE_POOL]


def slo_targets(slo_class: str | None) -> Targets:
    """Return the targets every copy of the bench is held to."""
    return SLO


def _look(
    scenario: Scenario,
    traffic: Mapping[bool, Traffic],
    rng: np.random.Generator,
    ts: float,
    requests: float,
) -> list[Copies]:
    """Draw the shadow copies of `requests` requests at `ts`, the candidate's and the noise
    floor's, each kind of traffic apart: a copy answered, with a measured pair, or failed."""
    sent = int(rng.poisson(requests * SHADOW_RATE))
    cells = [ONLY_PRIMARY_MISSES, ONLY_CANDIDATE_MISSES + scenario.slo_loss, BOTH_MISS]
    cells.append(1 - sum(cells))
    copies: list[Copies] = []
    for kind, n in ((CANDIDATE, sent), (NOISE, int(rng.binomial(sent, NOISE_SHARE)))):
        failed = int(rng.binomial(n, ERROR_RATE))
        sampled = int(rng.binomial(n - failed, scenario.sampled_share))
        failed_sampled = int(rng.binomial(failed, scenario.sampled_share))
        for is_sampled, answered, errors in (
            (False, n - failed - sampled, failed - failed_sampled),
            (True, sampled, failed_sampled),
        ):
            base = {**COPY, "ts": ts, "kind": kind, "sampled": is_sampled}
            t = traffic[is_sampled]
            if kind == NOISE:  # only its pairs count: they are the floor
                floor = {**base, **SLO_CELLS[3]}
                copies += [({**floor, **pair}, k) for pair, k in t.noise.draw(rng, answered)]
                copies += [({**floor, **FAILED_COPY}, errors)] if errors else []
                continue
            # The judge reads counts, not which pair missed its SLO or cost less: the draws
            # are independent of each other, so they are laid side by side in runs (`_alike`).
            missed = rng.multinomial(answered, cells)
            cheaper = int(rng.binomial(answered, scenario.cheaper))
            runs = _alike(
                t.candidate.draw(rng, answered),
                list(zip(SLO_CELLS, (int(k) for k in missed), strict=True)),
                [(CHEAPER, cheaper), (DEARER, answered - cheaper)],
            )
            copies += [({**base, **pair, **slo, **cost}, k) for (pair, slo, cost), k in runs]
            # A copy that failed misses its SLO, beside the primary's answer as the cells have it.
            primary_missed = int(rng.binomial(errors, ONLY_PRIMARY_MISSES + BOTH_MISS))
            for slo, k in ((SLO_CELLS[2], primary_missed), (SLO_CELLS[1], errors - primary_missed)):
                copies += [({**base, **FAILED_COPY, **slo}, k)] if k else []
    return copies


def _alike(*runs: Sequence[tuple[Any, int]]) -> list[tuple[tuple[Any, ...], int]]:
    """Lay runs of values of equal total length side by side; return the stretches where every
    one holds one value, as (the values, the stretch's length)."""
    queues = [[(value, n) for value, n in reversed(run) if n] for run in runs]
    stretches: list[tuple[tuple[Any, ...], int]] = []
    while all(queues):
        step = min(queue[-1][1] for queue in queues)
        stretches.append((tuple(queue[-1][0] for queue in queues), step))
        for queue in queues:
            value, n = queue.pop()
            if n > step:
                queue.append((value, n - step))
    if any(queues):
        raise ValueError(f"runs of unequal lengths: {runs}")
    return stretches


@dataclass(frozen=True)
class Drawn:
    """Measured pairs to draw shadow copies' measures from: each distinct pair once, with the
    chance of drawing it."""

    pairs: tuple[Row, ...]
    chances: np.ndarray

    @classmethod
    def of(cls, *parts: tuple[Sequence[Row], float]) -> Drawn:
        """Return each part's pairs, the part drawn its share of the time, alike pairs as one."""
        chances: dict[tuple[Any, ...], float] = {}
        pairs: dict[tuple[Any, ...], Row] = {}
        for part, share in parts:
            for row in part:
                pair = {name: row.get(name) for name in PAIR_COLUMNS}
                if isinstance(pair["json_diff"], dict):  # as a shadow record stores it
                    pair["json_diff"] = json.dumps(pair["json_diff"], sort_keys=True)
                key = tuple(pair.values())
                pairs.setdefault(key, pair)
                chances[key] = chances.get(key, 0.0) + share / len(part)
        weights = np.array(list(chances.values()))
        return cls(tuple(pairs[key] for key in chances), weights / weights.sum())

    def beyond(self, excess: float, held_to: Tolerance) -> Drawn:
        """Return these pairs departing `excess` more often per word at risk: each pair that
        does not depart departs instead with a chance of `excess` times its words at risk."""
        pairs: list[Row] = []
        chances: list[float] = []
        for pair, chance in zip(self.pairs, self.chances, strict=True):
            extra = 0.0 if departs(pair, held_to) else min(1.0, excess * (at_risk(pair) or 0))
            pairs += [pair, {**pair, **DEPARTING}]
            chances += [chance * (1 - extra), chance * extra]
        return Drawn(tuple(pairs), np.array(chances))

    def draw(self, rng: np.random.Generator, n: int) -> list[tuple[Row, int]]:
        """Draw `n` pairs; return each drawn pair and how many times."""
        if not n:
            return []
        counts = rng.multinomial(n, self.chances)
        return [(self.pairs[i], int(counts[i])) for i in np.flatnonzero(counts)]


@dataclass(frozen=True)
class Traffic:
    """One kind of traffic of a scenario (temperature 0, or sampled): the pairs its candidate's
    copies and the noise floor's are drawn from, and the rates they were measured at."""

    candidate: Drawn
    noise: Drawn
    rates: Rates


def traffic(
    scenario: Scenario,
    measured: Mapping[tuple[str, bool, float], Measured],
    is_sampled: bool,
    paraphrase: float | None = None,
) -> Traffic:
    """Return what a scenario's copies of one kind of traffic are drawn from, its rates measured
    against the tolerance of the embedding model's `paraphrase` similarity where declared."""
    clean = measured[(scenario.candidate, is_sampled, 0.0)].of_kinds(scenario.kinds)
    rates = clean.rates(paraphrase)
    candidate = Drawn.of((clean.candidate, 1.0))
    if scenario.harmful_rate:
        share = scenario.harmful_rate
        wrong = measured[(scenario.candidate, is_sampled, 1.0)].of_kinds(scenario.kinds)
        rates = mixed(rates, wrong.rates(paraphrase), share)
        candidate = Drawn.of((clean.candidate, 1 - share), (wrong.candidate, share))
    noise = Drawn.of((clean.noise, 1.0))
    if scenario.excess is not None:  # the quality null: exactly the margin above the floor
        rates = replace(
            rates,
            candidate=rates.noise + scenario.excess * rates.noise_words,
            candidate_exact=rates.noise_exact,
            candidate_words_departed=rates.noise_words,
            candidate_words_kept=rates.noise_words,
        )
        candidate = noise.beyond(scenario.excess, rates.tolerance)
    return Traffic(candidate, noise, rates)


def measure(
    fleet: str,
    seed: int,
    *,
    pairs_measured: int,
    samples: int,
    logs: Path | None,
    natural_lengths: bool = False,
    scenarios: Mapping[str, Scenario] | None = None,
) -> dict[tuple[str, bool, float], Measured]:
    """Measure every candidate the fleet's scenarios (or `scenarios`) name, at temperature 0
    and sampled.

    Keys: (candidate, sampled, harmful share). The simulated fleet measures the answers of a
    part that carries a harmful error (1.0) apart from its clean ones (0.0); a scenario mixes
    them at its share.
    """
    chosen = (SCENARIOS[fleet] if scenarios is None else scenarios).values()
    measured: dict[tuple[str, bool, float], Measured] = {}
    if fleet == "simulated":
        # As long as the real fleet's answers, so the two calibrations judge alike: a part's
        # chance to leave the reference's answer grows with the answer's length. Or the
        # simulator's own lengths, to see the judge on longer answers.
        lengths = () if natural_lengths else pairs.real_lengths()
        for s in chosen:
            for is_sampled in (False, True):
                for harmful in (0.0, 1.0) if s.harmful_rate else (0.0,):
                    if (s.candidate, is_sampled, harmful) not in measured:
                        temperature = pairs.SAMPLED_TEMPERATURE if is_sampled else 0.0
                        measured[(s.candidate, is_sampled, harmful)] = pairs.simulated(
                            s.candidate, temperature, pairs_measured, seed, harmful, lengths=lengths
                        )
        return measured
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    held_out = fleet == "held-out"
    named = {s.candidate for s in chosen}
    parts = {
        name: backend
        for name, backend in (pairs.HELD_OUT_PARTS if held_out else pairs.REAL_PARTS).items()
        if name in named
    }
    running = pairs.held_out_fleet(seed, logs, parts) if held_out else pairs.real_fleet(logs)
    lines = pairs.held_out_prompts(seed) if held_out else pairs.prompts()
    with running as urls:
        for is_sampled in (False, True):
            temperature = pairs.SAMPLED_TEMPERATURE if is_sampled else 0.0
            found = asyncio.run(
                pairs.real(urls, temperature, samples, seed, parts=parts, lines=lines)
            )
            for part, m in found.items():
                measured[(part, is_sampled, 0.0)] = m
    return measured


def mixed(clean: Rates, wrong: Rates, share: float) -> Rates:
    """Return the rates of a candidate whose answers carry a harmful error `share` of the time."""
    departing = (1 - share) * clean.candidate + share * wrong.candidate

    def words(clean_part: float, wrong_part: float, in_clean: float, in_wrong: float) -> float:
        """The mean words at risk of a part of the pairs, mixed as the pairs are."""
        weights = (1 - share) * clean_part, share * wrong_part
        total = sum(weights)
        return (weights[0] * in_clean + weights[1] * in_wrong) / total if total else 0.0

    return replace(
        clean,
        candidate=departing,
        candidate_exact=(1 - share) * clean.candidate_exact + share * wrong.candidate_exact,
        candidate_words_departed=words(
            clean.candidate,
            wrong.candidate,
            clean.candidate_words_departed,
            wrong.candidate_words_departed,
        ),
        candidate_words_kept=words(
            1 - clean.candidate,
            1 - wrong.candidate,
            clean.candidate_words_kept,
            wrong.candidate_words_kept,
        ),
    )


def calibrate(
    fleet: str = "simulated",
    runs: int = 100,
    seed: int = 0,
    *,
    pairs_measured: int = 1500,
    natural_lengths: bool = False,
    samples: int = 3,
    look_hours: float = 6.0,
    logs: Path | None = None,
    only: Sequence[str] = (),
) -> dict[str, Any]:
    """Run every scenario of `fleet` (those named in `only`, where given) `runs` times; return
    the rates the judge is held to."""
    criteria = Criteria()
    rng = np.random.default_rng(seed)
    unknown = sorted(set(only) - set(SCENARIOS[fleet]))
    if unknown:
        raise ValueError(
            f"no scenario {', '.join(unknown)} on the {fleet} fleet "
            f"(scenarios: {', '.join(SCENARIOS[fleet])})"
        )
    chosen = {name: s for name, s in SCENARIOS[fleet].items() if not only or name in only}
    measured = measure(
        fleet,
        seed,
        pairs_measured=pairs_measured,
        samples=samples,
        logs=logs,
        natural_lengths=natural_lengths,
        scenarios=chosen,
    )
    results: dict[str, Any] = {}
    # The held-out weeks read the paraphrase similarity the real fleet's policy declares for
    # all-MiniLM-L6-v2, as `make real`'s routes read it (`evidence.paraphrases`). The fit-set
    # weeks read none, as their thresholds were fitted: there the floor sets the tolerance, and
    # at the declared 0.83 fewer of the analog part's wrong facts depart (docs/promotion.md).
    paraphrase = pairs.real_paraphrase() if fleet == "held-out" else None
    for name, scenario in chosen.items():
        kinds = {
            is_sampled: traffic(scenario, measured, is_sampled, paraphrase)
            for is_sampled in (False, True)
        }
        rates = {is_sampled: t.rates for is_sampled, t in kinds.items()}
        outcomes: dict[str, int] = {}
        days = []
        decided_on = []
        for _ in range(runs):
            outcome, day, evidence = run(
                scenario, kinds, criteria, rng, look_hours=look_hours, paraphrase=paraphrase
            )
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            decided_on.append(evidence)
            if day is not None:
                days.append(day)
        results[name] = {
            "candidate": scenario.candidate,
            "truth": scenario.truth,
            "promote_rate": outcomes.get(PROMOTE, 0) / runs,
            "reject_rate": outcomes.get(REJECT, 0) / runs,
            "decide_rate": (outcomes.get(PROMOTE, 0) + outcomes.get(REJECT, 0)) / runs,
            "median_days_to_decision": float(np.median(days)) if days else None,
            "outcomes": outcomes,
            "days": scenario.days,
            "judged": judged(decided_on),
            "rates": {
                kind: rates[is_sampled].as_dict()
                for kind, is_sampled in (("temperature_0", False), ("sampled", True))
                if not is_sampled or scenario.sampled_share
            },
        }
    result = summary(fleet, results, runs=runs, seed=seed, look_hours=look_hours)
    if fleet == "held-out":
        # Every part on the questions answered by a number, at temperature 0: how many of the
        # reference's answers hold a digit, and how each part's answers compare with them.
        result["numbers"] = {
            part: measured[(part, False, 0.0)].of_kinds(NUMBERS).rates(paraphrase).as_dict()
            for part in pairs.HELD_OUT_PARTS
            if (part, False, 0.0) in measured
        }
    if fleet == "simulated":
        result["answer_lengths"] = "natural" if natural_lengths else "real"
    return result


def judged(decided_on: Sequence[Evidence]) -> dict[str, Any]:
    """Return what the judge read at the look each run was decided on (its last, where it
    held), the median over the runs: the copies, the share that failed, and each kind of
    traffic's departures per 1,000 words at risk, the candidate's and the floor's, with the
    tolerance the floor's copies gave (the first run's)."""

    def median(values: Sequence[float]) -> float:
        return float(np.median(values))

    read: dict[str, Any] = {
        "copies": median([e.sent for e in decided_on]),
        "failed_share": median([e.failures.candidate / e.sent for e in decided_on if e.sent]),
    }
    for kind, agreement in (("temperature_0", "greedy"), ("sampled", "sampled")):
        pairs = [getattr(e, agreement) for e in decided_on]
        if not any(a.compared for a in pairs):
            continue
        read[kind] = {
            "pairs": median([a.compared for a in pairs]),
            "candidate_per_1000_words": median(
                [1000 * a.departed / a.words for a in pairs if a.words]
            ),
            "noise_floor_per_1000_words": median(
                [1000 * a.noise_departed / a.noise_words for a in pairs if a.noise_words]
            ),
            "tolerance": pairs[0].tolerance,
        }
    return read


def target(name: str, truth: str) -> tuple[str, str, float]:
    return LOOSER.get(name, TARGETS[truth])


def summary(
    fleet: str, results: dict[str, Any], *, runs: int, seed: int, look_hours: float
) -> dict[str, Any]:
    def met(name: str) -> bool:
        key, sense, bound = target(name, results[name]["truth"])
        value = results[name][key]
        return value <= bound if sense == "<=" else value >= bound

    return {
        "fleet": fleet,
        "seed": seed,
        "runs_per_scenario": runs,
        "shadow_rate": SHADOW_RATE,
        "look_every_hours": look_hours,
        "targets": {
            name: " ".join(map(str, target(name, r["truth"]))) for name, r in results.items()
        },
        "targets_met": {name: met(name) for name in results},
        "scenarios": results,
    }


def headline(result: Mapping[str, Any]) -> list[str]:
    """Return a line per scenario: its decisions, days, and what the pairs measured."""
    lines = []
    for name, s in result["scenarios"].items():
        rates = s["rates"]["temperature_0"]
        accuracy = rates.get("candidate_accuracy")
        right = "" if accuracy is None else f", labelled accuracy {accuracy:.1%}"
        days = s["median_days_to_decision"]
        lines.append(
            f"{name} ({s['candidate']}, {s['truth']}): promote {s['promote_rate']:.0%}, reject "
            f"{s['reject_rate']:.0%}, median day {'-' if days is None else f'{days:.2f}'}; "
            f"departs {rates['candidate']:.2%} against the floor's {rates['noise_floor']:.2%}"
            f" ({_shown(rates['candidate_per_1000_words'])} against"
            f" {_shown(rates['noise_floor_per_1000_words'])} per 1,000 words at risk)"
            f"{right}; target {result['targets'][name]}: "
            f"{'met' if result['targets_met'][name] else 'NOT met'}"
        )
    return lines


def _shown(per_1000: float | None) -> str:
    return "-" if per_1000 is None else f"{per_1000:.3g}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.promotion", description=__doc__)
    parser.add_argument("--fleet", choices=sorted(SCENARIOS), default="simulated")
    parser.add_argument("--runs", type=int, default=100, help="runs per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=1500, help="simulated pairs per candidate")
    parser.add_argument("--samples", type=int, default=3, help="real: sampled answers a prompt")
    parser.add_argument("--logs", type=Path, help="real: where the engines' logs go")
    parser.add_argument(
        "--natural-lengths",
        action="store_true",
        help="simulated: answers of the simulator's own lengths, not the real fleet's",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        help="run this scenario (again for more), measuring only the parts they name; all if none",
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    result = calibrate(
        args.fleet,
        args.runs,
        args.seed,
        pairs_measured=args.pairs,
        samples=args.samples,
        logs=args.logs,
        natural_lengths=args.natural_lengths,
        only=args.scenario,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(headline(result)))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
