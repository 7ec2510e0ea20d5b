"""Suites pinned by hash: a go-live check counts only on the exact suite its rule names.

A suite is its bytes, not its file name: a suite edited to leave out the prompts a part gets
wrong would pass under the same name. So every suite a pool's `go_live` names is pinned by the
SHA-256 of its file: the rule's own `suite_sha256`, or for a suite the project ships
(`suites/`) the hash it ships with (`SHIPPED`, held to the files by tests/policy/test_suites.py).
A suite neither ships nor is pinned by its rule opens no gate, and `gateway precision check`
refuses to run a suite whose hash is not its pin.
"""

from __future__ import annotations

from gateway.policy.definition import GoLive

SHIPPED = {
    "chat.jsonl": "f75e96096f91d268b0673401f94c8efb639e8fc87bd4a1e633d66b819e407db0",
    "facts.jsonl": "9d235e5fbf9d6c7550038d6c029aa1cf5aa47c14d44ee70c2008f494b78a622b",
    "json.jsonl": "45d62d837d7770fabc5c11aac670fb82a63bdaa428848160d7a844c8c5571376",
    "stories.jsonl": "3487c4bfe3b7a8113d72f175ca30028f77733aa9f205695eef77dec1d3eebfeb",
    "tools.jsonl": "76c5155dc9f8d4a635ded2ba7681be665945b5dd50200583f2835a70c2d8eff0",
}


def pin(rule: GoLive) -> str | None:
    """Return the SHA-256 a check's suite must have to count under `rule`; None: not pinned."""
    return rule.suite_sha256 or SHIPPED.get(rule.suite)


def unpinned(suite: str, sha256: str, rule: GoLive) -> str | None:
    """Say why a suite read as `suite` (a file name) with `sha256` is not the one `rule` pins,
    or None when it is, or when the rule names another suite."""
    if suite != rule.suite:
        return None
    pinned = pin(rule)
    if pinned is None:
        return (
            f"go_live names {rule.suite}, which the project does not ship, without its"
            " suite_sha256: pin the suite's hash in go_live"
        )
    if sha256 != pinned:
        source = "go_live pins" if rule.suite_sha256 else "the project ships"
        return (
            f"its {suite} (sha256 {sha256[:12]}…) is not the one {source} ({pinned[:12]}…):"
            " a suite changed is another suite; pin the new one's hash in go_live.suite_sha256"
        )
    return None


def refused(suite: str, sha256: str, rule: GoLive) -> str | None:
    """Say why a check may not run a suite read as `suite` with `sha256`: its hash is not the
    pin of the suite of that name (the pool's rule's, or the shipped one's); None if it may."""
    if suite == rule.suite:
        return None if pin(rule) is None else unpinned(suite, sha256, rule)
    shipped = SHIPPED.get(suite)
    if shipped is None or sha256 == shipped:
        return None
    return (
        f"its {suite} (sha256 {sha256[:12]}…) is not the one the project ships"
        f" ({shipped[:12]}…): a suite changed is another suite; give it a name of its own"
    )
