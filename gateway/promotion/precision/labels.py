"""A suite line's labels (suites/facts.jsonl): what kind of question it is and its right answer.

They describe the prompt and are never sent upstream. Where a line has them, a check scores
each answer right or wrong, so a wrong fact is seen even where its words and meaning stay close.
"""

from __future__ import annotations

import re

LABELS = ("kind", "expected")


def states(answer: str, expected: str) -> bool:
    """Say whether an answer states the expected fact (as a whole word or number)."""
    return re.search(rf"(?<![\w]){re.escape(expected)}(?![\w])", answer) is not None
