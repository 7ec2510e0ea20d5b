"""Calibrate the judge: realistic hardware, the gateway's own comparisons, weeks on a virtual clock.

A scenario is a candidate pool described the way the simulator describes hardware: its logit
noise (near-tie flips), its harmful rate (wrong facts or fields), the share of sampled traffic,
how often it misses the SLO where the primary meets it, and its cost against the primary, a bf16
GPU pool.

1. Pairs: `pairs` prompts are answered by the simulator's precision model (simulator/answers.py)
   on the primary, on the primary again (the noise floor) and on the candidate, with and without
   a harmful error, at temperature 0 and at the scenario's temperature, logprobs included. Each
   pair is read and compared by gateway/compare (exact match, ROUGE-L, near ties and KL from the
   logprobs, semantic similarity over windows of simulator embeddings) and held to its noise
   floor's tolerance by gateway/promotion/departures.py. That measures, per kind of traffic, how
   often a candidate pair departs in meaning (benign and harmful answers apart, mixed at the
   scenario's harmful rate) and how often a noise pair does.
2. Runs: shadow traffic at the conversation trace's rate (19,366 requests an hour), `SHADOW_RATE`
   of it copied to the candidate and a quarter of those to the noise floor; every `look_hours`
   the judge sees counts drawn at the measured rates and decides. A run's decision is the first
   promote or reject it says; a run that says neither by the end holds.

Scenarios: `aa` (the candidate is the primary's hardware at the same cost: never promote),
`benign_int8` (the simulator's int8 ASIC: many near-tie flips, no harmful errors), `harmful`
(the same flips and 0.5% harmful answers), `sampled` (the ASIC with 70% of traffic at
temperature 0.7, for 14 days), `worse_latency` (GPU-like answers, missing the SLO on 3% more
requests than the primary) and `good` (GPU-like answers, cheaper on 90% of requests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from random import Random
from typing import Any

import numpy as np

from gateway.compare.answers import Answer, TokenChoice
from gateway.compare.meaning import similarity, windows
from gateway.compare.measures import MEASURES, compare
from gateway.promotion.departures import departs, tolerance
from gateway.promotion.judge import PROMOTE, REJECT, Criteria, Evidence, judge
from simulator.answers import Answer as SimulatedAnswer
from simulator.answers import Question, compose
from simulator.embeddings import embed
from simulator.profile import load_profile

REQUESTS_PER_HOUR = 19_366
SHADOW_RATE = 0.05
NOISE_SHARE = 0.25
ERROR_RATE = 0.002
TOP_LOGPROBS = 5
# Pairs judged against the SLO: the share where only one side misses, load spikes and slow
# prompts that either pool can meet or miss (the rest both meet, or both miss).
ONLY_PRIMARY_MISSES = ONLY_CANDIDATE_MISSES = 0.002
BOTH_MISS = 0.005
MODEL = "llama-3.1-8b-instruct"
EMBEDDING = ("bge-large-en-v1.5", 1024)


@dataclass(frozen=True)
class Scenario:
    """A candidate pool as hardware and traffic, and how long the judge watches it."""

    candidate: str  # a simulator profile: its logit noise
    harmful_rate: float = 0.0
    sampled_share: float = 0.0
    temperature: float = 0.7
    slo_loss: float = 0.0  # share of requests where only the candidate misses, beyond noise
    cheaper: float = 0.9
    days: float = 7.0


SCENARIOS = {
    "aa": Scenario("gpu", cheaper=0.5),
    "benign_int8": Scenario("asic"),
    "harmful": Scenario("asic", harmful_rate=0.005),
    "sampled": Scenario("asic", sampled_share=0.7, days=14.0),
    "worse_latency": Scenario("gpu", slo_loss=0.03),
    "good": Scenario("gpu"),
}
# Scenarios a sound judge never promotes, and the ones it should.
MUST_NOT_PROMOTE = ("aa", "harmful", "worse_latency")
TARGETS = {
    "aa": ("promote_rate", "<=", 0.05),
    "benign_int8": ("promote_rate", ">=", 0.90),
    "harmful": ("promote_rate", "<=", 0.05),
    "sampled": ("promote_rate", ">=", 0.80),
    "good": ("promote_rate", ">=", 0.90),
    "worse_latency": ("promote_rate", "<=", 0.05),
}


@dataclass(frozen=True)
class Rates:
    """Measured chances, for one kind of traffic, that a pair departs (and matches exactly)."""

    candidate: float  # a candidate answer without a harmful error
    harmful: float  # a candidate answer with one
    noise: float  # a noise-floor pair
    candidate_exact: float
    noise_exact: float
    tolerance: str

    def departing(self, harmful_rate: float) -> float:
        """Chance that a candidate pair departs when `harmful_rate` of its answers are harmful."""
        return (1 - harmful_rate) * self.candidate + harmful_rate * self.harmful


def _noise(profile: str) -> float:
    return load_profile(profile).precision.logit_noise


def _read(answer: SimulatedAnswer) -> Answer:
    """Read a simulated answer as the gateway reads a response with logprobs."""
    tokens = tuple(
        TokenChoice(entry.token, entry.logprob, entry.top) for entry in answer.logprobs or ()
    )
    return Answer(text=answer.text, tokens=tokens)


def _embedded(text: str) -> list[list[float]]:
    model, dimensions = EMBEDDING
    return [embed(model, window, dimensions, noise=0.0, rng=Random(0)) for window in windows(text)]


def _pair(primary: SimulatedAnswer, other: SimulatedAnswer) -> dict[str, Any]:
    """Compare two answers as the mirror does; return the measures a shadow record holds."""
    diff = compare(_read(primary), _read(other))
    diff.semantic_similarity = similarity(_embedded(primary.text), _embedded(other.text))
    return {**{name: getattr(diff, name) for name in MEASURES}, "candidate_error": None}


@cache
def measure(candidate: str, temperature: float, pairs: int, seed: int) -> Rates:
    """Answer `pairs` prompts on the primary, its noise floor and the candidate; measure."""
    rng = Random(seed)
    primary_noise, candidate_noise = _noise("gpu"), _noise(candidate)
    floor, benign, wrong = [], [], []
    for i in range(pairs):
        question = Question(
            MODEL,
            f"calibration {seed} {i}",
            limit=1000,
            temperature=temperature,
            top_logprobs=TOP_LOGPROBS,
        )

        primary, again, right, wrong_answer = (
            compose(question, noise=noise, harmful_rate=harmful, rng=rng)
            for noise, harmful in (
                (primary_noise, 0.0),
                (primary_noise, 0.0),
                (candidate_noise, 0.0),
                (candidate_noise, 1.0),
            )
        )
        floor.append(_pair(primary, again))
        benign.append(_pair(primary, right))
        wrong.append(_pair(primary, wrong_answer))
    held_to = tolerance(floor)

    def share(rows: Sequence[dict[str, Any]], test: Callable[[dict[str, Any]], bool]) -> float:
        return sum(map(test, rows)) / len(rows)

    return Rates(
        candidate=share(benign, lambda r: departs(r, held_to)),
        harmful=share(wrong, lambda r: departs(r, held_to)),
        noise=share(floor, lambda r: departs(r, held_to)),
        candidate_exact=share(benign, lambda r: bool(r["exact_match"])),
        noise_exact=share(floor, lambda r: bool(r["exact_match"])),
        tolerance=held_to.describe(),
    )


def run(
    scenario: Scenario,
    rates: dict[bool, Rates],
    criteria: Criteria,
    rng: np.random.Generator,
    *,
    look_hours: float,
) -> tuple[str, float | None]:
    """Simulate one candidate's shadow stream; return its decision and the day it came."""
    e = Evidence("chat", "candidate", first_ts=0.0)
    per_look = REQUESTS_PER_HOUR * SHADOW_RATE * look_hours
    only_candidate_misses = ONLY_CANDIDATE_MISSES + scenario.slo_loss
    cells = [  # (primary met, candidate met): chances
        ONLY_PRIMARY_MISSES,
        only_candidate_misses,
        BOTH_MISS,
        1 - ONLY_PRIMARY_MISSES - only_candidate_misses - BOTH_MISS,
    ]
    for look in range(1, int(scenario.days * 24 / look_hours) + 1):
        n = int(rng.poisson(per_look))
        errors = int(rng.binomial(n, ERROR_RATE))
        ok = n - errors
        e.sent += n
        e.errors += errors
        sampled = int(rng.binomial(ok, scenario.sampled_share))
        noise = int(rng.binomial(ok, NOISE_SHARE))
        noise_sampled = int(rng.binomial(noise, scenario.sampled_share))
        for is_sampled, count, floor in (
            (False, ok - sampled, noise - noise_sampled),
            (True, sampled, noise_sampled),
        ):
            if not count:
                continue
            r = rates[is_sampled]
            a = e.sampled if is_sampled else e.greedy
            a.compared += count
            a.departed += int(rng.binomial(count, r.departing(scenario.harmful_rate)))
            a.exact += int(rng.binomial(count, r.candidate_exact * (1 - scenario.harmful_rate)))
            a.noise_compared += floor
            a.noise_departed += int(rng.binomial(floor, r.noise))
            a.noise_exact += int(rng.binomial(floor, r.noise_exact))
            a.tolerance = r.tolerance
        e.priced += ok
        e.cheaper += int(rng.binomial(ok, scenario.cheaper))
        drawn = rng.multinomial(ok, cells)
        primary_missed, candidate_missed, neither = int(drawn[0]), int(drawn[1]), int(drawn[3])
        e.slo.pairs += ok
        e.slo.only_candidate += primary_missed
        e.slo.only_primary += candidate_missed
        e.slo.primary_met += candidate_missed + neither
        e.slo.candidate_met += primary_missed + neither
        now = look * look_hours * 3600
        outcome = judge(e, criteria, now).outcome
        if outcome in (PROMOTE, REJECT):
            return outcome, now / 86400
    return "hold", None


def calibrate(
    runs: int = 200,
    seed: int = 0,
    *,
    pairs: int = 1500,
    look_hours: float = 6.0,
    scenarios: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run every scenario `runs` times; return the rates the judge is held to."""
    criteria = Criteria()
    rng = np.random.default_rng(seed)
    chosen = {name: SCENARIOS[name] for name in scenarios or SCENARIOS}
    results: dict[str, Any] = {}
    for name, scenario in chosen.items():
        rates = {
            False: measure(scenario.candidate, 0.0, pairs, seed),
            True: measure(scenario.candidate, scenario.temperature, pairs, seed)
            if scenario.sampled_share
            else measure(scenario.candidate, 0.0, pairs, seed),
        }
        outcomes: dict[str, int] = {}
        days = []
        for _ in range(runs):
            outcome, day = run(scenario, rates, criteria, rng, look_hours=look_hours)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if day is not None:
                days.append(day)
        results[name] = {
            "promote_rate": outcomes.get(PROMOTE, 0) / runs,
            "reject_rate": outcomes.get(REJECT, 0) / runs,
            "median_days_to_decision": float(np.median(days)) if days else None,
            "outcomes": outcomes,
            "days": scenario.days,
            "departure_rates": {
                kind: {
                    "candidate": rates[is_sampled].departing(scenario.harmful_rate),
                    "noise_floor": rates[is_sampled].noise,
                    "candidate_exact_match": rates[is_sampled].candidate_exact,
                    "noise_exact_match": rates[is_sampled].noise_exact,
                    "tolerance": rates[is_sampled].tolerance,
                }
                for kind, is_sampled in (("temperature_0", False), ("sampled", True))
                if not is_sampled or scenario.sampled_share
            },
        }
    return _summary(results, runs=runs, pairs=pairs, look_hours=look_hours)


def _summary(
    results: dict[str, Any], *, runs: int, pairs: int, look_hours: float
) -> dict[str, Any]:
    def met(name: str) -> bool | None:
        if name not in results:
            return None
        key, sense, bound = TARGETS[name]
        value = results[name][key]
        return value <= bound if sense == "<=" else value >= bound

    bad = [results[name]["promote_rate"] for name in MUST_NOT_PROMOTE if name in results]
    worse = [
        1 - results[name]["promote_rate"]
        for name in ("harmful", "worse_latency")
        if name in results
    ]
    return {
        "runs_per_scenario": runs,
        "pairs_measured": pairs,
        "shadow_rate": SHADOW_RATE,
        "look_every_hours": look_hours,
        "false_promotion_rate": max(bad) if bad else None,
        "power_reject_worse": min(worse) if worse else None,
        "power_promote_good": results["good"]["promote_rate"] if "good" in results else None,
        "targets": {
            name: f"{key} {sense} {bound}" for name, (key, sense, bound) in TARGETS.items()
        },
        "targets_met": {name: met(name) for name in TARGETS if name in results},
        "scenarios": results,
    }
