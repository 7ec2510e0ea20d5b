"""Measure cache-aware routing on the real fleet: multi-turn chats through the gateway against
round-robin over the same two llama.cpp engines.

    python -m bench.real_fleet_cache --runs 5 --out docs/results/real-fleet-cache.json

Starts the fleet of policies/real.yaml on free ports and a `gateway serve` process whose chat
route serves the GPU pool alone (gpu-0 and gpu-1, f16, four slots of 2,048 tokens each), with no
shadow or noise-floor copies, which would put prompts on the other engine. Each conversation
opens with a long system prompt of its own (facts of the model's world, about 900 tokens) and
asks `--turns` questions of the model's suites one after the other, each turn sending the whole
conversation so far with the model's own answers, as a chat client does. Two arms replay the
same conversations at the same time, on the same engines, each `--concurrency` conversations
at once (two: four requests at most on the pool's eight slots, so the gateway, which counts
the other arm's requests on an engine as load from the engine's metrics, never finds the pool
full; with three each on a busy machine it once refused a turn with 429 after its interactive
queue budget of 500 ms, where llama.cpp would have queued it):

- `gateway`: the official `openai` client streams every turn through the gateway, which picks
  the engine (its prefix index, no session key named);
- `round-robin`: the same client streams every turn straight to the engines, in turn (a counter
  over the arm's requests, as a round-robin balancer keeps). It skips the gateway's hop (its
  overhead, docs/performance.md), which favours this arm.

Each conversation's system prompt begins with its arm, run and number, so no arm or run finds
another's prompts in an engine's cache. Per turn: time to the first content chunk (TTFT) and to
the end of the stream, the prompt and cached tokens of the answer's `usage`
(`prompt_tokens_details.cached_tokens`), the engine's own prefill time (`timings.prompt_ms`),
and the engine that served it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai
import yaml

from harness.databases import scratch_database
from harness.gateways import GatewayProcess, gateway_process
from realfleet import corpus, fleet

ENGINES = ("gpu-0", "gpu-1")
ARMS = ("gateway", "round-robin")
FACTS = 36  # facts in a system prompt: about 3,300 characters, 900 of the model's tokens
MAX_TOKENS = 48


@dataclass(frozen=True, slots=True)
class Conversation:
    """A chat to replay: its system prompt and the questions its user asks, in order."""

    system: str
    questions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Turn:
    """One answered turn: its timings, its usage and the engine that served it."""

    conversation: int
    turn: int
    engine: str
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float | None


def conversations(count: int, turns: int, seed: int = 0) -> list[Conversation]:
    """Return `count` conversations of the model's world, each with a system prompt of its own."""
    world = corpus.countries()
    rng = random.Random(f"conversations-{seed}")
    made = []
    for _ in range(count):
        facts = " ".join(corpus.about(c).answer for c in rng.sample(world, FACTS))
        asked = tuple(corpus.draw(rng, world).question for _ in range(turns))
        made.append(Conversation(f"You are a guide to these countries. {facts}", asked))
    return made


def gpu_policy(real: fleet.RealFleet) -> str:
    """Return policies/real.yaml with its chat route on the GPU pool alone, without copies."""
    doc = yaml.safe_load(real.policy())
    doc["pools"] = {"gpu": doc["pools"]["gpu"]}
    doc["models"] = {corpus.MODEL: doc["models"][corpus.MODEL]}
    doc["routes"] = [
        {"name": "chat", "match": {"models": [corpus.MODEL]}, "pools": ["gpu"],
         "objective": "preference", "explore": 0.0},
    ]  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


# Send one turn's messages; return the answer, the engine that served it and what was measured.
Ask = Callable[[list[dict[str, str]]], Awaitable[tuple[str, str, dict[str, Any]]]]


async def stream(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], engine: str | None
) -> tuple[str, str, dict[str, Any]]:
    """Stream one answer; return its text, engine, and what was measured of it.

    The engine is the gateway's `x-gateway-backend` header when `engine` is None."""
    started = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=corpus.MODEL,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    served = engine or raw.headers["x-gateway-backend"]
    first, text, usage, timings = None, [], None, None
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
            timings = (chunk.model_extra or {}).get("timings")
    ended = time.perf_counter()
    assert usage is not None and usage.prompt_tokens_details is not None, "no usage streamed"
    measured = {
        "ttft_s": (first or ended) - started,
        "e2e_s": ended - started,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens or 0,
        "prefill_ms": timings.get("prompt_ms") if isinstance(timings, dict) else None,
    }
    return "".join(text), served, measured


async def converse(
    ask: Ask, number: int, conversation: Conversation, tag: str, refused: list[str]
) -> list[Turn]:
    """Replay one conversation turn by turn, each turn carrying the answers before it; a turn
    refused ends the conversation, its error noted in `refused`."""
    messages = [{"role": "system", "content": f"{tag} {conversation.system}"}]
    turns = []
    for i, question in enumerate(conversation.questions):
        messages.append({"role": "user", "content": question})
        try:
            answer, engine, measured = await ask(messages)
        except openai.APIStatusError as exc:
            refused.append(f"conversation {number} turn {i}: {exc.status_code} {exc.message}")
            break
        messages.append({"role": "assistant", "content": answer})
        turns.append(Turn(number, i, engine, **measured))
    return turns


async def replay(
    ask: Ask, chats: Sequence[Conversation], tag: str, concurrency: int
) -> tuple[list[Turn], list[str]]:
    """Replay the conversations, `concurrency` at a time, their turns interleaved; return the
    answered turns and the refusals."""
    waiting = list(enumerate(chats))
    done: list[Turn] = []
    refused: list[str] = []

    async def user() -> None:
        while waiting:
            number, chat = waiting.pop(0)
            done.extend(await converse(ask, number, chat, f"Chat {tag}-{number:02d}.", refused))

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return done, refused


def summary(turns: Sequence[Turn], refused: Sequence[str]) -> dict[str, Any]:
    """Return an arm's figures for one run."""
    ttft = [t.ttft_s * 1000 for t in turns]
    # Every first turn computes its whole system prompt in either arm; later turns are where
    # the engine choice decides what is cached.
    later_ttft = [t.ttft_s * 1000 for t in turns if t.turn > 0]
    by_chat: dict[int, list[Turn]] = {}
    for t in sorted(turns, key=lambda t: (t.conversation, t.turn)):
        by_chat.setdefault(t.conversation, []).append(t)
    later = [(a, b) for chat in by_chat.values() for a, b in itertools.pairwise(chat)]
    prefill = [t.prefill_ms for t in turns if t.prefill_ms is not None]
    return {
        "requests": len(turns),
        "refused": len(refused),
        "cached_share": sum(t.cached_tokens for t in turns) / sum(t.prompt_tokens for t in turns),
        "computed_tokens_per_request": statistics.fmean(
            t.prompt_tokens - t.cached_tokens for t in turns
        ),
        "ttft_p50_ms": statistics.median(ttft),
        "ttft_p90_ms": statistics.quantiles(ttft, n=10)[-1],
        "later_turns_ttft_p50_ms": statistics.median(later_ttft),
        "later_turns_ttft_p90_ms": statistics.quantiles(later_ttft, n=10)[-1],
        "e2e_p50_ms": 1000 * statistics.median(t.e2e_s for t in turns),
        "prefill_p50_ms": statistics.median(prefill) if prefill else None,
        "same_engine_as_previous_turn": statistics.fmean(a.engine == b.engine for a, b in later),
        "requests_per_engine": {e: sum(t.engine == e for t in turns) for e in ENGINES},
    }


async def run_once(
    gateway_url: str, engines: Mapping[str, str], chats: Sequence[Conversation], run: int,
    concurrency: int,
) -> dict[str, tuple[list[Turn], list[str]]]:  # fmt: skip
    """Replay the conversations through both arms at once; return each arm's turns."""
    through = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="any", max_retries=0)
    direct = {
        name: openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="any", max_retries=0)
        for name, url in engines.items()
    }
    turn_of_robin = itertools.cycle(ENGINES)

    async def via_gateway(messages: list[dict[str, str]]) -> tuple[str, str, dict[str, Any]]:
        return await stream(through, messages, None)

    async def round_robin(messages: list[dict[str, str]]) -> tuple[str, str, dict[str, Any]]:
        engine = next(turn_of_robin)
        return await stream(direct[engine], messages, engine)

    gateway, robin = await asyncio.gather(
        replay(via_gateway, chats, f"{run}g", concurrency),
        replay(round_robin, chats, f"{run}r", concurrency),
    )
    for client in (through, *direct.values()):
        await client.close()
    return {"gateway": gateway, "round-robin": robin}


@contextlib.contextmanager
def serving(real: fleet.RealFleet, work: Path) -> Iterator[GatewayProcess]:
    """Run `gateway serve` on the GPU pool's policy (`gpu_policy`), with a database of its own."""
    (work / "policy.yaml").write_text(gpu_policy(real))
    with scratch_database(None, work) as database:
        env = {
            "DATABASE_URL": database,
            "GATEWAY_POLICY": str(work / "policy.yaml"),
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_ADMIN_TOKEN": "",
            "GATEWAY_SPILL_DIR": str(work / "spill"),
        }
        with gateway_process(env, work / "gateway.log") as gateway:
            yield gateway


def measure(runs: int, count: int, turns: int, concurrency: int) -> dict[str, Any]:
    chats = conversations(count, turns)
    result: dict[str, Any] = {
        "conversations": count, "turns": turns, "concurrency_per_arm": concurrency,
        "max_tokens": MAX_TOKENS, "runs": [],
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="real-fleet-cache-")))
        real = stack.enter_context(fleet.running())
        gateway = stack.enter_context(serving(real, work))
        engines = {name: real.url(name) for name in ENGINES}
        for run in range(runs):
            load = os.getloadavg()[0]
            arms = asyncio.run(run_once(gateway.url, engines, chats, run, concurrency))
            result["runs"].append({
                "load_average_1min": [load, os.getloadavg()[0]],
                **{arm: {"summary": summary(turns, refused), "refused": refused,
                         "turns": [asdict(t) for t in turns]}
                   for arm, (turns, refused) in arms.items()},
            })  # fmt: skip
            print(f"run {run}: " + "; ".join(
                _line(result["runs"][-1][arm]["summary"], arm) for arm in ARMS
            ), flush=True)  # fmt: skip
    result["headline"] = headline(result)
    return result


def _line(s: Mapping[str, Any], arm: str) -> str:
    return (
        f"{arm} cached {s['cached_share']:.1%}, TTFT p50 {s['ttft_p50_ms']:.1f} ms "
        f"p90 {s['ttft_p90_ms']:.1f} ms, e2e p50 {s['e2e_p50_ms']:.1f} ms, "
        f"same engine {s['same_engine_as_previous_turn']:.0%}, refused {s['refused']}"
    )


KEYS = ("cached_share", "computed_tokens_per_request", "ttft_p50_ms", "ttft_p90_ms",
        "later_turns_ttft_p50_ms", "later_turns_ttft_p90_ms", "e2e_p50_ms", "prefill_p50_ms",
        "same_engine_as_previous_turn")  # fmt: skip


def spread(values: Sequence[float]) -> dict[str, float]:
    """Return the median of run-by-run figures and their range."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def headline(result: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Return, per arm and figure, the median over the runs and its range; and the gateway's
    latencies over round-robin's, run by run (the arms shared each run's machine)."""
    runs = result["runs"]
    out = {arm: {k: spread([r[arm]["summary"][k] for r in runs]) for k in KEYS} for arm in ARMS}
    out["gateway_over_round_robin"] = {
        k: spread([r["gateway"]["summary"][k] / r["round-robin"]["summary"][k] for r in runs])
        for k in KEYS
        if k.endswith("_ms")
    }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.real_fleet_cache", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=2, help="conversations at once, per arm")
    parser.add_argument("--out", type=Path, default=Path("bench/results/real-fleet-cache.json"))
    args = parser.parse_args(argv)
    result = measure(args.runs, args.conversations, args.turns, args.concurrency)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for arm, figures in result["headline"].items():
        print(arm + ": " + ", ".join(
            f"{k} {v['median']:.4g} ({v['min']:.4g}-{v['max']:.4g})" for k, v in figures.items()
        ))  # fmt: skip


if __name__ == "__main__":
    main()
