"""Why a precision check passed or failed, said in sentences with its numbers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gateway.promotion.judge import bernoulli_interval
from gateway.promotion.precision.limits import ALPHA, prompts_needed


def reasons(
    result: Mapping[str, Any], departs_ok: bool, errors_ok: bool, alpha: float = ALPHA
) -> list[str]:
    """Say in sentences why a check passed or failed, with its numbers."""
    said = []
    n, limit = result["compared"], result["limits"]["max_harmful_share"]
    half = alpha / 2  # each share's interval (figures.py)
    if n == 0:
        said.append(
            "No answer of the candidate could be compared with the reference's, so nothing "
            "shows that it answers alike."
        )
    else:
        k = len(result["departures"])
        low, high = result["ci"]["harmful_share"]
        floor_low, floor_high = result["ci"]["noise_harmful_share"]
        floor = result["noise_harmful_share"] or 0.0
        noise_k = round(floor * result["noise_pairs"])
        said.append(
            f"{k} of {n} answers ({_pct(k / n)}, {1 - half:.1%} interval {_pct(low)} to "
            f"{_pct(high)}) depart in meaning from the reference's, and {noise_k} of "
            f"{result['noise_pairs']} ({_pct(floor)}, {_pct(floor_low)} to {_pct(floor_high)}) "
            f"of the reference's own second answers do: the candidate's upper end is "
            f"{_points(high - floor_low)} above the floor's lower end, at most "
            f"{_points(limit)} allowed."
        )
        reach = bernoulli_interval(0, n, half)[1]
        if not departs_ok and reach - floor_low > limit:
            said.append(
                f"No pool can pass on {n} compared prompts: even with no departure the interval "
                f"reaches {_pct(reach)}; a suite needs at least "
                f"{prompts_needed(limit + floor_low, half)} prompts to show at most "
                f"{_points(limit)} more."
            )
    scored = result.get("labelled")
    if scored:
        q, (low, high) = scored["questions"], scored["ci"]["turned_wrong"]
        floor_low = scored["ci"]["noise_turned_wrong"][0]
        said.append(
            f"Of {q} labelled questions the candidate answered {scored['candidate_right']} "
            f"right and the reference {scored['reference_right']}; {scored['turned_wrong']} "
            f"({_pct(scored['turned_wrong'] / q)}, {_pct(low)} to {_pct(high)}) the reference "
            f"got right the candidate got wrong, and {scored['noise_turned_wrong']} of "
            f"{scored['noise_questions']} the reference's own second answers did: the "
            f"candidate's upper end is {_points(high - floor_low)} above the floor's lower end, "
            f"at most {_points(limit)} allowed."
        )
    if not errors_ok or result["candidate_errors"]:
        asked = result["prompts"] - result["reference_errors"]
        kinds = Counter(e["error"] for e in result["errors"])
        listed = ", ".join(f"{error} ×{count}" for error, count in kinds.most_common())
        allowed = f"{result['limits']['max_error_share']:.1%}"
        said.append(
            f"{result['candidate_errors']} of {asked} requests to the candidate failed "
            f"({listed}); at most {allowed} allowed."
        )
    if result["reference_errors"]:
        said.append(
            f"The reference failed {result['reference_errors']} of {result['prompts']} prompts; "
            "they were left out."
        )
    if not result["gate"]["opens"]:
        said.append(
            f"A pass on {result['suite_file']} does not open the go-live gate: "
            + "; ".join(result["gate"]["lacks"])
            + "."
        )
    fallbacks = result["fallbacks"]
    if fallbacks["tokens_differ"]:
        said.append(
            f"The candidate split {fallbacks['tokens_differ']} answers identical to the "
            "reference's into other tokens: their tokenizers differ, so KL and near ties were "
            "left out and every pair was judged on its meaning, or without embeddings its words."
        )
    elif fallbacks["without_logprobs"]:
        said.append(
            f"{fallbacks['without_logprobs']} of {n} pairs came without logprobs on a side: "
            "KL and near ties were not measured for them, only meaning and words."
        )
    if result["embedding_model"] is None:
        said.append(
            "No live pool serves an embedding model, so answers were judged on their words: a "
            "wrong fact after a near-tie flip goes unseen (name one with --embedding-model)."
        )
    elif result["embeddings_failed"]:
        said.append(
            f"{result['embeddings_failed']} pairs could not be embedded with "
            f"{result['embedding_model']} and were judged on their words."
        )
    return said


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _points(value: float) -> str:
    return f"{value * 100:.3g} points"
