"""The report's words: the titles of its measures, and the judge's verdicts in sentences."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.promotion.judge import FAIL, PASS

# The latency measures a candidate is compared on, keyed as `numbers.latency` returns them.
LATENCY_TITLES = {
    "ttft": "Time to first token",
    "tpot": "Time per output token",
    "e2e": "End to end",
}


_OUTCOME_WORDS = {
    "promote": "Promote",
    "hold": "Hold",
    "reject": "Reject",
}
_RESULT_WORDS = {PASS: "passes", FAIL: "fails", "undecided": "is not decided yet"}


def why_sentence(verdict: Mapping[str, Any]) -> str:
    """Say why the judge decided as it did, with how much evidence it had."""
    text = verdict["reason"]
    if verdict.get("samples_needed"):
        text += f" (about {verdict['samples_needed']} more compared copies would decide it)"
    return text + f"; {verdict['window_days']:g} days of evidence."


def summary_sentence(verdict: Mapping[str, Any]) -> str:
    """Say the verdict and why in one sentence."""
    outcome = _OUTCOME_WORDS.get(verdict["outcome"], verdict["outcome"])
    return f"{outcome}: {why_sentence(verdict)}"


def plain_check(check: Mapping[str, Any]) -> str:
    """Say one of the judge's checks in words, with its estimate, interval and margin."""
    name, result = check["name"], _RESULT_WORDS.get(check["result"], check["result"])
    estimate, interval, threshold = check["estimate"], check["interval"], check["threshold"]
    n = check["samples"]
    if estimate is None or interval is None:
        return f"{name} {result}: {check['detail']}."
    low, high = interval
    if name in ("quality", "quality_sampled"):
        traffic = "Temperature-0" if name == "quality" else "Sampled"
        return (
            f"{traffic} quality {result}: {check['detail']}. The candidate departs "
            f"{estimate * 1000:+.2f} times per 1,000 words at risk more than the noise floor "
            f"(interval {low * 1000:+.2f} to {high * 1000:+.2f}); at most "
            f"{threshold * 1000:.1f} allowed."
        )
    if name == "slo":
        return (
            f"SLO attainment {result}: {check['detail']}. The candidate meets the targets "
            f"{estimate * 100:.2f} points less often than the primary (interval "
            f"{low * 100:+.2f} to {high * 100:+.2f}); at most {threshold * 100:.1f} allowed."
        )
    if name == "failures":
        return (
            f"Failed answers {result}: {check['detail']}. The candidate fails {estimate:+.2%} of"
            f" requests more than the primary (interval {low:+.2%} to {high:+.2%}); at most"
            f" {threshold:.2%} allowed."
        )
    if name == "benefit":
        return (
            f"Benefit {result}: the candidate was cheaper on {estimate:.0%} of {n} paired "
            f"requests (interval {low:.0%} to {high:.0%}); more than {threshold:.0%} needed."
        )
    return f"{name} {result}: {check['detail']}."
