"""Embedding vectors: a deterministic unit vector per (model, input), noisy on analog parts."""

from __future__ import annotations

import math
from functools import lru_cache
from random import Random

from simulator.answers import stable_seed


def embed(model: str, text: str, dimensions: int, *, noise: float, rng: Random) -> list[float]:
    """Return the unit vector a device computes for `text`.

    `noise` is the standard deviation of the error added to each component, relative to a
    component's typical size (1/sqrt(dimensions)); 0 gives the reference vector.
    """
    reference = _reference(model, text, dimensions)
    if noise <= 0:
        return list(reference)
    spread = noise / math.sqrt(dimensions)
    return _unit([value + rng.gauss(0.0, spread) for value in reference])


@lru_cache(maxsize=4096)
def _reference(model: str, text: str, dimensions: int) -> tuple[float, ...]:
    draw = Random(stable_seed("embedding", model, text))
    return tuple(_unit([draw.gauss(0.0, 1.0) for _ in range(dimensions)]))


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(value * value for value in vector))
    return [value / norm for value in vector]
