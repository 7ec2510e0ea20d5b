"""Where a flip at a near tie stops being benign: the KL limit, fitted on some cases and held to
others it never saw.

    python -m bench.near_tie fit --out docs/results/near-tie-fit.json
    python -m bench.near_tie held-out --out docs/results/near-tie-held-out.json

A pair whose first differing token is a near tie, at a KL(reference || candidate) per token up
to it of at most `departures.NEAR_TIE_KL`, does not depart (gateway/promotion/departures.py).

**Fit.** The real fleet's f16 reference and the fit parts (Q8_0, and the analog parts at
`FIT_SNRS_DB` with the noise seeds the calibration benches use, `FIT_SEEDS`: bench/promotion.py's
parts are seed 7 at 8 and 10 dB, bench/departure_limit.py's seeds 7 to 9) answer every prompt of
the shipped suites (suites/*.jsonl; those written for the simulated 8B model are sent to the
fleet's model as their messages alone) at temperature 0, each pair measured as a precision check
measures it. The benign flips are Q8_0's: the part answers every labelled question as the
reference does. The harmful ones are the labelled answers a part turned wrong. The limit is the
geometric middle between the largest KL of a Q8_0 pair that parts at a near tie and the
smallest of a wrong answer that does, when the first is below the second; otherwise the largest
that forgives no wrong answer.

**Held out.** Suites the fit never read (bench/everyday.py, `HELD_OUT_SUITES`) and the labelled
go-live suite, on the fleet's own parts and on parts the fit never saw (`held_out_parts`:
other quantizations, analog noise at seeds of its own; and the replica behind a shim that
rewords every answer, `paraphrase`), each checked by `gateway precision check` as an operator
runs it, against a policy naming every part as a pool. Each check is judged again by the former
rule (its pairs without KL, so no flip is forgiven) to show what the rule changed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import everyday
from gateway.policy.load import load_policy
from gateway.promotion.departures import NEAR_TIE_KL, Tolerance, departs
from gateway.promotion.precision.check import Endpoint, ask, greedy, measure_pair, read_suite
from gateway.promotion.precision.comparison import plan
from gateway.promotion.precision.figures import judge_check
from gateway.promotion.precision.labels import states
from gateway.promotion.precision.retries import outcomes_of
from realfleet import corpus, engine, fleet, weights
from realfleet.shim import Shim

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "suites"
FIT_SNRS_DB = (8.0, 10.0)
FIT_SEEDS = (7, 8, 9)
HELD_OUT_SNRS_DB = (8.0, 10.0)
HELD_OUT_SEEDS = (11, 12, 13)
# The held-out pool of the replica behind realfleet/shim.py rewording every answer.
PARAPHRASE = "paraphrase"
HELD_OUT_QUANTS = ("q6_k", "q5_1", "q4_0")
HELD_OUT_SUITES = everyday.SEEDS


# Parts -------------------------------------------------------------------------------------


def analog_parts(folder: Path, snrs: Sequence[float], seeds: Sequence[int]) -> dict[str, Path]:
    """Write an analog part per SNR and noise seed; return them by name."""
    shape, tok, tensors = weights.read(weights.SHIPPED)
    made = {}
    for snr in snrs:
        for seed in seeds:
            path = folder / f"analog-{snr:g}db-{seed}.gguf"
            weights.write(path, shape, tok, weights.analog(tensors, snr, seed), "f16")
            made[f"analog-{snr:g}db-{seed}"] = path
    return made


def quantized_parts(folder: Path, precisions: Sequence[str]) -> dict[str, Path]:
    """Write the shipped weights at each precision; return them by name."""
    shape, tok, tensors = weights.read(weights.SHIPPED)
    return {
        p.replace("_", ""): weights.write(folder / f"{p}.gguf", shape, tok, tensors, p)
        for p in precisions
    }


def spec(path: Path) -> engine.ServerSpec:
    return engine.ServerSpec(path, corpus.MODEL, context=2048, slots=4)


# Fit ---------------------------------------------------------------------------------------


def fit_prompts() -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Yield every prompt of the shipped suites as the fleet's model is asked it: its messages
    (their roles and texts), the labelled suite's label, 64 tokens."""
    for path in sorted(SUITES.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            body = json.loads(line)
            sent = {
                "model": corpus.MODEL,
                "messages": [
                    {"role": m["role"], "content": m["content"]} for m in body["messages"]
                ],
                "max_tokens": corpus.SUITE_MAX_TOKENS,
            }
            if isinstance(body.get("expected"), str):
                sent["expected"] = body["expected"]
            yield path.name, number, sent


async def measure(urls: Mapping[str, str], names: Sequence[str]) -> list[dict[str, Any]]:
    """Ask the reference once and every part once per prompt; return one row per pair."""
    gate = asyncio.Semaphore(4)
    embedder = Endpoint("embed", urls["embed"])
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(suite: str, number: int, body: dict[str, Any]) -> None:
            async with gate:
                sent, path = greedy(body), "/v1/chat/completions"
                reference, *replies = await asyncio.gather(
                    ask(client, Endpoint("reference", urls["reference"]), path, sent),
                    *(ask(client, Endpoint(name, urls[name]), path, sent) for name in names),
                )
                if reference.answer is None:
                    raise RuntimeError(f"the reference failed {suite}:{number}: {reference.error}")
                expected = body.get("expected")
                right = expected is not None and states(reference.answer.text or "", expected)
                for name, reply in zip(names, replies, strict=True):
                    row, _ = await measure_pair(
                        client, embedder, fleet.EMBEDDING_MODEL, reference.answer, reply
                    )
                    said = reply.answer.text if reply.answer is not None else ""
                    rows.append(
                        {
                            "part": name,
                            "suite": suite,
                            "line": number,
                            "turned_wrong": (
                                None
                                if expected is None
                                else right and not states(said or "", expected)
                            ),
                            **{k: row.get(k) for k in PAIR_FIELDS},
                        }
                    )

        await asyncio.gather(*(one(*prompt) for prompt in fit_prompts()))
    return rows


PAIR_FIELDS = (
    "exact_match",
    "near_tie",
    "kl_divergence",
    "semantic_similarity",
    "similarity",
    "first_divergence",
    "token_divergence",
    "failure",
    "candidate_error",
)


PAIR_COLUMNS = ("part", "suite", "line", "turned_wrong", *PAIR_FIELDS)


def dumped(document: Mapping[str, Any]) -> str:
    """Return a result as JSON, a fit's pairs one to a line."""
    if "pairs" not in document:
        return json.dumps(document, indent=1) + "\n"
    head = json.dumps({**document, "pairs": []}, indent=1)
    lines = ",\n".join("  " + json.dumps(p, separators=(",", ":")) for p in document["pairs"])
    return head.replace('"pairs": []', '"pairs": [\n' + lines + "\n ]") + "\n"


def former(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return a pair as the former rule read it: no KL, so no flip forgiven on meaning; and an
    answer cut short after a benign flip a failed request, as every cut answer was."""
    if row.get("cut_after_tie"):
        return {**dict.fromkeys(row), "candidate_error": "cut_short answer", "failure": "cut_short"}
    return {**row, "kl_divergence": None}


def limit(benign_kl: Sequence[float], harmful_kl: Sequence[float]) -> dict[str, Any]:
    """Return the KL limit between the benign flips and the harmful ones (module docstring)."""
    high, low = max(benign_kl, default=0.0), min(harmful_kl, default=math.inf)
    if high < low and math.isfinite(low) and high > 0:
        value, how = math.sqrt(high * low), "the geometric middle of the two"
    elif high < low and math.isfinite(low):
        value, how = low / 2, "half the smallest harmful KL (no benign flip has a KL above 0)"
    elif math.isfinite(low):
        value, how = math.nextafter(low, 0.0), "just below the smallest harmful KL (they overlap)"
    else:
        value, how = 2 * high, "twice the largest benign KL (no harmful flip to bound it)"
    return {"value": value, "how": how, "largest_benign": high, "smallest_harmful": low}


def summary(rows: Sequence[Mapping[str, Any]], held_to: float) -> dict[str, Any]:
    """Fold one part's pairs: how many differ, part at a near tie, depart before and after."""
    tol = Tolerance()

    def forgiven(r: Mapping[str, Any]) -> bool:
        return departs(former(r), tol) and not departs(r, tol)

    differing = [r for r in rows if r["exact_match"] is False]
    ties = [r for r in differing if r["near_tie"]]
    wrong = [r for r in rows if r["turned_wrong"]]
    return {
        "prompts": len(rows),
        "differing": len(differing),
        "near_tie": len(ties),
        "departing_before": sum(departs(former(r), tol) for r in rows),
        "departing_after": sum(departs(r, tol) for r in rows),
        "forgiven": sum(map(forgiven, rows)),
        "labelled": sum(r["turned_wrong"] is not None for r in rows),
        "turned_wrong": len(wrong),
        "turned_wrong_at_near_tie": sum(bool(r["near_tie"]) for r in wrong),
        "turned_wrong_forgiven": sum(map(forgiven, wrong)),
        "near_tie_kl": sorted(r["kl_divergence"] for r in ties if r["kl_divergence"] is not None),
        "limit": held_to,
    }


def fit(snrs: Sequence[float], seeds: Sequence[int]) -> dict[str, Any]:
    """Start the reference, the embedding engine and every fit part; fit the limit."""
    files = fleet.models(engine.cache_dir())
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        made = {"q8_0": files["q8_0"], **analog_parts(Path(folder), snrs, seeds)}
        specs = {
            "reference": spec(files["f16"]),
            "embed": engine.ServerSpec(
                files["embedding"], fleet.EMBEDDING_MODEL, context=1024, slots=2, embeddings=True
            ),
            **{name: spec(path) for name, path in made.items()},
        }
        urls = _serve(stack, specs)
        rows = asyncio.run(measure(urls, list(made)))
    # Q8_0's flips at near ties are the benign ones; wrong answers parting at a near tie the
    # harmful ones (of any part; Q8_0 turns none wrong).
    benign_kl = [
        r["kl_divergence"]
        for r in rows
        if r["part"] == "q8_0" and r["near_tie"] and r["kl_divergence"] is not None
    ]
    harmful_kl = [
        r["kl_divergence"]
        for r in rows
        if r["turned_wrong"] and r["near_tie"] and r["kl_divergence"] is not None
    ]
    fitted = limit(benign_kl, harmful_kl)
    by_part = {name: summary([r for r in rows if r["part"] == name], NEAR_TIE_KL) for name in made}
    return {
        "suites": sorted(p.name for p in SUITES.glob("*.jsonl")),
        "prompts": sum(1 for _ in fit_prompts()),
        "snrs_db": list(snrs),
        "noise_seeds": list(seeds),
        "benign_kl": sorted(benign_kl),
        "harmful_kl": sorted(harmful_kl),
        "limit": fitted,
        "shipped_limit": NEAR_TIE_KL,
        "by_part": by_part,
        "pair_fields": list(PAIR_COLUMNS),
        "pairs": [[r[name] for name in PAIR_COLUMNS] for r in rows],
    }


# Held out ----------------------------------------------------------------------------------


def held_out_parts(folder: Path) -> dict[str, Path]:
    """Write the parts the fit never saw: quantizations and analog noise at unseen seeds."""
    return {
        **quantized_parts(folder, HELD_OUT_QUANTS),
        **analog_parts(folder, HELD_OUT_SNRS_DB, HELD_OUT_SEEDS),
    }


def held_out_policy(base: str, urls: Mapping[str, str]) -> str:
    """Return the fleet's policy with a pool per held-out part and one for the replica."""
    doc = yaml.safe_load(base)
    template = doc["pools"]["cim"]
    replica = copy.deepcopy(doc["pools"]["gpu"])
    replica["backends"] = [
        {**b, "name": "replica-1"} for b in replica["backends"] if b["name"] == "gpu-1"
    ]
    doc["pools"]["replica"] = replica
    for name, url in urls.items():
        pool = copy.deepcopy(template)
        pool.pop("go_live", None)
        pool["backends"] = [{"name": name, "url": url}]
        pool["precision"] = name
        doc["pools"][name] = pool
    return yaml.safe_dump(doc, sort_keys=False)


def checked(
    policy_file: Path, pool: str, suite: Path, out: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """Run `gateway precision check` on one pool and suite; return its figures, and the same
    pairs judged by the former rule."""
    command = [
        sys.executable, "-m", "gateway", "precision", "check", "--policy", str(policy_file),
        "--pool", pool, "--reference", "gpu", "--suite", str(suite), "--out", str(out),
    ]  # fmt: skip
    ran = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if ran.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} failed: {ran.stderr}")
    result = json.loads(out.read_text())
    read = read_suite(suite)
    outcomes = outcomes_of(result)
    for o in outcomes:
        o.candidate = None if o.candidate is None else former(o.candidate)
        o.noise = None if o.noise is None else former(o.noise)
    before = judge_check(plan(load_policy(policy_file), read, pool, "gpu", None), read, outcomes)
    after = {d["line"] for d in result["departures"]}
    forgiven = [
        o["candidate"]["kl_divergence"]
        for o in result["outcomes"]
        if o["line"] in {d["line"] for d in before["departures"]} - after
    ]
    return {
        "pool": pool,
        "suite": suite.name,
        "suite_sha256": result["suite_sha256"],
        "exit": ran.returncode,
        "verdict": result["verdict"],
        "gate": result["gate"],
        **_figures(result),
        "forgiven": len(forgiven),
        "forgiven_kl_max": max(forgiven, default=None),
        "departures_kl": sorted(
            d["kl_divergence"] for d in result["departures"] if d["kl_divergence"] is not None
        ),
        # Answers cut short after a benign flip where the reference's finished: they depart
        # rather than fail the request (docs/promotion.md, "Cut short after a benign flip").
        "cut_after_tie": [d for d in result["departures"] if d.get("cut_after_tie")],
        "former_rule": {"verdict": before["verdict"], **_figures(before)},
        "summary": ran.stdout.strip(),
    }


def _figures(result: Mapping[str, Any]) -> dict[str, Any]:
    labelled = result["labelled"]
    return {
        "compared": result["compared"],
        "departures": len(result["departures"]),
        "words_at_risk": result["words_at_risk"],
        "per_1000_words": 1000 * (result["departure_rate"] or 0.0),
        "excess_upper_per_1000_words": 1000 * result["ci"]["excess"][1],
        "turned_wrong": None if labelled is None else labelled["turned_wrong"],
        "top1_agreement": result["top1_agreement"],
        "mean_kl": result["mean_kl"],
        "candidate_errors": result["candidate_errors"],
    }


def held_out(folder: Path, pools: Sequence[str], labelled: bool) -> dict[str, Any]:
    """Start the fleet and the held-out parts; check each of `pools` (all where none are
    named) on every held-out suite, and on the labelled go-live suite with `labelled`."""
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    suites = [everyday.write(folder / f"everyday-{seed}.jsonl", seed) for seed in HELD_OUT_SUITES]
    if labelled:
        suites.append(SUITES / "facts.jsonl")
    database = folder / "checks.db"
    database.unlink(missing_ok=True)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}"}
    subprocess.run([sys.executable, "-m", "gateway", "db", "upgrade"], env=env, check=True,
                   cwd=ROOT, capture_output=True)  # fmt: skip
    named = {pool.partition("@")[0] for pool in pools}
    with fleet.running(logs=folder / "logs") as running, ExitStack() as stack:
        parts = held_out_parts(folder)
        # Only the parts named, where some are: each is an engine on the machine's two cores.
        served = {name: spec(path) for name, path in parts.items() if not named or name in named}
        urls = _serve(stack, served)
        if not named or PARAPHRASE in named:
            # A part that rewords every answer of the replica's and keeps its facts: benign.
            shim = stack.enter_context(Shim(running.url("gpu-1"), "reword", 1.0).running())
            urls[PARAPHRASE] = shim.url
        policy_file = folder / "policy.yaml"
        policy_file.write_text(held_out_policy(running.policy(), urls))
        # A pool named `pool@N` is checked on held-out suite N alone (`pool@facts`: facts.jsonl).
        checks = [
            checked(policy_file, pool, suite, folder / f"{pool}-{suite.stem}.json", env)
            for pool, only in (
                (named.partition("@")[0], named.partition("@")[2])
                for named in pools or ["replica", "asic", *urls, "cim"]
            )
            for suite in suites
            if not only or suite.stem in (only, f"everyday-{only}")
        ]
    return {
        "suites": {s.name: read_suite(s).sha256 for s in suites},
        "parts": {
            "replica": "f16, the reference's replica (gpu-1)",
            "asic": "Q8_0 (a fit part, on prompts the fit never read)",
            "cim": "analog 8 dB, noise seed 7 (a fit part, on prompts the fit never read)",
            **{name: "held out" for name in urls},
            PARAPHRASE: "the replica's answers reworded, every fact kept (realfleet/shim.py)",
        },
        "limit": NEAR_TIE_KL,
        "checks": checks,
    }


def _serve(stack: ExitStack, specs: Mapping[str, engine.ServerSpec]) -> dict[str, str]:
    servers = {name: engine.launch(s, engine.free_port()) for name, s in specs.items()}
    for server in servers.values():
        stack.callback(engine.stop, server)
    for server in servers.values():
        engine.wait_ready(server)
    return {name: server.url for name, server in servers.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.near_tie", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fitting = commands.add_parser("fit", help="fit the limit on the shipped suites")
    fitting.add_argument("--snr", type=float, nargs="+", default=list(FIT_SNRS_DB))
    fitting.add_argument("--seeds", type=int, nargs="+", default=list(FIT_SEEDS))
    fitting.add_argument("--out", type=Path, required=True)
    holding = commands.add_parser("held-out", help="check held-out parts on held-out suites")
    holding.add_argument("--work", type=Path, default=Path("run/near-tie"))
    holding.add_argument(
        "--pools",
        nargs="*",
        default=[],
        help="pools to check (all); pool@N: on suite N (or facts) alone",
    )
    holding.add_argument("--labelled", action="store_true", help="facts.jsonl too")
    holding.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "fit":
        document = fit(args.snr, args.seeds)
        print(json.dumps({k: v for k, v in document.items() if k != "pairs"}, indent=1))
    else:
        document = held_out(args.work, args.pools, args.labelled)
        for c in document["checks"]:
            print(
                f"{c['pool']:>16} {c['suite']:>18}: {c['verdict']:>4} "
                f"({c['departures']} departures, {c['per_1000_words']:.2f} per 1,000 words, "
                f"upper {c['excess_upper_per_1000_words']:.2f}; former rule "
                f"{c['former_rule']['verdict']}, {c['former_rule']['departures']} departures, "
                f"upper {c['former_rule']['excess_upper_per_1000_words']:.2f})"
            )
    args.out.write_text(dumped(document))


if __name__ == "__main__":
    main()
