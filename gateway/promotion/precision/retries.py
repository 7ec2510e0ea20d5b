"""Retries: a check run again after it failed is judged on all its runs, prompt by prompt.

A part that fails a check could otherwise be checked again until chance lets it pass. So a
check of a pool on a suite (the same bytes, by hash) against the same reference pools the failed
checks of it since its last pass: each prompt keeps the candidate's worst answer of all runs (a
failed request, else a departure, else the least similar) and the reference's second answer's
best, and a labelled question counts as right for the candidate only where every run answered it
right. A retry can hold its ground or lose it, never gain: to pass after a fail, fix the part, or
check it on a suite it has not seen.

Each stored check keeps its own run's outcomes (`kept`), measures only, never the answers' texts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.promotion.departures import Tolerance, departs
from gateway.promotion.precision.figures import Outcome, Row


def kept(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Return a run's outcomes as a stored check keeps them."""
    return [
        {
            "line": o.line,
            "candidate": o.candidate,
            "noise": o.noise,
            "reference_error": o.reference_error,
            "reference_right": o.reference_right,
            "candidate_right": o.candidate_right,
            "noise_right": o.noise_right,
        }
        for o in outcomes
    ]


def outcomes_of(result: Mapping[str, Any]) -> list[Outcome]:
    """Return the outcomes a stored check kept (none for a check stored before they were)."""
    return [Outcome(**entry) for entry in result.get("outcomes") or ()]


def pooled(runs: Sequence[Sequence[Outcome]]) -> list[Outcome]:
    """Fold several runs of one suite into one outcome per prompt (module docstring)."""
    by_line: dict[int, list[Outcome]] = {}
    for run in runs:
        for o in run:
            by_line.setdefault(o.line, []).append(o)
    folded = []
    for line, seen in sorted(by_line.items()):
        answered = [o for o in seen if o.candidate is not None]
        if not answered:
            folded.append(seen[-1])
            continue
        worst = min(answered, key=lambda o: _closeness(o.candidate))
        floors = [o.noise for o in answered if o.noise is not None]
        labels = [o for o in answered if o.candidate_right is not None]
        folded.append(
            Outcome(
                line,
                candidate=worst.candidate,
                noise=max(floors, key=_closeness) if floors else None,
                embedding_failed=sum(o.embedding_failed for o in seen),
                reference_right=any(o.reference_right for o in labels) if labels else None,
                candidate_right=all(o.candidate_right for o in labels) if labels else None,
                noise_right=(
                    any(bool(o.noise_right) for o in labels)
                    if any(o.noise_right is not None for o in labels)
                    else None
                ),
            )
        )
    return folded


def _closeness(row: Row | None) -> float:
    """Rank a pair from a failed request (lowest) through departures to an exact match."""
    if row is None or row.get("candidate_error"):
        return -2.0
    if row.get("exact_match"):
        return 2.0
    similarity = row.get("semantic_similarity")
    if similarity is None:
        similarity = row.get("similarity") or 0.0
    # A pair that departs at the strictest tolerance ranks below every one that does not.
    return float(similarity) - (2.0 if departs(row, Tolerance()) else 0.0)
