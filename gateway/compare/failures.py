"""Failures: answers a client could not use, told apart from answers that differ. Pure.

Immature hardware fails in plain ways before subtle ones. A shadow copy's answer *fails*,
judged against the primary's answer to the same request, as one of these kinds:

| kind        | the copy                                                                      |
| ----------- | ----------------------------------------------------------------------------- |
| `error`     | got an HTTP error status, or no response                                      |
| `timeout`   | did not finish within its SLO class's timeout                                 |
| `broken`    | a stream that ended before its end, or a body that is no OpenAI response      |
| `null`      | a chat or completion answer with no text (`content: null`) and no tool calls  |
| `empty`     | an answer whose text is empty or whitespace; an embeddings answer without vectors |
| `cut_short` | stopped for length (`finish_reason: "length"`) where the primary finished     |
|             | (`"stop"`), or stopped where the primary finished with more: its words a      |
|             | strict prefix of the primary's, or fewer than `CUT_SHARE` of them             |

A kind the primary's answer shows too is no failure of the copy (both empty: the client got no
better). The primary's answer is judged the same way against the copy's (`failure(None,
primary, copy)`), so the judge counts, on the same requests, the answers where only the copy
failed and those where only the primary did (gateway/promotion/judge.py). Errors, timeouts and
broken streams are the copy's alone: a primary that failed is not mirrored.
"""

from __future__ import annotations

from gateway.compare.answers import Answer
from gateway.compare.measures import tokens

ERROR, TIMEOUT, BROKEN, NULL, EMPTY, CUT_SHORT = (
    "error",
    "timeout",
    "broken",
    "null",
    "empty",
    "cut_short",
)
KINDS = (ERROR, TIMEOUT, BROKEN, NULL, EMPTY, CUT_SHORT)
# The shadow path's upstream errors (gateway/shadow/mirror.py), by the kind of failure they are.
UPSTREAM = {
    "upstream_timeout": TIMEOUT,
    "stream_broken": BROKEN,
    "upstream_error": ERROR,
    "upstream_client_error": ERROR,
}
# An answer that stopped with fewer than this share of the words of a finished reference is cut
# short, when the reference has at least MIN_WORDS: a short answer may rightly be shorter still.
CUT_SHARE = 0.5
MIN_WORDS = 16


def failure(error: str | None, answer: Answer, reference: Answer) -> str | None:
    """Return the kind of failure `answer` is beside `reference`, or None if it is an answer.

    `error` is the shadow path's upstream error for the answer, if it had one.
    """
    if error is not None:
        return UPSTREAM.get(error, ERROR)
    if not answer.readable:
        return None if not reference.readable else BROKEN
    if reference.embeddings:
        return EMPTY if not answer.embeddings else None
    kind = _without_text(answer)
    if kind is not None:
        return None if _without_text(reference) == kind else kind
    if answer.tool_calls or reference.tool_calls or reference.finish_reason != "stop":
        return None  # a call is no text to cut; a reference that did not finish sets no length
    if _without_text(reference) is not None:
        return None
    if answer.finish_reason == "length":
        return CUT_SHORT
    return CUT_SHORT if _shorter(tokens(answer.text or ""), tokens(reference.text or "")) else None


def _without_text(answer: Answer) -> str | None:
    if answer.tool_calls:
        return None
    if answer.text is None:
        return NULL
    return EMPTY if not answer.text.strip() else None


def _shorter(words: list[str], reference: list[str]) -> bool:
    """Say whether an answer that stopped stopped short of the reference's words."""
    if len(words) >= len(reference):
        return False
    if reference[: len(words)] == words:
        return True
    return len(reference) >= MIN_WORDS and len(words) < CUT_SHARE * len(reference)
