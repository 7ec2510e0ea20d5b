"""Where a precision check's departure rate is set: the real fleet's parts swept in read noise.

    python -m bench.departure_limit --out docs/results/departure-limit.json

An unlabelled suite can only say how often a part's answers leave the reference's in meaning
(gateway/promotion/precision/rates.py: departures per word at risk); a labelled one says how
many it turns wrong. This sweep ties the two on the real fleet: the trained model with analog
read noise at a range of signal-to-noise ratios (realfleet/weights.py, each at several noise
seeds), and the Q8_0 part, answer the labelled suite and the stories at temperature 0 beside
the f16 reference, each pair measured and judged as a check judges it (the fleet's embedding
model, the default tolerance). For each part: its departures per word at risk, and the share
of labelled questions it turns wrong where the reference is right.

The limit is the departure rate at which parts begin to turn more labelled answers wrong than
the check allows (`limits.MAX_TURNED_WRONG`): the rates of the parts on either side of it,
interpolated on a log scale in the turned-wrong share. An unlabelled suite then holds a part
to the departure rate of a part that the labels would just fail.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench import pairs
from gateway.compare.measures import tokens
from gateway.promotion.departures import Tolerance, departs, words_at_risk
from gateway.promotion.precision.check import Endpoint, ask, measure_pair
from gateway.promotion.precision.labels import states
from gateway.promotion.precision.limits import MAX_TURNED_WRONG
from gateway.promotion.precision.rates import Rate
from realfleet import corpus, engine, fleet, weights

SNRS_DB = (16.0, 14.0, 12.0, 11.0, 10.0, 9.0, 8.0)
NOISE_SEEDS = (7, 8, 9)


def parts(folder: Path, snrs: Sequence[float], seeds: Sequence[int]) -> dict[str, Path]:
    """Write the Q8_0 part and an analog part per SNR and noise seed; return them by name."""
    shape, tok, tensors = weights.read(weights.SHIPPED)
    made = {"q8_0": folder / "q8_0.gguf"}
    weights.write(made["q8_0"], shape, tok, tensors, "q8_0")
    for snr in snrs:
        for seed in seeds:
            path = folder / f"analog-{snr:g}dB-{seed}.gguf"
            weights.write(path, shape, tok, weights.analog(tensors, snr, seed), "f16")
            made[f"{snr:g} dB/{seed}"] = path
    return made


async def sweep(urls: Mapping[str, str], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Ask every prompt of the reference and of each part once; fold each part's figures."""
    lines = pairs.prompts()
    found: dict[str, list[tuple[bool, int, bool | None]]] = {name: [] for name in names}
    gate = asyncio.Semaphore(4)
    embedder = Endpoint("embed", urls["embed"])
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(line: Mapping[str, Any]) -> None:
            async with gate:
                body = pairs.body(line, 0.0, 0)
                path = "/v1/chat/completions"
                reference, *others = await asyncio.gather(
                    ask(client, Endpoint("reference", urls["reference"]), path, body),
                    *(ask(client, Endpoint(name, urls[name]), path, body) for name in names),
                )
                if reference.answer is None:
                    raise RuntimeError(f"the reference failed a prompt: {reference.error}")
                text = reference.answer.text or ""
                expected = line.get("expected")
                right = isinstance(expected, str) and states(text, expected)
                for name, reply in zip(names, others, strict=True):
                    row, _ = await measure_pair(
                        client, embedder, fleet.EMBEDDING_MODEL, reference.answer, reply
                    )
                    at_risk = words_at_risk(
                        row["exact_match"], row["first_divergence"], len(tokens(text))
                    )
                    wrong = None
                    if isinstance(expected, str):
                        said = reply.answer.text if reply.answer is not None else ""
                        wrong = right and not states(said or "", expected)
                    found[name].append((departs(row, Tolerance()), at_risk, wrong))

        await asyncio.gather(*(one(line) for line in lines))
    return {name: figures(rows) for name, rows in found.items()}


def figures(rows: Sequence[tuple[bool, int, bool | None]]) -> dict[str, Any]:
    """Fold one part's pairs: its departure rate, on all prompts and on the labelled and the
    free-text ones apart, and its labelled answers turned wrong."""
    labelled = [wrong for _, _, wrong in rows if wrong is not None]
    found: dict[str, Any] = {"answers": len(rows)}
    for kind, test in (("", lambda w: True), ("facts_", lambda w: w is not None),
                       ("stories_", lambda w: w is None)):  # fmt: skip
        rate = Rate.count((departed, at_risk) for departed, at_risk, w in rows if test(w))
        found |= {
            f"{kind}departures": rate.departures,
            f"{kind}words_at_risk": rate.words,
            f"{kind}departure_rate": rate.value,
        }
    return found | {
        "labelled": len(labelled),
        "turned_wrong": sum(labelled),
        "turned_wrong_share": sum(labelled) / len(labelled) if labelled else None,
    }


def by_snr(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pool each SNR's noise seeds: departures over words, turned wrong over questions."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for name, figure in results.items():
        grouped.setdefault(name.split("/")[0], []).append(figure)
    rows = []
    for part, figs in grouped.items():
        row: dict[str, Any] = {"part": part, "parts": len(figs)}
        for kind in ("", "facts_", "stories_"):
            departures = sum(f[f"{kind}departures"] for f in figs)
            words = sum(f[f"{kind}words_at_risk"] for f in figs)
            row |= {
                f"{kind}departures": departures,
                f"{kind}words_at_risk": words,
                f"{kind}departure_rate": departures / words,
            }
        wrong, labelled = sum(f["turned_wrong"] for f in figs), sum(f["labelled"] for f in figs)
        row |= {"turned_wrong": wrong, "labelled": labelled, "turned_wrong_share": wrong / labelled}
        rows.append(row)
    return sorted(rows, key=lambda r: r["turned_wrong_share"])


def limit(rows: Sequence[Mapping[str, Any]], allowed: float = MAX_TURNED_WRONG) -> float:
    """Return the departure rate on the labelled answers at which the share turned wrong reaches
    `allowed`: between the last part at or below it and the first above, log-linear in the
    share."""
    for low, high in itertools.pairwise(rows):
        a, b = low["turned_wrong_share"], high["turned_wrong_share"]
        if a <= allowed < b:
            t = (allowed - a) / (b - a)
            r1, r2 = low["facts_departure_rate"], high["facts_departure_rate"]
            return math.exp(math.log(r1) + t * (math.log(r2) - math.log(r1)))
    raise ValueError("no two parts straddle the allowed share: widen the sweep")


def run(snrs: Sequence[float], seeds: Sequence[int]) -> dict[str, Any]:
    """Start the reference, the embedding engine and every part; sweep them."""
    files = fleet.models(engine.cache_dir())
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        made = parts(Path(folder), snrs, seeds)
        specs = {
            "reference": engine.ServerSpec(files["f16"], corpus.MODEL, context=2048, slots=4),
            "embed": engine.ServerSpec(
                files["embedding"], fleet.EMBEDDING_MODEL, context=1024, slots=2, embeddings=True
            ),
            **{
                name: engine.ServerSpec(path, corpus.MODEL, context=2048, slots=4)
                for name, path in made.items()
            },
        }
        servers = {name: engine.launch(spec, engine.free_port()) for name, spec in specs.items()}
        for server in servers.values():
            stack.callback(engine.stop, server)
        for server in servers.values():
            engine.wait_ready(server)
        urls = {name: server.url for name, server in servers.items()}
        results = asyncio.run(sweep(urls, list(made)))
    rows = by_snr(results)
    return {
        "snrs_db": list(snrs),
        "noise_seeds": list(seeds),
        "allowed_turned_wrong": MAX_TURNED_WRONG,
        "parts": results,
        "by_part": rows,
        "limit_per_word": limit(rows),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.departure_limit", description=__doc__)
    parser.add_argument("--snr", type=float, nargs="+", default=list(SNRS_DB))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(NOISE_SEEDS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    document = run(args.snr, args.seeds)
    print(f"{'part':>6} {'per 1k words: all':>18} {'facts':>7} {'stories':>8} {'turned wrong':>13}")
    for row in document["by_part"]:
        print(
            f"{row['part']:>6} {row['departure_rate'] * 1000:>18.2f} "
            f"{row['facts_departure_rate'] * 1000:>7.2f} "
            f"{row['stories_departure_rate'] * 1000:>8.2f} "
            f"{row['turned_wrong']:>5}/{row['labelled']:<4} {row['turned_wrong_share']:>6.1%}"
        )
    print(f"limit: {document['limit_per_word'] * 1000:.2f} departures per 1,000 words at risk")
    if args.out:
        args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
