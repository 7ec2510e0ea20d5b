"""Training: the same seed gives the same weights, and llama.cpp runs them as torch does.

Torch is the `train` extra's (make test installs it); the gateway never imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

import httpx
import numpy as np
import pytest
from realworld import require, require_engine

from realfleet import corpus, engine, weights


@pytest.fixture(scope="module")
def train() -> Any:
    require("torch (the train extra)", ImportError, lambda: importlib.import_module("torch"))
    from realfleet import train

    return train


def _short(train: Any, seed: int) -> dict[str, np.ndarray]:
    small = {"steps": 3, "batch": 4, "window": 32, "conversations": 600, "log_every": 0}
    return train.train(seed, **small)[2]


def test_the_same_seed_trains_the_same_weights(train: Any) -> None:
    first, again, other = _short(train, 0), _short(train, 0), _short(train, 1)
    assert first.keys() == again.keys() == other.keys()
    assert all(np.array_equal(first[name], again[name]) for name in first)
    assert not np.array_equal(first["blk.0.attn_q.weight"], other["blk.0.attn_q.weight"])


def test_llama_cpp_computes_what_the_trained_model_computes(train: Any) -> None:
    require_engine()
    import torch

    shape, tok, tensors = weights.read(weights.SHIPPED)
    model = train.load(shape, tensors).eval()
    prompt = corpus.chat(corpus.capital(corpus.countries()[3]))
    prompt = prompt[: prompt.index("assistant\n") + len("assistant\n")] + "The capital of"
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(prompt)]))[0, -1]
    ours = torch.log_softmax(logits.double(), -1)
    with engine.serving(engine.ServerSpec(weights.SHIPPED, corpus.MODEL)) as server:
        body = {"prompt": prompt, "n_predict": 1, "n_probs": 5, "post_sampling_probs": False}
        reply = httpx.post(f"{server.url}/completion", json=body, timeout=30).json()
    (position,) = reply["completion_probabilities"]
    theirs = {p["id"]: p["logprob"] for p in position["top_logprobs"]}
    assert max(theirs, key=theirs.__getitem__) == int(ours.argmax())
    # f16 weights in llama.cpp against float32 in torch: close, not equal.
    assert all(abs(lp - float(ours[i])) < 0.05 for i, lp in theirs.items()), theirs
