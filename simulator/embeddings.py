"""Embedding vectors: the sum of a text's concepts, so texts that mean the same embed alike.

Each concept (a pair of synonyms in simulator/words.py, or any other word of four letters or more
that is not a function word) has a fixed random direction per model; a text's vector is the unit
sum of its concepts' directions. Rewording with synonyms leaves the vector as it was, a changed
fact moves it, as a sentence-embedding model does. Analog parts add noise to every component.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from random import Random

import numpy as np

from simulator.answers import stable_seed
from simulator.words import FUNCTION_WORDS, concept

_WORD = re.compile(r"\w+")
_SKIPPED = frozenset(FUNCTION_WORDS)


def embed(model: str, text: str, dimensions: int, *, noise: float, rng: Random) -> list[float]:
    """Return the unit vector a device computes for `text`.

    `noise` is the standard deviation of the error added to each component, relative to a
    component's typical size (1/sqrt(dimensions)); 0 gives the reference vector.
    """
    reference = _reference(model, text, dimensions)
    if noise <= 0:
        return reference.tolist()
    spread = noise / math.sqrt(dimensions)
    error = np.random.default_rng(rng.getrandbits(64)).standard_normal(dimensions)
    noisy = reference + spread * error
    return (noisy / np.linalg.norm(noisy)).tolist()


@lru_cache(maxsize=4096)
def _reference(model: str, text: str, dimensions: int) -> np.ndarray:
    keys = [_key(word) for word in _WORD.findall(text.lower()) if word not in _SKIPPED]
    total = np.zeros(dimensions)
    for key in keys or [text]:
        total += _direction(model, key, dimensions)
    norm = np.linalg.norm(total)
    return total / norm if norm > 0 else _direction(model, text, dimensions)


def _key(word: str) -> str:
    found = concept(word)
    return word if found is None else f"concept:{found}"


@lru_cache(maxsize=65536)
def _direction(model: str, key: str, dimensions: int) -> np.ndarray:
    draw = np.random.default_rng(stable_seed("embedding", model, key))
    vector = draw.standard_normal(dimensions)
    vector /= np.linalg.norm(vector)
    vector.flags.writeable = False
    return vector
