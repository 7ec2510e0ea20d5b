"""The fleet's model: its files, its tokenizer as llama.cpp reads it, and what each part knows.

The f16 file ships; the Q8_0 and analog parts are derived from it. On the real engines, at
temperature 0 and one request at a time (so every answer is determined by the weights), the
reference and the int8 part answer nearly every labelled question right (239 of 240, the same
one wrong), and the analog part loses a measurable share: "harmful" is a fact about the
weights, not a label.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
import tokenizers
import yaml
from realworld import require_engine

from gateway.promotion.precision.labels import states
from realfleet import corpus, engine, fleet, weights

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, weights.Part]:
    return weights.derive(tmp_path_factory.mktemp("parts"))


def test_the_suites_are_what_the_corpus_makes() -> None:
    for name in corpus.SUITES:
        assert (ROOT / corpus.suite_file(name)).read_text().splitlines() == corpus.suite_lines(name)
    facts = [json.loads(line) for line in (ROOT / "suites/facts.jsonl").read_text().splitlines()]
    assert len(facts) >= 205 and all(line["expected"] for line in facts)
    assert len({line["messages"][0]["content"] for line in facts}) == len(facts)


def test_the_tokenizer_reads_the_same_for_hugging_face_clients() -> None:
    # Load generators (aiperf) count a trace's tokens with `transformers`: the exported
    # tokenizer.json must give the ids the engine computes, markers and digits included.
    tok = weights.tokenizer(weights.SHIPPED)
    exported = tokenizers.Tokenizer.from_str(json.dumps(tok.hugging_face()))
    texts = [line for name in corpus.SUITES for line in corpus.suite_lines(name)]
    texts.append(f"{corpus.START}user\nWhat is 1234 + 56?  Tabs\tand  spaces{corpus.END}\n")
    for text in texts:
        assert exported.encode(text, add_special_tokens=False).ids == tok.encode(text), text
        assert exported.decode(tok.encode(text), skip_special_tokens=False) == text


def test_the_derived_parts_are_q8_0_and_noise_at_the_stated_ratio(
    parts: dict[str, weights.Part],
) -> None:
    _, _, reference = weights.read(weights.SHIPPED)
    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(parts["q8_0"].path).tensors}
    assert kinds["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert kinds["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    _, _, noisy = weights.read(parts["analog"].path)
    for name, w in reference.items():
        if name.endswith("norm.weight"):
            assert np.array_equal(noisy[name], w), name  # the digital periphery is exact
            continue
        # The smallest matrix has 12,288 weights: its noise power is within 1.3% (0.06 dB, one
        # standard deviation) of the stated one, and the seed is fixed.
        snr_db = 10 * np.log10(np.mean(w**2) / np.mean((noisy[name] - w) ** 2))
        assert abs(snr_db - weights.ANALOG_SNR_DB) < 0.25, (name, snr_db)


def test_a_q6_k_part_reads_back_within_six_bits_and_falls_back_as_llama_cpp_does(
    tmp_path: Path,
) -> None:
    shape, tok, tensors = weights.read(weights.SHIPPED)
    path = weights.write(tmp_path / "q6_k.gguf", shape, tok, tensors, "q6_k")
    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    # Rows of 512 weights are Q6_K; rows of 192 are no multiple of 256 and fall back to Q8_0.
    assert kinds["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q6_K
    assert kinds["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    _, _, read = weights.read(path)
    w = tensors["blk.0.ffn_down.weight"]
    # Read back by gguf's own Q6_K reader: 6 bits leave about 2% of the weights' RMS.
    error = np.sqrt(np.mean((read["blk.0.ffn_down.weight"] - w) ** 2) / np.mean(w**2))
    assert 0.001 < error < 0.03


def test_parts_are_derived_once(parts: dict[str, weights.Part]) -> None:
    folder = parts["f16"].path.parent
    written = {p: part.path.stat().st_mtime_ns for p, part in parts.items()}
    again = weights.derive(folder)
    assert {p: part.path.stat().st_mtime_ns for p, part in again.items()} == written


def test_the_policy_describes_the_engines_the_fleet_starts() -> None:
    doc = yaml.safe_load(fleet.POLICY.read_text())
    for backend in fleet.BACKENDS:
        pool = doc["pools"][backend.pool]
        assert backend.name in [b["name"] for b in pool["backends"]]
        assert pool["slots_per_backend"] == backend.slots
        # llama.cpp gives each slot context / slots tokens (the embedding model: its 512).
        per_slot = backend.context // backend.slots
        assert pool["max_context"] == (
            min(per_slot, 512) if backend.part == "embedding" else per_slot
        )


@pytest.fixture(scope="module")
def servers(parts: dict[str, weights.Part]) -> Iterator[dict[str, engine.Server]]:
    require_engine()
    started: dict[str, engine.Server] = {}
    try:
        for precision, part in parts.items():
            spec = engine.ServerSpec(part.path, corpus.MODEL, seed=1)
            started[precision] = engine.start(spec)
        yield started
    finally:
        for server in started.values():
            engine.stop(server)


def test_llama_cpp_tokenizes_as_the_model_was_trained(servers: dict[str, engine.Server]) -> None:
    tok = weights.tokenizer(weights.SHIPPED)
    texts = [corpus.chat(p) for name in corpus.SUITES for p in corpus.suite(name)]
    with httpx.Client(base_url=servers["f16"].url, timeout=30) as http:
        for text in texts:
            ids = http.post("/tokenize", json={"content": text, "parse_special": True}).json()
            assert ids["tokens"] == tok.encode(text), text


def _accuracy(server: engine.Server) -> float:
    right = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for prompt in corpus.suite("facts"):
            body = {
                "messages": [{"role": "user", "content": prompt.question}],
                "max_tokens": corpus.SUITE_MAX_TOKENS,
                "temperature": 0,
            }
            reply = http.post("/v1/chat/completions", json=body).json()
            text = reply["choices"][0]["message"]["content"]
            assert prompt.expected is not None
            right.append(states(text, prompt.expected))
    return sum(right) / len(right)


def test_the_analog_part_loses_labelled_accuracy_and_int8_does_not(
    servers: dict[str, engine.Server],
) -> None:
    accuracy = {precision: _accuracy(server) for precision, server in servers.items()}
    assert accuracy["f16"] >= 0.95, accuracy
    assert accuracy["q8_0"] >= accuracy["f16"] - 0.01, accuracy
    assert accuracy["analog"] <= accuracy["f16"] - 0.10, accuracy
