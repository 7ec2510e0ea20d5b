"""The judge's verdicts as the report shows them: as of a moment, from the minutes it read.

The judge runs on the report's shadow minutes as `gateway promote evaluate` does on the database
(gateway/promotion/evidence.py), over the same window, and each verdict is said in sentences
(gateway/report/wording.py). It does no I/O but is not listed pure: the fold it shares with the
judge's own evaluation (`evidence.from_minutes`) lives beside its reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.policy.definition import Policy
from gateway.promotion import evidence
from gateway.promotion.judge import Criteria, judge
from gateway.report.wording import plain_check, summary_sentence, why_sentence

Row = Mapping[str, Any]


def judge_window(c: Criteria) -> float:
    """Return how much history the judge looks at, at most, as `evidence.evaluate` does (its
    window starts at the start of the day this long before: `evidence.window`)."""
    return max(2 * c.min_window_s, 86400.0) + 86400.0


def judge_minutes(minutes: Sequence[Row], policy: Policy, at: float) -> dict[tuple[str, str], Any]:
    """Judge every route and candidate as of `at` from the shadow minutes of its window."""
    rules = evidence.criteria(policy)
    since = evidence.window(rules, at)
    window = (m for m in minutes if since <= m["ts"] < at)
    gathered = evidence.from_minutes(window, evidence.paraphrases(policy))
    verdicts = {}
    for key, e in gathered.items():
        verdict = judge(e, rules, at).as_dict()
        verdict["evaluated_at"] = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
        verdict["why"] = why_sentence(verdict)
        verdict["summary"] = summary_sentence(verdict)
        for check in verdict["checks"]:
            check["plain"] = plain_check(check)
        verdicts[key] = verdict
    return verdicts
