"""Failed copies end to end: a part behind the failure-mode proxy (realfleet/shim.py) answers
some prompts null, empty, cut in half, with an error or not at all; each copy's record says how
it failed, and the judge rejects a part that plainly fails a tenth of its answers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shadowworld import settle, shadow_policy, shadow_rows

from gateway.promotion.evidence import criteria, gather, load_evidence, paraphrases, slo_targets
from gateway.promotion.evidence import shadow_rows as shadow_rows_of
from gateway.promotion.judge import FAIL, REJECT, judge
from harness.gateways import run_gateway
from harness.metrics import metric_value
from policies import MODEL
from realfleet.shim import Shim


def ask(gw, prompts: list[str], concurrency: int = 3) -> None:
    """Send each prompt once at temperature 0, a few at a time, long enough to finish."""
    client = gw.client()

    def one(prompt: str) -> None:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=400,
            temperature=0,
        )

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts))


def copied(gw, copies: int) -> list[dict]:
    """Ask new prompts until `copies` of them were copied (a copy finding the candidate's four
    slots taken is dropped); return the shadow records."""
    asked = 0
    while True:
        settle(gw)
        rows = shadow_rows(gw, copies, timeout=1.0)
        if len(rows) >= copies:
            return rows
        more = copies - len(rows)
        ask(
            gw,
            [
                f"Tell me about question {i} of the analog array."
                for i in range(asked, asked + more)
            ],
        )
        asked += more


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("empty", "empty"), ("null", "null"), ("cut", "cut_short"), ("error", "error")],
)
def test_each_failed_copy_is_recorded_with_its_kind(sims, tmp_path: Path, mode, kind) -> None:
    with Shim(sims.urls("gpu")[0], mode, share=1.0).running() as shim:
        policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), [shim.url])
        with run_gateway(policy, tmp_path) as gw:
            ask(gw, [f"Question {i} about analog arrays." for i in range(3)])
            rows = shadow_rows(gw, 3)
            evidence = load_evidence(gw.gateway.db, policy, since=0)[("chat", "cim")]
            metrics = gw.http().get("/metrics").text
    assert [(r["failure"], r["primary_failure"]) for r in rows] == [(kind, None)] * 3
    code = "upstream_error" if kind == "error" else kind
    assert metric_value(metrics, "gateway_shadow_failed_total", code=code) == 3
    assert evidence.failures.only_candidate == 3 and evidence.failures.kinds == {kind: 3}
    # Each failed copy departs and misses its SLO: it is the answer a client would have seen.
    assert evidence.greedy.compared == evidence.greedy.departed == 3
    assert evidence.slo.only_primary == 3


def test_a_copy_that_times_out_is_recorded_and_counted(sims, tmp_path: Path) -> None:
    with Shim(sims.urls("gpu")[0], "timeout", share=1.0).running() as shim:
        policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), [shim.url], timeout_s=0.5)
        with run_gateway(policy, tmp_path) as gw:
            ask(gw, ["Why do analog arrays drift?"], concurrency=1)
            (row,) = shadow_rows(gw, 1)
            evidence = load_evidence(gw.gateway.db, policy, since=0)[("chat", "cim")]
    assert (row["candidate_error"], row["failure"]) == ("upstream_timeout", "timeout")
    assert evidence.failures.kinds == {"timeout": 1}
    assert evidence.slo.only_primary == 1 and evidence.greedy.departed == 1


@pytest.mark.parametrize(("mode", "share"), [("empty", 0.1), ("cut", 0.1), ("empty", 0.0)])
def test_a_part_failing_a_tenth_of_its_answers_is_rejected_within_300_copies(
    sims, tmp_path: Path, mode: str, share: float
) -> None:
    # The candidate is a replica of the primary's pool behind the proxy: with share 0 it is
    # the identical replica, which must not be rejected.
    with Shim(sims.urls("gpu")[0], mode, share=share).running() as shim:
        policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), [shim.url])
        with run_gateway(policy, tmp_path) as gw:
            copied(gw, 300)
            # The first 300 copies, as the judge reads them.
            rows = sorted(shadow_rows_of(gw.gateway.db, 0), key=lambda r: r["ts"])[:300]
    evidence = gather(rows, slo_targets(policy), paraphrases(policy))[("chat", "cim")]
    verdict = judge(evidence, criteria(policy), now=time.time())
    checks = {c.name: c for c in verdict.checks}
    assert evidence.sent == 300
    if share:
        # A tenth of the prompts the proxy is sent (it fails every tenth): a copy sent beside
        # another may be recorded before it, so one or two more or fewer among the first 300.
        assert 28 <= evidence.failures.only_candidate <= 32
        assert set(evidence.failures.kinds) == {"empty" if mode == "empty" else "cut_short"}
        assert checks["failures"].result == FAIL, checks["failures"].detail
        assert verdict.outcome == REJECT
    else:
        assert evidence.failures.only_candidate == 0
        # (The replica may still lose on cost: these test pools share one price.)
        assert checks["failures"].result != FAIL
