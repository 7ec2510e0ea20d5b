"""What the fuzzing in test_openapi.py does not send as valid data: requests the description
admits that the gateway or the simulated backends refuse by a rule JSON Schema cannot state.

Schemathesis loads this module (SCHEMATHESIS_HOOKS) and sends every case but these; every
invalid case is sent. Each rule is stated in the description's words (gateway/routing/bodies.py)
or is what the simulators serve:

- a prompt and the tokens it asks for fit a context together, which routing checks: a valid
  case asks for at most half the largest context (FUZZ_LONGEST_ANSWER), so that its prompt
  fits beside;
- `best_of` is at least `n`, and `min_tokens` at most `max_tokens`;
- the simulators answer one prompt once (no `n` or `best_of` past 1, no batched prompts), at
  the pace of the hardware they simulate: an answer asks for no length of its own
  (`min_tokens`, `ignore_eos`), which would outlast the fuzzer's wait;
- the simulators read an integer only as one written without a fraction (`64`, not `64.0`,
  which JSON Schema, the gateway and other engines take for the same number).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

LONGEST = int(os.environ.get("FUZZ_LONGEST_ANSWER", "0"))
LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
INTEGERS = (*LIMITS, "n", "best_of", "min_tokens", "prompt", "input")


def _fraction(value: Any) -> bool:
    """Say whether a number, or a list (of lists) of numbers, holds one written as a float."""
    if isinstance(value, list):
        return any(_fraction(v) for v in value)
    return isinstance(value, float)


def _number(body: dict[str, Any], field: str) -> float:
    """Return a field's number, 0 where it is none (a field the endpoint does not read)."""
    value = body.get(field)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _served(body: dict[str, Any]) -> bool:
    """Say whether a valid /v1 body is one the gateway and the simulators serve."""
    if any(_number(body, field) > LONGEST for field in LIMITS):
        return False
    if _number(body, "n") > 1 or _number(body, "best_of") > 1:
        return False
    if body.get("min_tokens") or body.get("ignore_eos"):
        return False
    if any(_fraction(body.get(field)) for field in INTEGERS):
        return False
    prompt = body.get("prompt")
    return not (isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int))


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Send every invalid case, and every valid one the gateway and the simulators serve."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not case.path.startswith("/v1/"):
        return True
    return not isinstance(case.body, dict) or _served(case.body)
