"""all-MiniLM-L6-v2 converted to GGUF and served by llama-server, checked against numpy.

The reference here is independent of the file: a plain BERT forward pass in float32 over the
package's safetensors weights, mean pooled and normalised as the sentence-transformers model
does. It reads the token ids llama-server's /tokenize returns, so what is compared is the
numerics; the tokenizer is checked on its own, against the hash llama.cpp's converter keys the
pre-tokenizer name on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
from realworld import require
from safetensors.numpy import load_file

from realfleet import embedding, engine

ALIAS = "all-minilm-l6-v2"

SENTENCES = (
    "The cat sat on the mat.",
    "A cat was sitting on a rug.",
    "Stock prices fell sharply after the earnings report.",
    "Shares dropped when the company announced its quarterly results.",
    "How do I bake sourdough bread at home?",
    "Über-naïve café owners don't re-use 3.14 CPUs in São Paulo!",
)

# conversion/base.py's check text and the sha256 of the ids its tokenizer gives it, which that
# converter maps to embedding.PRE_TOKENIZER.
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
CHECK_HASH = "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f"


@pytest.fixture(scope="module")
def source() -> Path:
    require("the embedding model's package", embedding.ModelMissing, embedding.model_dir)
    return embedding.model_dir()


@pytest.fixture(scope="module")
def model_file(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedding.convert(tmp_path_factory.mktemp("embedding") / embedding.FILE_NAME, source)


@pytest.fixture(scope="module")
def server(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require("llama-server", engine.EngineMissing, engine.server_binary)
    log = tmp_path_factory.mktemp("embedding-server") / "llama-server.log"
    spec = engine.ServerSpec(model=model_file, alias=ALIAS, embeddings=True)
    with engine.serving(spec, log=log) as running:
        yield running.url


def tokenize(url: str, text: str) -> list[int]:
    reply = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": True}, timeout=30)
    reply.raise_for_status()
    return [int(t) for t in reply.json()["tokens"]]


def embed(url: str, texts: list[str]) -> np.ndarray:
    reply = httpx.post(f"{url}/v1/embeddings", json={"model": ALIAS, "input": texts}, timeout=60)
    reply.raise_for_status()
    data = sorted(reply.json()["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float64)


class Bert:
    """all-MiniLM-L6-v2 in float32 numpy: BERT encoder, mean pooling, L2 normalisation."""

    def __init__(self, source: Path) -> None:
        self.w = load_file(source / "model.safetensors")
        self.layers = 6
        self.heads = 12
        self.eps = 1e-12

    def _norm(self, x: np.ndarray, prefix: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        scale, shift = self.w[f"{prefix}.weight"], self.w[f"{prefix}.bias"]
        return (x - mean) / np.sqrt(var + self.eps) * scale + shift

    def _dense(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return x @ self.w[f"{prefix}.weight"].T + self.w[f"{prefix}.bias"]

    def __call__(self, ids: list[int]) -> np.ndarray:
        w, n = self.w, len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        erf = np.vectorize(math.erf, otypes=[np.float32])
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            d = x.shape[-1] // self.heads

            def heads(t: np.ndarray, d: int = d) -> np.ndarray:
                return t.reshape(n, self.heads, d).transpose(1, 0, 2)

            q = heads(self._dense(x, f"{p}.attention.self.query"))
            k = heads(self._dense(x, f"{p}.attention.self.key"))
            v = heads(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = (scores / scores.sum(-1, keepdims=True)) @ v
            attn = attn.transpose(1, 0, 2).reshape(n, -1)
            x = self._norm(
                x + self._dense(attn, f"{p}.attention.output.dense"),
                f"{p}.attention.output.LayerNorm",
            )
            h = self._dense(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))  # BERT's exact GELU
            x = self._norm(x + self._dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = x.mean(0).astype(np.float64)
        return pooled / np.linalg.norm(pooled)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_file_records_what_llama_cpp_s_bert_converter_writes(model_file: Path) -> None:
    reader = gguf.GGUFReader(model_file)

    def field(key: str) -> object:
        return reader.fields[key].contents()

    assert field("general.architecture") == "bert"
    assert field("bert.block_count") == 6 and field("bert.embedding_length") == 384
    assert field("bert.attention.head_count") == 12 and field("bert.context_length") == 512
    assert field("bert.attention.causal") is False
    assert field("bert.pooling_type") == gguf.PoolingType.MEAN
    assert field("tokenizer.ggml.model") == "bert"
    assert field("tokenizer.ggml.pre") == embedding.PRE_TOKENIZER
    assert field("tokenizer.ggml.token_type_count") == 2
    tokens: list[str] = field("tokenizer.ggml.tokens")  # type: ignore[assignment]
    types: list[int] = field("tokenizer.ggml.token_type")  # type: ignore[assignment]
    assert len(tokens) == 30522
    assert [tokens[i] for i in (0, 100, 101, 102, 103)] == [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    ]  # fmt: skip
    control = {i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL}
    assert control == {0, 100, 101, 102, 103}
    assert tokens[1996] == "\u2581the" and "ing" in tokens and "##ing" not in tokens
    ids = {
        key: field(f"tokenizer.ggml.{key}_token_id")
        for key in ("bos", "seperator", "unknown", "padding", "mask")
    }
    assert ids == {"bos": 101, "seperator": 102, "unknown": 100, "padding": 0, "mask": 103}

    kinds = {t.name: t.tensor_type for t in reader.tensors}
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert len(kinds) == 5 + 6 * 16  # the embeddings and their norm, 16 per layer, no pooler
    assert kinds["token_embd.weight"] == F16 and kinds["blk.0.attn_q.weight"] == F16
    assert kinds["blk.5.ffn_down.weight"] == F16
    assert kinds["position_embd.weight"] == F32 and kinds["token_types.weight"] == F32
    assert kinds["blk.0.attn_output_norm.weight"] == F32 and kinds["blk.0.attn_q.bias"] == F32
    assert all(
        kinds[n] == (F16 if n.endswith(".weight") and "norm" not in n else F32)
        for n in kinds
        if n.startswith("blk.")
    )


def test_ensure_converts_once(source: Path, tmp_path: Path) -> None:
    path = embedding.ensure(tmp_path)
    assert path == tmp_path / embedding.FILE_NAME
    written = path.stat().st_mtime_ns
    assert embedding.ensure(tmp_path) == path and path.stat().st_mtime_ns == written
    assert sorted(p.name for p in tmp_path.iterdir()) == [embedding.FILE_NAME]


def test_an_interrupted_conversion_leaves_no_file(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tensors = gguf.GGUFWriter.write_tensors_to_file

    def interrupted(writer: gguf.GGUFWriter, *, progress: bool = False) -> None:
        write_tensors(writer, progress=progress)
        raise KeyboardInterrupt  # as Ctrl-C would, after the bytes are out but before the rename

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedding.ensure(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_llama_server_tokenizes_the_check_text_as_the_reference_tokenizer_did(server: str) -> None:
    ids = tokenize(server, CHECK_TEXT)
    assert hashlib.sha256(str(ids).encode()).hexdigest() == CHECK_HASH


def test_embeddings_match_a_numpy_forward_pass(server: str, source: Path) -> None:
    bert = Bert(source)
    served = embed(server, list(SENTENCES))
    assert served.shape == (len(SENTENCES), 384)
    for text, vector in zip(SENTENCES, served, strict=True):
        ids = tokenize(server, text)
        assert ids[0] == 101 and ids[-1] == 102, ids  # [CLS] … [SEP]
        assert cosine(vector, bert(ids)) > 0.999, text
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-3


def test_close_sentences_score_higher_than_unrelated_ones(server: str) -> None:
    cat, rug, stocks, shares, bread = embed(server, list(SENTENCES[:5]))
    assert cosine(cat, rug) > max(cosine(cat, stocks), cosine(cat, bread)) + 0.2
    assert cosine(stocks, shares) > max(cosine(stocks, rug), cosine(stocks, bread)) + 0.2
