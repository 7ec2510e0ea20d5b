"""Embeddings are deterministic unit vectors; analog noise moves them only slightly."""

import math
from random import Random

from simulator.embeddings import embed


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_vector_is_unit_length_and_the_same_every_time():
    first = embed("bge-large-en-v1.5", "hello", 1024, noise=0.0, rng=Random(1))
    again = embed("bge-large-en-v1.5", "hello", 1024, noise=0.0, rng=Random(2))
    assert first == again
    assert math.isclose(_dot(first, first), 1.0, rel_tol=1e-9)


def test_different_inputs_give_nearly_orthogonal_vectors():
    a = embed("bge-large-en-v1.5", "hello", 1024, noise=0.0, rng=Random(0))
    b = embed("bge-large-en-v1.5", "goodbye", 1024, noise=0.0, rng=Random(0))
    assert abs(_dot(a, b)) < 0.2


def test_noise_moves_the_vector_slightly_and_keeps_it_unit_length():
    clean = embed("bge-large-en-v1.5", "hello", 1024, noise=0.0, rng=Random(0))
    noisy = embed("bge-large-en-v1.5", "hello", 1024, noise=0.05, rng=Random(0))
    assert noisy != clean
    assert 0.99 < _dot(clean, noisy) < 1.0
    assert math.isclose(_dot(noisy, noisy), 1.0, rel_tol=1e-9)


def test_a_rewording_with_synonyms_embeds_alike_and_a_changed_fact_does_not():
    def vector(text):
        return embed("bge-large-en-v1.5", text, 1024, noise=0.0, rng=Random(0))

    said = vector("The big market is near the river, and the price is low.")
    reworded = vector("The large bazaar is close to the stream; the fare is low.")
    wrong = vector("The big market is far from the river, and the price is high.")
    assert _dot(said, reworded) > 0.999
    assert 0.3 < _dot(said, wrong) < 0.9
