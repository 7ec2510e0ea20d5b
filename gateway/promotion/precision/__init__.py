"""Precision checks: a fixed prompt suite replayed on a candidate pool and a reference, judged.

Shadow evidence takes days to gather; a precision check answers in minutes whether a part's
numerics change what it says, before it serves anyone. Every body of a suite (JSON lines of
OpenAI chat requests) is sent at temperature 0 with logprobs to one backend of the candidate
pool and twice to one backend of the reference pool. The reference's second answer is the noise
floor: a bf16 GPU is nondeterministic too, so the candidate is held to how far the reference
strays from itself, not to exact agreement. Every check is stored in `precision_checks`; a
shadow-only pool goes live only when its newest check passed (gateway/policy/apply.py).

- `plan`: the suite and what a check compares: candidate, reference, embedding model (pure).
- `check`: the check run: its suite file read, a backend of each pool found, the suite replayed.
- `limits`: what a check allows, and the fewest prompts that can show it (pure).
- `paired`, `rates`: the intervals a verdict rests on: turned-wrong shares on the same prompts,
  and departures per word at risk (pure).
- `figures`: a suite's outcomes folded into the check's figures and verdict (pure).
- `reasons`: why a check passed or failed, in sentences (pure).
- `results`: the checks kept in `precision_checks`, and each pool's newest.
"""
