"""What a precision check allows, the fewest prompts that can show it, and what a suite needs
for its pass to open the go-live gate."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.promotion.judge import bernoulli_interval

ALPHA = 0.05  # the intervals are 95%
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


def prompts_needed(limit: float, alpha: float = ALPHA) -> int:
    """Return the fewest prompts whose interval, with no departure, ends at or below `limit`."""
    if limit >= 1:
        return 1
    low, high = 1, 1
    while bernoulli_interval(0, high, alpha)[1] > limit:
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if bernoulli_interval(0, mid, alpha)[1] > limit:
            low = mid + 1
        else:
            high = mid
    return high


# A pass opens the go-live gate only on a suite that could have failed: at least as many
# different prompts as it takes to show the default limit with no departure and no noise (230,
# at the alpha/2 each of the candidate's share and the floor's holds at),
# each allowed an answer of 64 tokens or more (a one-token answer shows only its first token,
# and the labelled facts the fleet is checked on answer in up to 64).
MIN_DISTINCT_PROMPTS = prompts_needed(MAX_HARMFUL_SHARE, ALPHA / 2)
MIN_MAX_TOKENS = 64
