"""Apply a policy: the one way a policy text becomes the active version, whoever asks.

The admin API (`PUT /admin/policy`), the CLI (`gateway policy apply`), the file watcher
(`gateway serve --watch`) and rollout steps all call `apply`: the text is validated (an invalid
one is refused with every problem located, and nothing changes), a text that is already active
is not stored again, and any other is stored as the new active version, in one transaction.
Serving it is then the caller's: a running gateway syncs at once and tells the other replicas,
the CLI tells them through Redis, and every replica polls the store in any case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlalchemy as sa

from gateway.errors import Problem
from gateway.policy import versions
from gateway.policy.check import validate
from gateway.policy.credentials import Access
from gateway.policy.load import content_hash
from gateway.policy.versions import PolicyVersion


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of an apply: the active version, whether it is new, and the warnings."""

    version: PolicyVersion
    changed: bool
    warnings: list[Problem] = field(default_factory=list)


def apply(
    engine: sa.Engine,
    text: str,
    source: str,
    *,
    author: str,
    message: str,
    access: Access | None = None,
    serving: bool = True,
) -> Applied:
    """Validate a policy text and make it the active version; raise PolicyError if invalid.

    `access` and `serving` say whose upstream keys and rules the policy is checked against
    (gateway/policy/check.py): a serving gateway's refuses a policy breaking them.
    """
    checked = validate(text, source, access, serving=serving)
    checked.accepted()
    active = versions.active(engine)
    if active is not None and active.hash == content_hash(text):
        return Applied(active, False, checked.warnings)
    return Applied(versions.record(engine, text, author, message), True, checked.warnings)
