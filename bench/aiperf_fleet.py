"""Replay conversations with NVIDIA's aiperf against the real fleet: through the gateway, and
round-robin over the same engines from the client, as a deployment without the gateway would.

    make aiperf   # aiperf 0.13.0 in an environment of its own (AIPERF below)
    python -m bench.aiperf_fleet --runs 3 --out docs/results/aiperf-fleet.json

Starts the fleet of policies/real.yaml and a `gateway serve` process whose chat route serves
the GPU pool alone (gpu-0 and gpu-1, f16, four slots of 2,048 tokens each; as
bench/real_fleet_cache.py). The conversations are a Mooncake-format trace with sessions
(`conversations`): each opens with a prompt of its own of 300-1,400 tokens (its 512-token
blocks named by `hash_ids`), then adds a question of 40-80 tokens a turn after a think time, for
`--turns` turns on average; they arrive `--every-ms` apart on average, on the trace's schedule
(aiperf's `--fixed-schedule`). aiperf sends every turn after the conversation's earlier questions
and names the conversation in `X-Session-Affinity` and `X-Correlation-ID` (its defaults), which
the gateway reads as a session key (gateway/fleet/sessions.py). Token counts are the served
model's: aiperf counts them with the model's own tokenizer (realfleet/tokenizer.py
`hugging_face`), placed where `transformers` finds it offline (`HF_HOME`, `HF_HUB_OFFLINE=1`).

Two arms run at once on the same engines, each its own aiperf with a trace of the same shapes
and times and prompts of its own (no arm finds another's prompts in an engine's cache):
`gateway` (one `--url`, the gateway) and `round-robin` (both engines' URLs, `--url-strategy
round_robin`). aiperf 0.13.0 advances its round-robin at a conversation's first turn only
(`credit/issuer.py`): the client keeps every conversation on one engine, which is session
affinity, every cache hit a router can find on this traffic. Per arm: aiperf's TTFT,
inter-token latency and request latency (`profile_export_aiperf.json`), each request's prompt
and cached tokens as the engine counted them (its `usage`), and errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.real_fleet_cache import ENGINES, serving, spread
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
    count: int, turns: float, every_ms: float, *, seed: int, first_block: int = 0,
    output_tokens: int = 32, context: int = 2048,
) -> list[dict[str, Any]]:  # fmt: skip
    """Return a Mooncake-format trace of `count` conversations, arriving `every_ms` apart on
    average (Poisson), of `turns` turns on average (geometric, each turn after the first
    adding a question of 40-80 tokens after a think time of 0.2-1 s from the answer before it).

    A conversation opens with a prompt of 300-1,400 tokens in 512-token blocks named from
    `first_block` on, none shared with another; it ends before its prompt and answer would
    outgrow `context`. The same seed gives the same shapes and times whatever `first_block`.
    """
    rng = random.Random(f"aiperf-conversations-{seed}")
    lines, at, block = [], 0.0, first_block
    for s in range(count):
        session = f"s{first_block}-{s}"
        first = rng.randint(300, 1400)
        blocks = -(-first // BLOCK)
        lines.append({"session_id": session, "timestamp": round(at), "input_length": first,
                      "output_length": output_tokens,
                      "hash_ids": list(range(block, block + blocks))})  # fmt: skip
        block += blocks
        held = first + output_tokens
        while rng.random() > 1 / turns:
            asked = rng.randint(40, 80)
            if held + asked + output_tokens > context * 0.9:  # room for the chat template
                break
            held += asked + output_tokens
            lines.append({"session_id": session, "delay": rng.randint(200, 1000),
                          "input_length": asked, "output_length": output_tokens})  # fmt: skip
        at += rng.expovariate(1 / every_ms)
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


def profile(
    urls: Sequence[str], trace: Path, out: Path, hf_home: Path, seed: int
) -> dict[str, Any]:
    """Run `aiperf profile` over the trace against `urls`; return its summary's figures.

    On the trace's schedule (`--fixed-schedule`): each conversation starts at its timestamp
    and is sent once, where a closed loop would start conversations again and find their
    prompts cached."""
    command = [
        str(AIPERF), "profile", "--model", corpus.MODEL, "--endpoint-type", "chat", "--streaming",
        *(a for url in urls for a in ("--url", url)), "--url-strategy", "round_robin",
        "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
        "--fixed-schedule", "--tokenizer", TOKENIZER, "--random-seed", str(seed),
        "--extra-inputs", "ignore_eos:true",
        "--ui-type", "none", "--artifact-dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")  # fmt: skip
    summary = json.loads(next(out.rglob("profile_export_aiperf.json")).read_text())
    per_request = next(out.rglob("profile_export.jsonl")).read_text().splitlines()
    turns = [turn(json.loads(line)) for line in per_request]
    sent = sum(t["engine_prompt_tokens"] or 0 for t in turns)
    cached = sum(t["engine_cached_tokens"] or 0 for t in turns)
    return {**figures(summary), "cached_share": cached / sent if sent else 0.0, "turns": turns}


def turn(record: Mapping[str, Any]) -> dict[str, Any]:
    """Return one request of aiperf's per-request export: its conversation, turn, tokens sent,
    the engine's count of them and of those it found cached, and its TTFT."""
    metrics = record.get("metrics") or {}

    def value(name: str) -> Any:
        return (metrics.get(name) or {}).get("value")

    return {
        "conversation": record["metadata"]["conversation_id"],
        "turn": record["metadata"]["turn_index"],
        "input_tokens": value("input_sequence_length"),
        "engine_prompt_tokens": value("usage_prompt_tokens"),
        "engine_cached_tokens": value("usage_prompt_cache_read_tokens"),
        "ttft_ms": value("time_to_first_token"),
        "error": record.get("error"),
    }


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
        "every_ms": args.every_ms, "runs": [],
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aiperf-fleet-")))
        place_tokenizer(work / "hf")
        real = stack.enter_context(fleet.running())
        gateway = stack.enter_context(serving(real, work))
        urls = {"gateway": [gateway.url], "round-robin": [real.url(e) for e in ENGINES]}
        block = 0
        for run in range(args.runs):
            traces = {}
            for arm in ARMS:  # the same shapes and times, prompts of their own
                lines = conversations(
                    args.conversations, args.turns, args.every_ms, seed=run, first_block=block
                )
                block = 1 + max(i for line in lines for i in line.get("hash_ids", [block]))
                traces[arm] = work / f"trace-{run}-{arm}.jsonl"
                traces[arm].write_text("".join(json.dumps(line) + "\n" for line in lines))
            load = os.getloadavg()[0]
            with concurrent.futures.ThreadPoolExecutor(len(ARMS)) as pool:
                running = {
                    arm: pool.submit(profile, urls[arm], traces[arm], work / f"out-{run}-{arm}",
                                     work / "hf", 2 * run + i)
                    for i, arm in enumerate(ARMS)
                }  # fmt: skip
                arms = {arm: future.result() for arm, future in running.items()}
            result["runs"].append({"load_average_1min": [load, os.getloadavg()[0]], **arms})
            print(f"run {run}: " + "; ".join(_line(arms[a], a) for a in ARMS), flush=True)
    result["headline"] = headline(result["runs"])
    return result


def _line(found: Mapping[str, Any], arm: str) -> str:
    return (
        f"{arm} TTFT p50 {found.get('ttft_p50_ms', float('nan')):.1f} ms "
        f"p99 {found.get('ttft_p99_ms', float('nan')):.1f} ms, cached {found['cached_share']:.1%}, "
        f"errors {found.get('request_error_rate', 0):.2f}%"
    )


def headline(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Return the gateway's figures over round-robin's, run by run: their median and range."""
    out: dict[str, dict[str, float]] = {}
    keys = [k for k in runs[0]["gateway"] if k.endswith("_ms") or k == "cached_share"]
    for key in keys:
        if key == "cached_share":
            for arm in ARMS:
                values = [r[arm][key] for r in runs]
                out[f"{arm}_cached_share"] = spread(values)
            continue
        ratios = [r["gateway"][key] / r["round-robin"][key] for r in runs if r["round-robin"][key]]
        if ratios:
            out[f"{key}_gateway_over_round_robin"] = spread(ratios)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.aiperf_fleet", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=float, default=5, help="turns a conversation, on average")
    parser.add_argument(
        "--every-ms", type=float, default=1500, help="ms between conversations, on average"
    )
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
