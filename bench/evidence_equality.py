"""The judge's evidence read from the shadow minutes against the evidence folded from every shadow
record of the same window, on a stored week (a check, not a benchmark: the second read grows with
the records, about 7 GB at 10 M requests).

    python -m bench.evidence_equality --database URL [--policy policies/default.yaml]

Prints how long each read took, which (route, candidate) figures differ (counts, failures, SLO,
pairs, latency sketches, means of energy and cost) and whether the verdicts are equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gateway.db.connection import connect
from gateway.policy.load import load_policy
from gateway.promotion import evidence
from gateway.promotion.judge import Evidence, judge


def figures(e: Evidence) -> tuple[Any, ...]:
    """What the judge decides on, means to 9 significant digits (sums in another order)."""
    sides, means = ("primary", "candidate"), ("energy_j", "cost_usd")
    return (
        e.sent, e.errors, e.failures, e.slo, e.greedy, e.sampled, e.priced, e.cheaper,
        e.first_ts, e.last_ts,
        *(float(f"{getattr(e, f'{s}_{m}') or 0:.9g}") for s in sides for m in means),
        *(getattr(e, f"{s}_{m}_ms").counts for s in sides for m in ("ttft", "e2e")),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.evidence_equality", description=__doc__)
    parser.add_argument("--database", required=True)
    parser.add_argument("--policy", default="policies/default.yaml")
    args = parser.parse_args(argv)
    db, policy, now = connect(args.database), load_policy(args.policy), time.time()
    rules = evidence.criteria(policy)
    since = evidence.window(rules, now)
    started = time.perf_counter()
    summarized = evidence.load_evidence(db, policy, since, now=now)
    read = time.perf_counter()
    rows = evidence.shadow_rows(db, since)
    folded = evidence.gather(rows, evidence.slo_targets(policy), evidence.paraphrases(policy))
    done = time.perf_counter()
    print(f"summaries {read - started:.2f} s; every record ({len(rows)}) {done - read:.2f} s")
    differ = [
        key
        for key in folded
        if figures(folded[key]) != figures(summarized.get(key, Evidence(*key)))
    ]
    print(f"keys equal: {sorted(summarized) == sorted(folded)}; figures differ for: {differ}")
    verdicts = [
        {key: judge(e, rules, now).outcome for key, e in sorted(side.items())}
        for side in (summarized, folded)
    ]
    print(f"verdicts equal: {verdicts[0] == verdicts[1]}: {verdicts[0]}")
    return 0 if not differ and verdicts[0] == verdicts[1] else 1


if __name__ == "__main__":
    sys.exit(main())
