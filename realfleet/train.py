"""Train the fleet's model on the CPU: a small Llama that llama.cpp runs as it is written.

The architecture is llama.cpp's `llama` graph, so the trained weights need no conversion:
RMSNorm before attention and before the feed-forward, rotary positions on query and key in
llama.cpp's NORM layout (adjacent pairs rotate together; Hugging Face's layout rotates halves and
must be permuted on conversion), grouped-query attention, a SwiGLU feed-forward, and the output
projection tied to the token embedding (llama.cpp reuses `token_embd` when `output` is absent).

    python -m realfleet.train --out realfleet/models/tinyfacts-f16.gguf [--seed 0] [--steps 1200]

Torch is the `train` extra's, never the gateway's. One thread per core count is fixed and the
algorithms are deterministic, so the same seed on the same machine kind gives the same bytes.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from realfleet import corpus, tokenizer, weights
from realfleet.weights import Shape

STEPS = 1200  # of 32 windows of 128 tokens: 4.9 M tokens, 8 minutes on two quiet cores


def rotary(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate adjacent pairs of each head's dimensions by their position (llama.cpp's NORM)."""
    _, seq, _, dims = x.shape
    freq = base ** (-torch.arange(0, dims, 2, dtype=torch.float32) / dims)
    angle = torch.arange(seq, dtype=torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.s = s
        kv = s.kv_heads * s.head_dim
        self.attn_norm = RMSNorm(s.dim, s.norm_eps)
        self.attn_q = nn.Linear(s.dim, s.dim, bias=False)
        self.attn_k = nn.Linear(s.dim, kv, bias=False)
        self.attn_v = nn.Linear(s.dim, kv, bias=False)
        self.attn_output = nn.Linear(s.dim, s.dim, bias=False)
        self.ffn_norm = RMSNorm(s.dim, s.norm_eps)
        self.ffn_gate = nn.Linear(s.dim, s.ffn, bias=False)
        self.ffn_up = nn.Linear(s.dim, s.ffn, bias=False)
        self.ffn_down = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, (batch, seq, _) = self.s, x.shape
        h = self.attn_norm(x)
        q = rotary(self.attn_q(h).view(batch, seq, s.heads, s.head_dim), s.rope_base)
        k = rotary(self.attn_k(h).view(batch, seq, s.kv_heads, s.head_dim), s.rope_base)
        v = self.attn_v(h).view(batch, seq, s.kv_heads, s.head_dim)
        repeat = s.heads // s.kv_heads
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        attended = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.attn_output(attended.transpose(1, 2).reshape(batch, seq, s.dim))
        h = self.ffn_norm(x)
        return x + self.ffn_down(nn.functional.silu(self.ffn_gate(h)) * self.ffn_up(h))


class Model(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.s = s
        self.token_embd = nn.Embedding(s.vocab, s.dim)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.output_norm = RMSNorm(s.dim, s.norm_eps)
        nn.init.normal_(self.token_embd.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embd(ids)
        for block in self.blocks:
            x = block(x)
        return self.output_norm(x) @ self.token_embd.weight.T

    def tensors(self) -> dict[str, np.ndarray]:
        """Return the weights by their GGUF names, as float32 arrays of [out, in]."""
        out = {
            "token_embd.weight": self.token_embd.weight,
            "output_norm.weight": self.output_norm.weight,
        }
        for i, block in enumerate(self.blocks):
            for name, param in block.named_parameters():
                out[f"blk.{i}.{name}"] = param
        return {name: t.detach().float().numpy().copy() for name, t in out.items()}


def load(shape: Shape, tensors: dict[str, np.ndarray]) -> Model:
    """Return a model holding `tensors` (by their GGUF names), as `Model.tensors` gives them."""
    model = Model(shape)
    params = dict(model.named_parameters())
    names = {"token_embd.weight": "token_embd.weight", "output_norm.weight": "output_norm.weight"}
    names |= {f"blk.{i}.{n}": f"blocks.{i}.{n}" for i in range(shape.layers) for n, _ in
              model.blocks[0].named_parameters()}  # fmt: skip
    with torch.no_grad():
        for gguf_name, torch_name in names.items():
            params[torch_name].copy_(torch.from_numpy(tensors[gguf_name]))
    return model


def token_stream(tok: tokenizer.Tokenizer, seed: int, conversations: int) -> torch.Tensor:
    """Return the ids of `conversations` training conversations, end to end."""
    texts = itertools.islice(corpus.training_text(seed), conversations)
    return torch.tensor([i for text in texts for i in tok.encode(text)], dtype=torch.long)


def train(
    seed: int = corpus.SEED,
    steps: int = STEPS,
    batch: int = 32,
    window: int = 128,
    lr: float = 3e-3,
    conversations: int = 60_000,
    log_every: int = 200,
) -> tuple[Shape, tokenizer.Tokenizer, dict[str, np.ndarray]]:
    """Train the model of `seed`; return its shape, tokenizer and weights."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    tok = tokenizer.train(itertools.islice(corpus.training_text(seed), conversations // 3))
    stream = token_stream(tok, seed, conversations)
    shape = Shape(vocab=len(tok.tokens))
    model = Model(shape)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    draws = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 20)
    started = time.monotonic()
    for step in range(steps):
        scale = min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimiser.param_groups:
            group["lr"] = lr * max(scale, 0.02)
        starts = torch.randint(0, len(stream) - window - 1, (batch,), generator=draws)
        chunk = torch.stack([stream[s : s + window + 1] for s in starts.tolist()])
        logits = model(chunk[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, shape.vocab), chunk[:, 1:].reshape(-1)
        )
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            elapsed = time.monotonic() - started
            print(f"step {step:5d}  loss {loss.item():.4f}  {elapsed:6.0f} s", flush=True)
    return shape, tok, model.tensors()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m realfleet.train", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=corpus.SEED)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape, tok, tensors = train(args.seed, args.steps)
    weights.write(args.out, shape, tok, tensors, precision="f16")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
