"""What a precision check compares: the suite, the candidate, its reference, the embedding model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from gateway.errors import InvalidRequest
from gateway.policy.definition import Policy

DEFAULT_MAX_TOKENS = 256  # what a check asks of a prompt that names no limit


@dataclass(frozen=True, slots=True)
class Suite:
    """A prompt suite: chat request bodies, each with the line of the file it came from, and
    the SHA-256 of the file's bytes."""

    name: str
    bodies: tuple[tuple[int, dict[str, Any]], ...]
    sha256: str = ""

    @property
    def file(self) -> str:
        """Return the suite's file name, its folder aside: what a policy's `go_live` names."""
        return PurePath(self.name).name

    @property
    def models(self) -> list[str]:
        """Return the models the suite's bodies name, in first-seen order."""
        return list(dict.fromkeys(body["model"] for _, body in self.bodies))

    @property
    def distinct_prompts(self) -> int:
        """Return how many different questions the suite asks (model, messages, tools, format)."""
        asked = ("model", "messages", "tools", "response_format")
        return len(
            {json.dumps({k: b.get(k) for k in asked}, sort_keys=True) for _, b in self.bodies}
        )

    @property
    def fewest_max_tokens(self) -> int:
        """Return the smallest answer any prompt allows, in tokens."""
        return min(max_tokens(body) for _, body in self.bodies)


def max_tokens(body: dict[str, Any]) -> int:
    """Return how many tokens a check lets a prompt's answer run to."""
    for key in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(key), int):
            return int(body[key])
    return DEFAULT_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class Plan:
    """What a check compares: the candidate, the reference and the embedding model's pool;
    why the candidate's models have no labelled suite, where its `go_live` says so; and the
    paraphrase similarity the embedding model declares, where meaning is held as the live
    judge holds it (gateway/promotion/departures.py)."""

    pool: str
    reference: str
    embedding_model: str | None
    embedding_pool: str | None
    unlabelled: str | None = None
    paraphrase: float | None = None


def plan(
    policy: Policy,
    suite: Suite,
    pool: str,
    reference: str | None = None,
    embedding_model: str | None = None,
) -> Plan:
    """Choose the reference and the embedding model; raise InvalidRequest saying what is wrong.

    The reference defaults to the first live GPU pool that serves the suite's models; the
    embedding model to the first embedding model (`models:` of kind embedding) a live pool
    serves, embedded by the first live pool that serves it, as shadow comparisons are.
    """
    names = ", ".join(policy.pools)
    models = suite.models
    if pool not in policy.pools:
        raise InvalidRequest(f"the policy has no pool {pool!r} (pools: {names})", param="pool")
    missing = [m for m in models if m not in policy.pools[pool].models]
    if missing:
        raise InvalidRequest(
            f"pool {pool!r} does not serve {', '.join(missing)}, which {suite.name} asks for",
            param="pool",
        )
    if reference is None:
        reference = next(
            (
                name
                for name, spec in policy.pools.items()
                if spec.kind == "gpu" and spec.live and name != pool
                if all(m in spec.models for m in models)
            ),
            None,
        )
        if reference is None:
            raise InvalidRequest(
                f"no live gpu pool serves {', '.join(models)}: name the reference with "
                f"--reference (pools: {names})",
                param="reference",
            )
    elif reference not in policy.pools:
        raise InvalidRequest(
            f"the policy has no pool {reference!r} (pools: {names})", param="reference"
        )
    elif reference == pool:
        raise InvalidRequest(
            f"pool {pool!r} cannot be its own reference: its second answers are the noise floor",
            param="reference",
        )
    elif missing := [m for m in models if m not in policy.pools[reference].models]:
        raise InvalidRequest(
            f"reference pool {reference!r} does not serve {', '.join(missing)}",
            param="reference",
        )
    embedding_kinds = [m for m, spec in policy.models.items() if spec.kind == "embedding"]
    if embedding_model is None:
        embedding_model = next(
            (m for m in embedding_kinds if _embedding_pool(policy, m) is not None), None
        )
    embedding_pool = None if embedding_model is None else _embedding_pool(policy, embedding_model)
    if embedding_model is not None and embedding_pool is None:
        raise InvalidRequest(
            f"no live pool serves the embedding model {embedding_model!r}",
            param="embedding_model",
        )
    unlabelled = policy.pools[pool].go_live.unlabelled
    declared = policy.models.get(embedding_model) if embedding_model is not None else None
    paraphrase = None if declared is None else declared.paraphrase_similarity
    return Plan(pool, reference, embedding_model, embedding_pool, unlabelled, paraphrase)


def _embedding_pool(policy: Policy, model: str) -> str | None:
    return next((n for n, s in policy.pools.items() if s.live and model in s.models), None)
