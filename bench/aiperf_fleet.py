"""Replay conversations with NVIDIA's aiperf against the real fleet: through the gateway, and
round-robin over the same engines from the client, as a deployment without the gateway would.

    make aiperf   # aiperf 0.13.0 in an environment of its own (AIPERF below)
    python -m bench.aiperf_fleet --runs 3 --out docs/results/aiperf-fleet.json

Starts the fleet of policies/real.yaml and a `gateway serve` process whose chat route serves
the GPU pool alone (gpu-0 and gpu-1, f16, four slots of 2,048 tokens each; as
bench/real_fleet_cache.py). The conversations are a Mooncake-format trace with sessions
(`conversations`): each opens with a prompt of its own (`--first-tokens`, its 512-token blocks
named by `hash_ids`), then each turn adds a question (`--turn-tokens`) after a think time;
aiperf sends every turn with the conversation's earlier turns before it, and names the
conversation in `X-Session-Affinity` and `X-Correlation-ID` (aiperf's defaults), which the
gateway reads as a session key (gateway/fleet/sessions.py). Token counts are the served
model's: aiperf counts them with the model's own tokenizer (realfleet/tokenizer.py
`hugging_face`), placed where `transformers` finds it offline (`HF_HOME`, `HF_HUB_OFFLINE=1`).

Two arms per run, one after the other, first in turn (the machine is the same for both, and
aiperf's own processes load it alike): `gateway` (one `--url`, the gateway) and `round-robin`
(both engines' URLs, `--url-strategy round_robin`: aiperf spreads the requests over them). Each
arm's trace names blocks of its own and aiperf draws its text with a seed of its own, so no arm
finds another's prompts in an engine's cache. Per arm: aiperf's TTFT, inter-token latency and
request latency (its `profile_export_aiperf.json`), and the share of prompt tokens the engines
took from their caches (their `llamacpp:prompt_tokens_total` and `..._cached_total` counters
over the arm).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.real_fleet_cache import ENGINES, serving
from realfleet import corpus, fleet, weights

AIPERF = Path(
    os.environ.get("AIPERF", Path.home() / ".cache/shadow-gateway/aiperf-0.13.0/bin/aiperf")
)
TOKENIZER = f"shadow-gateway/{corpus.MODEL}"  # the name aiperf loads it by, from HF_HOME
BLOCK = 512  # the tokens a Mooncake hash id stands for
ARMS = ("gateway", "round-robin")
FIGURES = {  # aiperf's metric: the name kept here
    "time_to_first_token": "ttft",
    "inter_token_latency": "itl",
    "request_latency": "e2e",
}


def conversations(
    count: int, turns: int, first_tokens: int, turn_tokens: int, output_tokens: int,
    *, seed: int, first_block: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Return a Mooncake-format trace of `count` sessions of `turns` turns each.

    A session's first turn is a prompt of `first_tokens` in blocks named from `first_block` on,
    none shared with another session; each later turn adds `turn_tokens` (±25 %) after a think
    time of 0.2-1 s.
    """
    rng = random.Random(f"aiperf-conversations-{seed}")
    blocks = -(-first_tokens // BLOCK)
    lines = []
    for s in range(count):
        session = f"s{seed}-{s}"
        ids = list(range(first_block + s * blocks, first_block + (s + 1) * blocks))
        lines.append({"session_id": session, "input_length": first_tokens,
                      "output_length": output_tokens, "hash_ids": ids})  # fmt: skip
        for _ in range(turns - 1):
            lines.append({
                "session_id": session, "delay": rng.randint(200, 1000),
                "input_length": rng.randint(turn_tokens * 3 // 4, turn_tokens * 5 // 4),
                "output_length": output_tokens,
            })  # fmt: skip
    return lines


def place_tokenizer(hf_home: Path) -> None:
    """Write the served model's tokenizer into `hf_home` in a Hugging Face hub cache's layout."""
    tok = weights.tokenizer(weights.SHIPPED)
    repo = hf_home / "hub" / f"models--{TOKENIZER.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    (snapshot / "tokenizer.json").write_text(json.dumps(tok.hugging_face()))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
              "bos_token": None, "eos_token": corpus.END}  # fmt: skip
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))


def engine_prompt_tokens(urls: Sequence[str]) -> tuple[float, float]:
    """Return the engines' prompt tokens computed and taken from their caches, summed."""
    computed = cached = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        computed += _counter(text, "llamacpp:prompt_tokens_total")
        cached += _counter(text, "llamacpp:prompt_tokens_cached_total")
    return computed, cached


def _counter(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def profile(
    urls: Sequence[str], trace: Path, out: Path, hf_home: Path, concurrency: int, seed: int
) -> dict[str, Any]:
    """Run `aiperf profile` over the trace against `urls`; return its summary's figures.

    The request count is the trace's: past it aiperf would start its conversations again, and
    find their prompts cached."""
    requests = len(trace.read_text().splitlines())
    command = [
        str(AIPERF), "profile", "--model", corpus.MODEL, "--endpoint-type", "chat", "--streaming",
        *(a for url in urls for a in ("--url", url)), "--url-strategy", "round_robin",
        "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
        "--concurrency", str(concurrency), "--tokenizer", TOKENIZER, "--random-seed", str(seed),
        "--request-count", str(requests), "--extra-inputs", "ignore_eos:true",
        "--ui-type", "none", "--artifact-dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")  # fmt: skip
    summary = json.loads(next(out.rglob("profile_export_aiperf.json")).read_text())
    return figures(summary)


def figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Return the latencies (ms) and counts kept from aiperf's summary export."""
    kept: dict[str, Any] = {}
    for metric, name in FIGURES.items():
        found = summary.get(metric) or {}
        for stat in ("p50", "p90", "p99", "avg"):
            if found.get(stat) is not None:
                kept[f"{name}_{stat}_ms"] = float(found[stat])
    # The engine's prompt tokens against aiperf's count (its tokenizer's): near 0 when the
    # trace's token counts are the served model's.
    for metric in ("request_count", "request_error_rate", "request_throughput",
                   "usage_prompt_tokens_diff_pct"):  # fmt: skip
        found = summary.get(metric)
        if isinstance(found, Mapping):
            found = found.get("avg")
        if found is not None:
            kept[metric] = float(found)
    return kept


def measure(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "aiperf": str(AIPERF), "conversations": args.conversations, "turns": args.turns,
        "first_tokens": args.first_tokens, "turn_tokens": args.turn_tokens,
        "output_tokens": args.output_tokens, "concurrency_per_arm": args.concurrency, "runs": [],
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aiperf-fleet-")))
        place_tokenizer(work / "hf")
        real = stack.enter_context(fleet.running())
        gateway = stack.enter_context(serving(real, work))
        engines = [real.url(name) for name in ENGINES]
        urls = {"gateway": [gateway.url], "round-robin": engines}
        block = 0
        for run in range(args.runs):
            order = ARMS if run % 2 == 0 else ARMS[::-1]
            arms: dict[str, Any] = {}
            for arm in order:
                seed = 2 * run + ARMS.index(arm)
                lines = conversations(
                    args.conversations, args.turns, args.first_tokens, args.turn_tokens,
                    args.output_tokens, seed=seed, first_block=block,
                )  # fmt: skip
                block = 1 + max(i for line in lines for i in line.get("hash_ids", [block]))
                trace = work / f"trace-{run}-{arm}.jsonl"
                trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
                before = engine_prompt_tokens(engines)
                load = os.getloadavg()[0]
                found = profile(urls[arm], trace, work / f"out-{run}-{arm}", work / "hf",
                                args.concurrency, seed)  # fmt: skip
                computed, cached = (
                    b - a for a, b in zip(before, engine_prompt_tokens(engines), strict=True)
                )
                found["cached_share"] = cached / (computed + cached) if computed + cached else 0.0
                found["load_average_1min"] = [load, os.getloadavg()[0]]
                arms[arm] = found
            result["runs"].append({"order": list(order), **arms})
            print(f"run {run}: " + "; ".join(_line(arms[a], a) for a in ARMS), flush=True)
    result["headline"] = headline(result["runs"])
    return result


def _line(found: Mapping[str, Any], arm: str) -> str:
    return (
        f"{arm} TTFT p50 {found.get('ttft_p50_ms', float('nan')):.1f} ms "
        f"p99 {found.get('ttft_p99_ms', float('nan')):.1f} ms, cached {found['cached_share']:.1%}, "
        f"errors {found.get('request_error_rate', 0):.1%}"
    )


def headline(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Return the gateway's figures over round-robin's, run by run: their median and range."""
    out: dict[str, dict[str, float]] = {}
    keys = [k for k in runs[0]["gateway"] if k.endswith("_ms") or k == "cached_share"]
    for key in keys:
        if key == "cached_share":
            for arm in ARMS:
                values = [r[arm][key] for r in runs]
                out[f"{arm}_cached_share"] = _spread(values)
            continue
        ratios = [r["gateway"][key] / r["round-robin"][key] for r in runs if r["round-robin"][key]]
        if ratios:
            out[f"{key}_gateway_over_round_robin"] = _spread(ratios)
    return out


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.aiperf_fleet", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--first-tokens", type=int, default=900)
    parser.add_argument("--turn-tokens", type=int, default=60)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=2, help="conversations at once")
    parser.add_argument("--out", type=Path, default=Path("bench/results/aiperf-fleet.json"))
    args = parser.parse_args(argv)
    if not AIPERF.exists():
        parser.error(f"aiperf is not at {AIPERF}: run `make aiperf`, or set AIPERF")
    result = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for key, v in result["headline"].items():
        print(f"{key}: {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})")


if __name__ == "__main__":
    main()
