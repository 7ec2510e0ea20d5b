"""Measure the real fleet part by part: speed, modelled energy, agreement with f16, accuracy.

    python -m bench.real_fleet --runs 3 --out docs/results/real-fleet.json

Starts the fleet of policies/real.yaml on free ports and asks each engine directly (the
gateway's own overhead is measured in docs/performance.md), one request at a time:

- the labelled suite (suites/facts.jsonl) and the stories (suites/stories.jsonl) at
  temperature 0, `--runs` times: latency per request, decode tokens per second as the engine
  reports them (`timings`), the power exporter's modelled energy per request, and the share
  of labelled answers that are right;
- once, teacher-forced along the f16 reference's answers: at every position of every answer,
  the part's top-20 next-token log-probabilities given the reference's prefix, for top-1
  agreement (the share of positions whose most likely token is the reference's) and the mean
  KL divergence from the reference's distribution, as llama-perplexity's `--kl-divergence`
  reports them (KL over the reference's top 20; a token the part does not list gets the part's
  20th log-probability, an upper bound on its own).

The second f16 replica (gpu-1) is measured as a part of its own: the noise floor.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from gateway.promotion.precision.labels import states
from gateway.upstream import exposition
from realfleet import corpus, fleet

PARTS = {"gpu-0": "f16", "gpu-1": "f16 (second replica)", "asic-0": "q8_0", "cim-0": "analog"}
TOP = 20


def suite() -> list[dict[str, Any]]:
    """Return every prompt of the facts and the stories suites."""
    return [
        json.loads(line)
        for name in corpus.SUITES
        for line in Path(corpus.suite_file(name)).read_text().splitlines()
    ]


def energy_mj(http: httpx.Client, port: int, backend: str) -> float:
    text = http.get(f"http://127.0.0.1:{port}/backends/{backend}/metrics").text
    value = exposition.total(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert value is not None, f"no energy counter for {backend}"
    return value


def answers(http: httpx.Client, url: str, prompts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Ask the suite once, in order; return the texts, latencies and decode speeds."""
    texts, latency, speed = [], [], []
    for line in prompts:
        body = {
            "model": corpus.MODEL,
            "messages": line["messages"],
            "max_tokens": line["max_tokens"],
            "temperature": 0,
        }
        started = time.perf_counter()
        reply = http.post(f"{url}/v1/chat/completions", json=body).json()
        latency.append(time.perf_counter() - started)
        texts.append(reply["choices"][0]["message"]["content"])
        timings = reply.get("timings", {})
        if timings.get("predicted_n", 0) > 1:
            speed.append(timings["predicted_per_second"])
    return {"texts": texts, "latency_s": latency, "tokens_per_s": speed}


def accuracy(prompts: Sequence[Mapping[str, Any]], texts: Sequence[str]) -> dict[str, Any]:
    """Return the share of labelled answers that are right, overall and by kind."""
    by_kind: dict[str, list[bool]] = {}
    for line, text in zip(prompts, texts, strict=True):
        if line["expected"] is not None:
            by_kind.setdefault(line["kind"], []).append(states(text, line["expected"]))
    every = [right for marks in by_kind.values() for right in marks]
    return {
        "labelled": len(every),
        "right": sum(every),
        "accuracy": sum(every) / len(every),
        "by_kind": {kind: sum(m) / len(m) for kind, m in sorted(by_kind.items())},
    }


def prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    text = "".join(f"{corpus.START}{m['role']}\n{m['content']}{corpus.END}\n" for m in messages)
    return text + f"{corpus.START}assistant\n"


def next_token(http: httpx.Client, url: str, prompt: str) -> dict[str, float]:
    """Return the engine's top log-probabilities of the token after `prompt`."""
    body = {"prompt": prompt, "n_predict": 1, "n_probs": TOP, "temperature": 0,
            "post_sampling_probs": False, "cache_prompt": True}  # fmt: skip
    reply = http.post(f"{url}/completion", json=body).json()
    (position,) = reply["completion_probabilities"]
    return {p["token"]: p["logprob"] for p in position["top_logprobs"]}


def forced(
    http: httpx.Client, url: str, prompts: Sequence[Mapping[str, Any]], ref: Sequence[str]
) -> list[list[dict[str, float]]]:
    """Return, for each prompt, the part's next-token distributions along the reference's
    answer (tokenized by the engine, which shares the reference's vocabulary)."""
    out = []
    for line, text in zip(prompts, ref, strict=True):
        prefix = prompt_text(line["messages"])
        ids = http.post(f"{url}/tokenize", json={"content": text, "with_pieces": True}).json()
        pieces = [t["piece"] for t in ids["tokens"]]
        steps = []
        for piece in [*pieces, corpus.END]:
            steps.append(next_token(http, url, prefix))
            prefix += piece
        out.append(steps)
    return out


def agreement(
    ref: Sequence[Sequence[Mapping[str, float]]], part: Sequence[Sequence[Mapping[str, float]]]
) -> dict[str, float]:
    """Return top-1 agreement and mean KL(reference || part) over every position."""
    same, kls = 0, []
    for ref_steps, part_steps in zip(ref, part, strict=True):
        for p, q in zip(ref_steps, part_steps, strict=True):
            same += max(p, key=p.__getitem__) == max(q, key=q.__getitem__)
            floor = min(q.values())
            kls.append(sum(math.exp(lp) * (lp - q.get(t, floor)) for t, lp in p.items()))
    top1 = same / len(kls)
    return {"positions": len(kls), "top1_agreement": top1, "mean_kl": statistics.fmean(kls)}


def measure(runs: int) -> dict[str, Any]:
    prompts = suite()
    suites = [corpus.suite_file(name) for name in corpus.SUITES]
    result: dict[str, Any] = {"suites": suites, "prompts": len(prompts), "runs": runs}
    with fleet.running() as real, httpx.Client(timeout=60) as http:
        port = real.ports["power"]
        parts: dict[str, Any] = {}
        for backend, label in PARTS.items():
            url, per_run = real.url(backend), []
            for _ in range(runs):
                before = energy_mj(http, port, backend)
                asked = answers(http, url, prompts)
                joules = (energy_mj(http, port, backend) - before) / 1000
                per_run.append({
                    "latency_p50_ms": 1000 * statistics.median(asked["latency_s"]),
                    "latency_p95_ms": 1000 * statistics.quantiles(asked["latency_s"], n=20)[-1],
                    "tokens_per_s": statistics.median(asked["tokens_per_s"]),
                    "energy_j_per_request": joules / len(prompts),
                    **accuracy(prompts, asked["texts"]),
                    "texts": asked["texts"],
                })  # fmt: skip
            parts[backend] = {"part": label, "runs": per_run}
        reference = parts["gpu-0"]["runs"][0]["texts"]
        ref_steps = forced(http, real.url("gpu-0"), prompts, reference)
        for backend in PARTS:
            steps = forced(http, real.url(backend), prompts, reference)
            parts[backend]["against_f16"] = agreement(ref_steps, steps)
            parts[backend]["same_answer_as_f16"] = statistics.fmean(
                a == b for a, b in zip(parts[backend]["runs"][0]["texts"], reference, strict=True)
            )
        result["parts"] = parts
    return result


def _median(runs: Sequence[Mapping[str, float]], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def headline(result: Mapping[str, Any]) -> list[str]:
    """Return a line per part: medians over the runs (with the range), and the agreement."""
    lines = []
    for backend, part in result["parts"].items():
        runs, forced_ = part["runs"], part["against_f16"]
        lines.append(
            f"{backend} {part['part']}: accuracy {_median(runs, 'accuracy')}, "
            f"p50 {_median(runs, 'latency_p50_ms')} ms, {_median(runs, 'tokens_per_s')} tok/s, "
            f"{_median(runs, 'energy_j_per_request')} J/request, "
            f"top-1 {forced_['top1_agreement']:.4f}, KL {forced_['mean_kl']:.5f}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.real_fleet", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/real-fleet.json"))
    args = parser.parse_args(argv)
    result = measure(args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(headline(result)))


if __name__ == "__main__":
    main()
