"""What a precision check allows, the fewest prompts that can show it, and what a suite needs
for its pass to open the go-live gate."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.promotion.precision.paired import prompts_needed

ALPHA = 0.05  # the intervals are 95%: a limit is held to their upper end, at 97.5% one-sided
MAX_HARMFUL_SHARE = 0.03
MAX_ERROR_SHARE = 0.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What a check allows: departures beyond the noise floor's, and failed requests."""

    max_harmful_share: float = MAX_HARMFUL_SHARE
    max_error_share: float = MAX_ERROR_SHARE
    alpha: float = ALPHA


# The limits a check holds a pool to unless the operator names others.
DEFAULT_LIMITS = Limits()


# A pass opens the go-live gate only on a suite that could have failed: at least as many
# different prompts as it takes to show the default limit with no departure on either side
# (125: the paired interval's upper end is then 2.98 points, gateway/promotion/precision/paired.py),
# each allowed an answer of 64 tokens or more (a one-token answer shows only its first token,
# and the labelled facts the fleet is checked on answer in up to 64).
MIN_DISTINCT_PROMPTS = prompts_needed(MAX_HARMFUL_SHARE, ALPHA)
MIN_MAX_TOKENS = 64
