"""What a precision check allows, the fewest prompts that can show it, and what a suite needs
for its pass to open the go-live gate.

Both limits come from the real fleet (docs/precision.md, "Where the thresholds come from"):

- `MAX_TURNED_WRONG`, labelled questions the candidate answers wrong beyond the noise floor:
  3 points passes Q8_0 (none of 720 turned wrong) with room for two accidents in 240, and fails
  the analog part at 10 dB (3.75% turned wrong) in all but 0.56% of checks.
- `MAX_DEPARTURE_RATE`, departures in meaning per word at risk beyond the floor's
  (gateway/promotion/precision/rates.py): the rate at which the real parts swept in read noise
  begin to turn more than `MAX_TURNED_WRONG` of the labelled questions wrong
  (`python -m bench.departure_limit`, docs/results/departure-limit.json). An unlabelled suite
  holds a part to the rate of one the labels would just fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.promotion.precision.paired import prompts_needed

ALPHA = 0.05  # the intervals are 95%: a limit is held to their upper end, at 97.5% one-sided
MAX_TURNED_WRONG = 0.03
MAX_DEPARTURE_RATE = 0.0035  # 3.5 departures per 1,000 words at risk
MAX_ERROR_SHARE = 0.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What a check allows beyond the noise floor: departures per word, labelled answers
    turned wrong; and failed requests."""

    max_departure_rate: float = MAX_DEPARTURE_RATE
    max_turned_wrong: float = MAX_TURNED_WRONG
    max_error_share: float = MAX_ERROR_SHARE
    alpha: float = ALPHA


# The limits a check holds a pool to unless the operator names others.
DEFAULT_LIMITS = Limits()


# A pass opens the go-live gate only on a suite that could have failed: at least as many
# different prompts as it takes to show the turned-wrong limit with none on either side
# (125: the paired interval's upper end is then 2.98 points, gateway/promotion/precision/paired.py),
# each allowed an answer of 64 tokens or more (a one-token answer shows only its first token,
# and the labelled facts the fleet is checked on answer in up to 64).
MIN_DISTINCT_PROMPTS = prompts_needed(MAX_TURNED_WRONG, ALPHA)
MIN_MAX_TOKENS = 64
