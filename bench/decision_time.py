"""Time one routing decision with a learned cost model over the default policy's pools.

    python -m bench.decision_time [--decisions 50000] [--out docs/results/decision-time-run1.json]

Reports p50 / p99 / p99.9 of `decide()` in microseconds, for a short interactive chat request
(three candidate pools ranked by the cost model) under a partly loaded fleet, and the garbage
collections that ran while it measured. The collector runs as in the serving gateway: enabled,
with what exists once started frozen (gateway/ops/routes.py).

Three requests alternate, so all are timed side by side: the same prompt without prefix blocks
(too short for one, or an embedding); with them, every backend's prefix index full to its
capacity and the prompt's prefix held by one backend; and keyed by token on a fleet whose
engines publish their KV-cache events, every backend's exact index (gateway/fleet/
engine_blocks.py) holding as many blocks as it keeps and the prompt's prefix held by one. The
indexes' memory is measured as they fill (tracemalloc) and reported per block.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import time
import tracemalloc
from pathlib import Path

import yaml

from gateway.costmodel.predict import (
    FEATURES,
    TARGETS,
    CostModel,
    Learned,
    OutputLengths,
    Residual,
)
from gateway.fleet.engine_blocks import BLOCK_TOKENS, UNIT_TOKENS, EngineBlocks, Stored
from gateway.fleet.state import Fleet
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy
from gateway.routing import prefix
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import CostRanker
from gateway.routing.router import decide
from gateway.routing.tokens import token_blocks

ROOT = Path(__file__).resolve().parent.parent


def three_pool_policy() -> Policy:
    """Return the default policy with the CIM pool live and every pool on one min_cost route."""
    doc = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    doc["pools"]["cim"]["live"] = True
    doc.pop("shadow", None)
    for route in doc["routes"]:
        route.pop("shadow", None)
        route.pop("noise", None)
    doc["routes"] = [
        {
            "name": "chat-8b",
            "match": {"models": ["llama-3.1-8b-instruct"]},
            "pools": ["asic", "gpu", "cim"],
            "fallback": "gpu",
            "objective": "min_cost",
        },
    ]
    return parse_policy(yaml.safe_dump(doc))


def learned_model(policy: Policy) -> CostModel:
    """Return one cost model, as the running gateway holds, with non-zero residuals on every
    pool: the arithmetic a trained model does (the prior alone would multiply by exp(0))."""
    # The quadratic terms' weights small beside the others', as a fit's are: every pool still
    # meets the request's SLO, so the decision ranks all three.
    quadratic = FEATURES.index("log_prompt_squared")
    weights = tuple(0.01 * (i + 1) if i < quadratic else 0.001 for i in range(len(FEATURES)))
    learned = Learned({target: Residual(weights, 0.2) for target in TARGETS})
    trained = {(pool, model): learned for pool in policy.pools for model in policy.models}
    return CostModel(policy, version=1, trained=trained)


def fill_index(fleet: Fleet) -> int:
    """Fill every backend's prefix index to its capacity with other prompts' blocks; return
    the bytes the index took, as tracemalloc counts them."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    block = itertools.count(1 << 40)
    for backend in fleet.backends():
        # Prompts of 32 blocks, until the backend's index is full and evicting.
        while fleet.prefixes.held(backend.name) < fleet.prefixes.capacity(backend.name):
            fleet.prefixes.sent(backend.name, [next(block) for _ in range(32)])
    taken = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return taken


def fill_engines(fleet: Fleet) -> tuple[int, int]:
    """Give every backend an exact index as full as its engine keeps (prompts of 32 blocks of 16
    tokens); return the bytes it took, as tracemalloc counts them, and the blocks."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    token, blocks = itertools.count(1 << 20), 0
    for backend in fleet.backends():
        engine = fleet.prefixes.engines[backend.name] = EngineBlocks(live=True)
        keep = fleet.prefixes.capacity(backend.name) * BLOCK_TOKENS // UNIT_TOKENS
        hashes = itertools.count()
        while len(engine.blocks) < keep:
            ids = [next(token) for _ in range(32 * UNIT_TOKENS)]
            engine.apply([Stored([next(hashes) for _ in range(32)], None, ids, UNIT_TOKENS, "GPU")])
        blocks += len(engine.blocks)
    taken = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return taken, blocks


def quantiles(samples: list[int]) -> dict[str, float]:
    """Return the p50, p99 and p99.9 of samples in nanoseconds, in microseconds."""
    ordered = sorted(samples)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)] / 1000  # noqa: E731
    return {"p50_us": pick(0.5), "p99_us": pick(0.99), "p999_us": pick(0.999)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decisions", type=int, default=50_000)
    parser.add_argument("--out", type=Path, help="also write the result to this JSON file")
    args = parser.parse_args()
    policy = three_pool_policy()
    fleet = Fleet(policy)
    for i, backend in enumerate(fleet.backends()):
        backend.in_flight = (3 * i + 5) % backend.slots
    model = learned_model(policy)
    ranker = CostRanker(lambda: model, OutputLengths())
    profile = RequestProfile(
        endpoint="chat",
        model="llama-3.1-8b-instruct",
        prompt_tokens=600,
        max_tokens=100,
        slo_class="interactive",
        ttft_ms=500.0,
        tpot_ms=50.0,
        e2e_ms=None,
        tenant="anonymous",
        stream=True,
    )
    index_bytes = fill_index(fleet)
    text = "You answer questions about the routing gateway's fleet, briefly and exactly. " * 31
    blocks = prefix.blocks(text)
    cached = dataclasses.replace(
        profile, blocks=blocks, block_tokens=prefix.block_tokens(profile.prompt_tokens, text)
    )
    chosen = decide(cached, policy, fleet, ranker).backend
    assert chosen is not None
    fleet.prefixes.sent(chosen.name, blocks)  # the prompt's prefix is where it goes
    published = Fleet(policy)
    for mine, theirs in zip(fleet.backends(), published.backends(), strict=True):
        theirs.in_flight = mine.in_flight
    engine_bytes, engine_blocks = fill_engines(published)
    ids = list(range(7, 7 + profile.prompt_tokens))
    keyed = dataclasses.replace(profile, blocks=token_blocks(ids), block_tokens=float(BLOCK_TOKENS))
    holder = decide(keyed, policy, published, ranker).backend
    assert holder is not None
    hashes = [("prompt", i) for i in range(len(ids) // UNIT_TOKENS)]
    published.prefixes.engines[holder.name].apply(
        [Stored(hashes, None, ids[: len(hashes) * UNIT_TOKENS], UNIT_TOKENS, "GPU")]
    )
    fleets = {"plain": fleet, "prefix": fleet, "exact": published}
    requests = {"plain": profile, "prefix": cached, "exact": keyed}
    for name, request in requests.items():
        for _ in range(2000):
            decide(request, policy, fleets[name], ranker)
    gc.collect()
    gc.freeze()
    collections = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections[0] += 1

    samples: dict[str, list[int]] = {name: [] for name in requests}
    clock = time.perf_counter_ns
    gc.callbacks.append(count)
    for name in itertools.islice(itertools.cycle(requests), 3 * args.decisions):
        request, taken, where = requests[name], samples[name], fleets[name]
        t0 = clock()
        decide(request, policy, where, ranker)
        taken.append(clock() - t0)
    gc.callbacks.remove(count)
    decision = decide(cached, policy, fleet, ranker)
    result = {
        "decisions": args.decisions,
        **quantiles(samples["plain"]),
        "prefix": quantiles(samples["prefix"]),
        "exact": quantiles(samples["exact"]),
        "exact_trace": [
            said
            for _, said in decide(keyed, policy, published, ranker).trace
            if "prefix blocks" in said
        ],
        "engine_blocks_per_backend": engine_blocks // len(published.backends()),
        "engine_bytes_per_block": round(engine_bytes / engine_blocks, 1),
        "gc_collections": collections[0],
        "pools_ranked": list(decision.predictions),
        "prefix_trace": [said for _, said in decision.trace if "prefix blocks" in said],
        "index_blocks_per_backend": {b.name: fleet.prefixes.held(b.name) for b in fleet.backends()},
        "index_bytes_per_block": round(
            index_bytes / sum(fleet.prefixes.held(b.name) for b in fleet.backends()), 1
        ),
    }
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
