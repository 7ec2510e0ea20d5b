"""Why a precision check passed or failed, said in sentences with its numbers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gateway.promotion.precision.limits import ALPHA
from gateway.promotion.precision.rates import rate_interval, words_needed


def reasons(
    result: Mapping[str, Any], departs_ok: bool, errors_ok: bool, alpha: float = ALPHA
) -> list[str]:
    """Say in sentences why a check passed or failed, with its numbers."""
    said = []
    n, limits = result["compared"], result["limits"]
    limit = limits["max_departure_rate"]
    level = f"{1 - alpha:.0%}"
    if n == 0:
        said.append(
            "No answer of the candidate could be compared with the reference's, so nothing "
            "shows that it answers alike."
        )
    else:
        k = len(result["departures"])
        low, high = result["ci"]["excess"]
        floor = result["noise_harmful_share"]
        noise_k = round((floor or 0.0) * result["noise_pairs"])
        words = result["words_at_risk"]
        said.append(
            f"{k} of {n} answers ({_pct(k / n)}) depart in meaning from the reference's, and "
            f"{noise_k} of {result['noise_pairs']} ({_pct(floor or 0.0)}) of the reference's "
            f"own second answers do. Per 1,000 words at risk on the {result['paired_prompts']} "
            f"prompts both compared, the candidate departs {_per_k(result['departure_rate'])} "
            f"times (over {words:,} words) and the floor {_per_k(result['noise_departure_rate'])}"
            f": {_per_k(result['excess'])} more ({level} interval {_per_k(low)} to "
            f"{_per_k(high)}), at most {_per_k(limit)} allowed."
        )
        for band in result.get("bands", ()):
            if not band["passes"] and band["prompts"] < result["paired_prompts"]:
                low, high = band["ci"]
                said.append(
                    f"Answers of {band['words']} words ({band['prompts']} prompts) are judged on"
                    f" their own: the candidate departs {band['departures']} times over"
                    f" {band['words_at_risk']:,} words at risk, the floor"
                    f" {band['noise_departures']}: {_per_k(low)} to {_per_k(high)} more per"
                    f" 1,000 words ({level} interval), at most {_per_k(limit)} allowed."
                )
        needed = words_needed(limit, alpha) if limit > 0 else None
        if not departs_ok and needed is not None and words < needed:
            said.append(
                f"No pool can pass on {words:,} words at risk: even with no departure the "
                f"interval reaches {_per_k(rate_interval(0, words, alpha)[1])} per 1,000 words;"
                f" a suite needs answers of at least {needed:,} words in all to show at most "
                f"{_per_k(limit)}."
            )
    scored = result.get("labelled")
    if scored:
        q, (low, high) = scored["questions"], scored["ci"]["excess"]
        said.append(
            f"Of {q} labelled questions the candidate answered {scored['candidate_right']} "
            f"right and the reference {scored['reference_right']}; {scored['turned_wrong']} "
            f"({_pct(scored['turned_wrong'] / q)}) the reference got right the candidate got "
            f"wrong, and {scored['noise_turned_wrong']} of {scored['noise_questions']} the "
            f"reference's own second answers did: the candidate turns "
            f"{_points(scored['excess'] or 0.0)} more wrong ({level} interval {_points(low)} to "
            f"{_points(high)}), at most {_points(limits['max_turned_wrong'])} allowed."
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
    gate = result["gate"]
    if not gate["opens"]:
        short = list(gate["lacks"])
        if gate["labelled"] < gate["labelled_needed"] and gate.get("unlabelled") is None:
            short.append(
                f"it holds {gate['labelled']} labelled questions, {gate['labelled_needed']}"
                f" needed, and the pool's go_live.unlabelled gives no reason its models have none"
            )
        said.append(
            f"A pass on {result['suite_file']} does not open the go-live gate: "
            + "; ".join(short)
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


def _per_k(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.3g}"


def _points(value: float) -> str:
    return f"{value * 100:.3g} points"
