"""How the real fleet's parts leave the reference's answer: the figures the simulator is fit to.

    python -m bench.precision_fit --out docs/results/precision-fit.json

Asks the labelled suite and the stories once at temperature 0 of the reference (gpu-0), its
replica and every candidate part (bench/pairs.py), and measures, per part and kind of prompt:

- the flip rate: answers that differ from the reference's, per token at risk (the reference's
  tokens up to and including the first that differs; all of them when none does), the
  maximum-likelihood per-token rate of a part that decodes along the reference until it flips;
  the benign flip rate counts only the flips that turned no labelled answer wrong, the rate the
  simulator's noise is fit to (it makes wrong answers apart, as harmful errors);
- divergence after a flip: of the differing answers, how many words still agree (ROUGE-L),
  their semantic similarity, and how many depart at the default tolerance;
- the shape of a harmful error: of the labelled answers turned wrong, where the first
  differing token is, and how similar the wrong answer stays.

- the KL of a flip: KL(reference || part) per token up to the first differing token, of the
  flips that left every answer right, which the judge's benign rule reads
  (gateway/promotion/departures.py: a near tie at a KL of at most `NEAR_TIE_KL` is forgiven).

The simulator's precision model (simulator/precision.py, docs/simulator.md) takes its figures
from this file: `fit` gives each profile the logit noise at which it flips as often as the part
it stands for, and the drift at which its flips come at the part's median KL; and
tests/bench/test_precision_fit.py holds the simulator, answering prompts of the real answers'
lengths, within `ALPHA` intervals of every figure. A part with fewer than `MIN_FLIPS` flips here
(Q8_0 flips once in the 280 prompts) takes its flips' KL from the near-tie fit's thousand
prompts (docs/results/near-tie-fit.json, the same engines on the shipped suites).

How sure the model is when it samples is fit apart, to the real fleet's sampled calibration
pairs (docs/results/promotion-real-seed0.json), with no engine running:

    python -m bench.precision_fit --sampling

`sampling_fit` gives the sureness (simulator/precision.py, `SAMPLING_SURENESS`) at which two
simulated answers sampled at 0.7, as long as the real ones, match as often as the real
reference's and its replica's do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from random import Random
from typing import Any

import httpx

from bench import pairs
from gateway.compare.answers import TokenChoice
from gateway.compare.measures import mean_top_k_kl
from gateway.promotion.departures import NEAR_TIE_KL, Tolerance, benign, departs
from gateway.promotion.judge import bernoulli_interval
from gateway.promotion.precision.check import Endpoint, ask, measure_pair
from gateway.promotion.precision.labels import states
from realfleet import fleet
from simulator.answers import Question, compose
from simulator.precision import SAMPLING_SURENESS, flip_chance
from simulator.profile import load_profile
from simulator.words import concept

Row = dict[str, Any]
PARTS = {"f16 replica": pairs.REPLICA, **{k: v for k, v in pairs.REAL_PARTS.items() if k != "f16"}}
# The part each simulator profile stands for.
STANDS_FOR = {"gpu": "f16 replica", "asic": "q8_0", "cim": "analog"}
ALPHA = 1e-3
REAL_CALIBRATION = pairs.PRECISION_FIT.parent / "promotion-real-seed0.json"
NEAR_TIE_FIT = pairs.PRECISION_FIT.parent / "near-tie-fit.json"
MIN_FLIPS = 10  # fewer flips' KL than this is not a median to fit to


async def answered(urls: Mapping[str, str], concurrency: int = 4) -> dict[str, list[Row]]:
    """Ask every prompt once of the reference and each part; return each part's pairs."""
    lines = pairs.prompts()
    gate = asyncio.Semaphore(concurrency)
    found: dict[str, list[Row]] = {part: [] for part in PARTS}
    embedder = Endpoint("embed", urls[pairs.EMBEDDER])
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(line: Mapping[str, Any]) -> None:
            async with gate:
                names = [pairs.REFERENCE, *PARTS.values()]
                replies = await asyncio.gather(
                    *(
                        ask(
                            client,
                            Endpoint(name, urls[name]),
                            "/v1/chat/completions",
                            pairs.body(line, 0.0, 0),
                        )
                        for name in names
                    )
                )
                reference, *others = replies
                if reference.answer is None:
                    raise RuntimeError(f"the reference failed a prompt: {reference.error}")
                expected = line.get("expected")
                for part, reply in zip(PARTS, others, strict=True):
                    row, _ = await measure_pair(
                        client, embedder, fleet.EMBEDDING_MODEL, reference.answer, reply
                    )
                    row["kind"] = line.get("kind", "")
                    row["reference_tokens"] = len(reference.answer.tokens)
                    if not row["exact_match"]:  # what leaving the reference looks like
                        row["reference_text"] = reference.answer.text
                        row["text"] = reply.answer.text if reply.answer else None
                    if expected is not None:
                        text = reply.answer.text if reply.answer else None
                        row["reference_right"] = states(reference.answer.text or "", expected)
                        row["right"] = states(text or "", expected)
                    found[part].append(row)

        await asyncio.gather(*(one(line) for line in lines))
    return found


def at_risk(row: Row) -> int:
    """The reference's tokens a part decoded before it flipped (the flip included)."""
    if row["exact_match"] or row["token_divergence"] is None:
        return int(row["reference_tokens"])
    return min(int(row["token_divergence"]) + 1, int(row["reference_tokens"]))


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    """Flip rate, divergence after a flip and the shape of wrong answers, for some pairs."""
    differing = [r for r in rows if not r["exact_match"]]
    tokens = sum(map(at_risk, rows))
    wrong = [r for r in rows if r.get("reference_right") and r.get("right") is False]

    def median(values: Sequence[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    return {
        "answers": len(rows),
        "reference_tokens": sum(int(r["reference_tokens"]) for r in rows),
        "tokens_at_risk": tokens,
        "differing": len(differing),
        "flip_rate_per_token": len(differing) / tokens if tokens else None,
        "differing_departed": sum(departs(r, Tolerance()) for r in differing),
        "differing_rouge_l_median": median([r["similarity"] for r in differing]),
        "differing_similarity_median": median([r["semantic_similarity"] for r in differing]),
        "first_differing_token_median": median([r["token_divergence"] for r in differing]),
        "labelled": sum(r.get("right") is not None for r in rows),
        "turned_wrong": len(wrong),
        "turned_wrong_similarity_max": max(
            (r["semantic_similarity"] for r in wrong if r["semantic_similarity"] is not None),
            default=None,
        ),
        "turned_wrong_first_token_median": median([r["token_divergence"] for r in wrong]),
        "differing_forgiven": sum(benign(r) for r in differing),
        "benign_flip_kl_median": median(flip_kl(rows)),
    }


def flip_kl(rows: Sequence[Row]) -> list[float]:
    """The KL up to the first differing token of the flips that turned no labelled answer
    wrong (where measured)."""
    return [
        float(r["kl_divergence"])
        for r in rows
        if not r["exact_match"]
        and r.get("kl_divergence") is not None
        and not (r.get("reference_right") and r.get("right") is False)
    ]


def interval(events: int, trials: int) -> tuple[float, float]:
    """The range a rate of `events` in `trials` holds the simulator's within (1 - ALPHA)."""
    return bernoulli_interval(events, trials, ALPHA)


def content_share(answers: int = 2000) -> float:
    """The share of the simulator's prose tokens that are content words (the ones that flip)."""
    rng = Random(0)
    content = tokens = 0
    for i in range(answers):
        answer = compose(
            Question("m", f"share {i}", limit=1000, temperature=0),
            noise=0.0,
            harmful_rate=0.0,
            rng=rng,
        )
        tokens += answer.completion_tokens
        content += sum(concept(piece.strip()) is not None for piece in answer.pieces)
    return content / tokens


def noise_for(rate: float, share: float) -> float:
    """Return the logit noise at which prose flips `rate` of its tokens (bisection)."""
    low, high = 0.0, 10.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if flip_chance(mid) * share < rate else (low, mid)
    return (low + high) / 2


def flips_kl(result: Mapping[str, Any], part: str) -> tuple[list[float], str]:
    """Return the KL of a part's benign flips, and where it was measured: here, or the near-tie
    fit's prompts when this suite has fewer than `MIN_FLIPS` of them."""
    found = flip_kl(result["parts"][part]["differing"])
    if len(found) >= MIN_FLIPS:
        return found, "precision-fit.json"
    by_part = json.loads(NEAR_TIE_FIT.read_text())["by_part"] if NEAR_TIE_FIT.exists() else {}
    if part in by_part and len(by_part[part]["near_tie_kl"]) > len(found):
        return [float(v) for v in by_part[part]["near_tie_kl"]], "near-tie-fit.json"
    return found, "precision-fit.json"


def simulated_kl(noise: float, drift: float, lengths: Sequence[int], rounds: int = 2) -> float:
    """Return the median KL (per token, up to the first difference) between the noiseless
    reference and a device of `noise` and `drift`, over answers of `lengths`, `rounds` times."""
    rng = Random(0)
    found: list[float] = []
    for k in range(rounds):
        for i, length in enumerate(lengths):
            question = Question(
                "m", f"drift {k} {i}", limit=length, ignore_eos=True, temperature=0, top_logprobs=5
            )
            one = compose(question, noise=0.0, harmful_rate=0.0, rng=rng)
            two = compose(question, noise=noise, drift=drift, harmful_rate=0.0, rng=rng)
            kl = mean_top_k_kl(_choices(one), _choices(two))
            if kl is not None:
                found.append(kl)
    return statistics.median(found)


def _choices(answer: Any) -> tuple[TokenChoice, ...]:
    return tuple(TokenChoice(e.token, e.logprob, e.top) for e in answer.logprobs or ())


def drift_for(kl: float, noise: float, lengths: Sequence[int]) -> float:
    """Return the drift at which a device of `noise` reaches the median KL `kl` (bisection on
    a log scale): the drift is drawn apart from the flips, so every answer measures it."""
    if kl <= 0:
        return 0.0
    low, high = math.log(kl / 100), math.log(kl * 100)
    for _ in range(20):
        mid = (low + high) / 2
        low, high = (mid, high) if simulated_kl(noise, math.exp(mid), lengths) < kl else (low, mid)
    return math.exp((low + high) / 2)


def fit(result: Mapping[str, Any]) -> dict[str, Any]:
    """Return, per profile, the part's figures with their intervals and the noise and drift
    that fit."""
    share = content_share()
    fitted: dict[str, Any] = {}
    for profile, part in STANDS_FOR.items():
        s = result["parts"][part]["all"]
        precision = load_profile(profile).precision
        kls, source = flips_kl(result, part)
        kl = statistics.median(kls) if kls else 0.0
        forgiven = sum(v <= NEAR_TIE_KL for v in kls)
        # A wrong answer is a flip at the fact's token; the simulator makes those apart (its
        # harmful errors), so its noise is fit to the flips that left every answer right.
        benign = s["differing"] - s["turned_wrong"]
        rate = benign / s["tokens_at_risk"]
        fitted[profile] = {
            "stands_for": part,
            "flip_rate_per_token": s["flip_rate_per_token"],
            "benign_flip_rate_per_token": rate,
            "benign_flip_rate_interval": interval(benign, s["tokens_at_risk"]),
            "fitted_logit_noise": noise_for(rate, share),
            "logit_noise": precision.logit_noise,
            "turned_wrong_share": s["turned_wrong"] / s["labelled"],
            "turned_wrong_interval": interval(s["turned_wrong"], s["labelled"]),
            "harmful_rate": precision.harmful_rate,
            "differing_departed_interval": interval(s["differing_departed"], s["differing"]),
            "flip_kl_source": source,
            "flip_kl_flips": len(kls),
            "flip_kl_median": kl,
            "flip_kl_range": [min(kls), max(kls)] if kls else None,
            "flip_kl_within_limit_interval": interval(forgiven, len(kls)) if kls else [0.0, 1.0],
            "fitted_drift": drift_for(kl, precision.logit_noise, result["lengths"]),
            "drift": precision.drift,
        }
    return {"content_share": share, "alpha": ALPHA, "profiles": fitted}


def sampled_exact_match(sureness: float, lengths: Sequence[int], rounds: int = 10) -> float:
    """Return the share of prompts on which two answers sampled at 0.7 with `sureness` match,
    each prompt as long as `lengths` says, `rounds` times over."""
    # Sampling divides the logits by the temperature and multiplies them by the sureness, so a
    # sureness is tried as the temperature that gives the same draws under the simulator's own.
    temperature = pairs.SAMPLED_TEMPERATURE * SAMPLING_SURENESS / sureness
    rng = Random(0)
    same = 0
    for k in range(rounds):
        for i, length in enumerate(lengths):
            question = Question(
                "m", f"sampling {k} {i}", limit=length, ignore_eos=True, temperature=temperature
            )
            one, two = (compose(question, noise=0.0, harmful_rate=0.0, rng=rng) for _ in range(2))
            same += one.text == two.text
    return same / (rounds * len(lengths))


def sureness_for(exact: float, lengths: Sequence[int]) -> float:
    """Return the sampling sureness at which sampled answers match `exact` of the time."""
    low, high = 1.0, 100.0
    for _ in range(14):
        mid = (low + high) / 2
        low, high = (mid, high) if sampled_exact_match(mid, lengths) < exact else (low, mid)
    return (low + high) / 2


def sampling_fit() -> dict[str, Any]:
    """Return the real fleet's sampled pairs' exact match, its interval, and the sureness that
    fits it on answers of the real lengths."""
    sampled = json.loads(REAL_CALIBRATION.read_text())["scenarios"]["sampled"]["rates"]["sampled"]
    pairs_measured = int(sampled["noise_pairs"])
    matched = round(sampled["noise_exact_match"] * pairs_measured)
    lengths = pairs.real_lengths()
    return {
        "noise_exact_match": matched / pairs_measured,
        "noise_exact_match_interval": interval(matched, pairs_measured),
        "fitted_sampling_sureness": sureness_for(matched / pairs_measured, lengths),
        "sampling_sureness": SAMPLING_SURENESS,
    }


def measure(logs: Path | None = None) -> dict[str, Any]:
    """Start the real fleet, ask the suite, and summarise each part: prose and facts apart."""
    with pairs.real_fleet(logs) as urls:
        found = asyncio.run(answered(urls))
    reference = next(iter(found.values()))
    result: dict[str, Any] = {
        "lengths": [int(r["reference_tokens"]) for r in reference],  # the reference's, in order
        "parts": {},
    }
    for part, rows in found.items():
        facts = [r for r in rows if r["kind"] != "story"]
        stories = [r for r in rows if r["kind"] == "story"]
        result["parts"][part] = {
            "all": summary(rows),
            "facts": summary(facts),
            "stories": summary(stories),
            "differing": [r for r in rows if not r["exact_match"]],
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--logs", type=Path, default=None)
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="fit how sure sampling is to the real fleet's stored sampled pairs, and print it",
    )
    args = parser.parse_args(argv)
    if args.sampling:
        print(json.dumps(sampling_fit(), indent=1))
        return 0
    if args.out is None:
        parser.error("--out is required to measure the real fleet")
    result = measure(args.logs)
    result["fit"] = fit(result)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for part, kinds in result["parts"].items():
        for kind in ("facts", "stories", "all"):
            s = kinds[kind]
            print(
                f"{part:12} {kind:8} differ {s['differing']:3}/{s['answers']:3}"
                f"  per token {s['flip_rate_per_token']:.2e}  departed {s['differing_departed']}"
                f"  rouge {s['differing_rouge_l_median']}  sim {s['differing_similarity_median']}"
                f"  wrong {s['turned_wrong']}/{s['labelled']}"
            )
    for profile, f in result["fit"]["profiles"].items():
        print(
            f"{profile:5} stands for {f['stands_for']:12} fitted logit noise"
            f" {f['fitted_logit_noise']:.4f} (profile {f['logit_noise']}); drift"
            f" {f['fitted_drift']:.2e} (profile {f['drift']}) for its flips' median KL"
            f" {f['flip_kl_median']:.2e}; turned wrong"
            f" {f['turned_wrong_share']:.3f} (profile harmful rate {f['harmful_rate']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
