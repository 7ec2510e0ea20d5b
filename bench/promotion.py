"""Calibrate the judge: measured pairs of answers, weeks of shadow traffic on a virtual clock.

    python -m bench.promotion --fleet real --seed 0 --out docs/results/promotion-real-seed0.json
    python -m bench.promotion --fleet simulated --seed 0 --out docs/results/promotion-seed0.json
    python -m bench.promotion --fleet simulated --natural-lengths --seed 0 --out R.json

1. Pairs (bench/pairs.py): each candidate's answers and the noise floor's, compared as the mirror
   compares shadow copies, at temperature 0 and sampled at 0.7; on the real fleet with every
   labelled answer marked right or wrong.
2. Weeks: shadow traffic at the conversation trace's rate (19,366 requests an hour), 5% of it
   copied to the candidate and a quarter of those to the noise floor, 0.2% of copies failing;
   every 6 hours the judge (gateway/promotion/judge.py) decides on counts drawn at the measured
   rates: how many pairs depart, and the words at risk of those that do and those that do not
   at their measured means. A run's decision is the first promote or reject it says; one that
   says neither holds.

Every scenario's candidate is cheaper on 90% of requests and meets the SLO as the primary does
(but `worse_latency`), so that quality alone decides. The quality null is a candidate that
departs exactly `departure_margin` more often per word at risk than the noise floor, over as
many words per pair: the most a judge may let through, so it must promote it at most alpha of
the time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import pairs
from bench.pairs import Rates
from gateway.promotion.judge import PROMOTE, REJECT, Criteria, Evidence, judge
from simulator.profile import load_profile

REQUESTS_PER_HOUR = 19_366
SHADOW_RATE = 0.05
NOISE_SHARE = 0.25
ERROR_RATE = 0.002
# Pairs judged against the SLO: the share where only one side misses, load spikes and slow
# prompts that either pool can meet or miss (the rest both meet, or both miss).
ONLY_PRIMARY_MISSES = ONLY_CANDIDATE_MISSES = 0.002
BOTH_MISS = 0.005


@dataclass(frozen=True)
class Scenario:
    """A candidate, its traffic, how long the judge watches it, and what a sound judge says."""

    candidate: str  # a simulator profile (simulated) or a part of bench.pairs.REAL_PARTS (real)
    truth: str  # "promote", "reject" or "not promote"
    harmful_rate: float = 0.0  # simulated: the share of its answers with a harmful error
    excess: float | None = None  # the quality null: departs this much per word above the floor
    sampled_share: float = 0.0
    slo_loss: float = 0.0  # share of requests where only the candidate misses, beyond noise
    cheaper: float = 0.9
    days: float = 7.0


DEPARTURE_MARGIN = Criteria().departure_margin
# The simulated analog part, fit to the real one (bench/precision_fit.py).
CIM_HARMFUL_RATE = load_profile("cim").precision.harmful_rate
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
    rates: Mapping[bool, Rates],
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
        # A copy that errs fails where the primary's answer did not (the primary's failed).
        e.failures.pairs += n
        e.failures.candidate += errors
        e.failures.only_candidate += errors
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
            if scenario.excess is None:
                departed, words = _drawn(
                    rng, count, r.candidate, r.candidate_words_departed, r.candidate_words_kept
                )
            else:  # the floor's words per pair, departing the margin more often per word
                words = round(count * r.noise_words)
                departed = int(rng.binomial(words, r.noise / r.noise_words + scenario.excess))
            noise_departed, noise_words = _drawn(
                rng, floor, r.noise, r.noise_words_departed, r.noise_words_kept
            )
            a.compared += count
            a.departed += departed
            a.words += words
            a.exact += int(rng.binomial(count, r.candidate_exact))
            a.noise_compared += floor
            a.noise_departed += noise_departed
            a.noise_words += noise_words
            a.noise_exact += int(rng.binomial(floor, r.noise_exact))
            a.tolerance = r.tolerance.describe()
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


def _drawn(
    rng: np.random.Generator, pairs: int, departing: float, departed: float, kept: float
) -> tuple[int, int]:
    """Draw how many of `pairs` depart; return them and the pairs' words at risk."""
    count = int(rng.binomial(pairs, departing))
    return count, round(count * departed + (pairs - count) * kept)


def measure(
    fleet: str,
    seed: int,
    *,
    pairs_measured: int,
    samples: int,
    logs: Path | None,
    natural_lengths: bool = False,
) -> dict[tuple[str, bool, float], Rates]:
    """Measure every candidate the fleet's scenarios name, at temperature 0 and sampled.

    Keys: (candidate, sampled, harmful rate). The simulated fleet measures answers with and
    without a harmful error apart and mixes their rates at the scenario's share.
    """
    chosen = SCENARIOS[fleet].values()
    measured: dict[tuple[str, bool, float], Rates] = {}
    if fleet == "simulated":
        # As long as the real fleet's answers, so the two calibrations judge alike: a part's
        # chance to leave the reference's answer grows with the answer's length. Or the
        # simulator's own lengths, to see the judge on longer answers.
        lengths = () if natural_lengths else pairs.real_lengths()
        answered: dict[tuple[str, bool, float], Rates] = {}

        def rates(candidate: str, is_sampled: bool, harmful: float) -> Rates:
            if (candidate, is_sampled, harmful) not in answered:
                temperature = pairs.SAMPLED_TEMPERATURE if is_sampled else 0.0
                m = pairs.simulated(
                    candidate, temperature, pairs_measured, seed, harmful, lengths=lengths
                )
                answered[(candidate, is_sampled, harmful)] = m.rates()
            return answered[(candidate, is_sampled, harmful)]

        for s in chosen:
            for is_sampled in (False, True):
                clean = rates(s.candidate, is_sampled, 0.0)
                measured[(s.candidate, is_sampled, s.harmful_rate)] = (
                    mixed(clean, rates(s.candidate, is_sampled, 1.0), s.harmful_rate)
                    if s.harmful_rate
                    else clean
                )
        return measured
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    with pairs.real_fleet(logs) as urls:
        for is_sampled in (False, True):
            temperature = pairs.SAMPLED_TEMPERATURE if is_sampled else 0.0
            found = asyncio.run(pairs.real(urls, temperature, samples, seed))
            for part, m in found.items():
                measured[(part, is_sampled, 0.0)] = m.rates()
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
) -> dict[str, Any]:
    """Run every scenario of `fleet` `runs` times; return the rates the judge is held to."""
    criteria = Criteria()
    rng = np.random.default_rng(seed)
    measured = measure(
        fleet,
        seed,
        pairs_measured=pairs_measured,
        samples=samples,
        logs=logs,
        natural_lengths=natural_lengths,
    )
    results: dict[str, Any] = {}
    for name, scenario in SCENARIOS[fleet].items():
        rates = {
            is_sampled: measured[(scenario.candidate, is_sampled, scenario.harmful_rate)]
            for is_sampled in (False, True)
        }
        if scenario.excess is not None:  # the quality null: exactly the margin above the floor
            rates = {
                k: replace(
                    r,
                    candidate=r.noise + scenario.excess * r.noise_words,
                    candidate_exact=r.noise_exact,
                    candidate_words_departed=r.noise_words,
                    candidate_words_kept=r.noise_words,
                )
                for k, r in rates.items()
            }
        outcomes: dict[str, int] = {}
        days = []
        for _ in range(runs):
            outcome, day = run(scenario, rates, criteria, rng, look_hours=look_hours)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
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
            "rates": {
                kind: rates[is_sampled].as_dict()
                for kind, is_sampled in (("temperature_0", False), ("sampled", True))
                if not is_sampled or scenario.sampled_share
            },
        }
    result = summary(fleet, results, runs=runs, seed=seed, look_hours=look_hours)
    if fleet == "simulated":
        result["answer_lengths"] = "natural" if natural_lengths else "real"
    return result


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
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(headline(result)))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
