"""A pool's serving engine and its version are `engine` and `engine_version`: the former
`runtime` ('vllm 0.6.3', the engine and its version in one string) is retired (the loader reads
it, validation and apply refuse it), so every stored policy version that has one is rewritten
here, in place, comments and layout kept: `runtime: "vllm 0.6.3"` of a vllm pool becomes
`engine_version: "0.6.3"` (gateway/policy/definition.py `engine_version_of`), and each
rewritten version's hash is its new content's. A rollback to any version then passes
validation. Downgrading writes them back.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import yaml
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

log = logging.getLogger("alembic.runtime.migration")
# (old value, the pool's engine) -> the new value; None writes null.
Convert = Callable[[str, Any], str | None]


def upgrade() -> None:
    rewrite_stored(op.get_bind(), "runtime", "engine_version", _engine_version_of)


def downgrade() -> None:
    rewrite_stored(op.get_bind(), "engine_version", "runtime", runtime_of)


def _engine_version_of(runtime: str, engine: Any) -> str | None:
    from gateway.policy.definition import engine_version_of

    return engine_version_of(runtime, engine)


def runtime_of(version: str, engine: Any) -> str:
    """Return the former `runtime` of an engine version: the engine's name and its version."""
    return f"{engine} {version}" if isinstance(engine, str) else version


def rewrite_stored(conn: sa.Connection, old: str, new: str, convert: Convert) -> int:
    """Rewrite every stored policy version whose pools have `old`; return how many were."""
    from gateway.policy.load import content_hash

    table = sa.table(
        "policy_versions", sa.column("version"), sa.column("content"), sa.column("hash")
    )
    # Only versions that mention the key are read, one at a time: a long history stays small.
    candidates = conn.execute(
        sa.select(table.c.version).where(table.c.content.like(f"%{old}%"))
    ).scalars()
    rewritten = 0
    for version in list(candidates):
        content = conn.execute(
            sa.select(table.c.content).where(table.c.version == version)
        ).scalar_one()
        text = renamed(content, old, new, convert)
        if text != content:
            conn.execute(
                table.update()
                .where(table.c.version == version)
                .values(content=text, hash=content_hash(text))
            )
            rewritten += 1
    log.info("rewrote %s as %s in %d stored policy versions", old, new, rewritten)
    return rewritten


def renamed(text: str, old: str, new: str, convert: Convert) -> str:
    """Return the policy text with each pool's `old` key written as `new`, its value converted,
    everything else as it was; the text itself when no pool has `old` or it does not parse."""
    from gateway.policy.load import PolicyLoader

    loader = PolicyLoader(text)
    try:
        root = loader.get_single_node()
        pools = _field(root, "pools")
        edits = []
        for _, pool in pools.value if isinstance(pools, yaml.MappingNode) else ():
            if not isinstance(pool, yaml.MappingNode):
                continue
            fields = {k.value: (k, v) for k, v in pool.value if isinstance(k, yaml.ScalarNode)}
            if old not in fields or new in fields:
                continue
            key, value = fields[old]
            engine = fields.get("engine")
            was = loader.construct_object(value, deep=True)
            if was is None:
                converted = None
            else:
                name = loader.construct_object(engine[1], deep=True) if engine else None
                converted = convert(str(was), name)
            # A double-quoted YAML scalar: a version is printable ASCII, which JSON writes as is.
            written = "null" if converted is None else json.dumps(converted)
            start, end = value.start_mark.index, value.end_mark.index
            # A comment after it on the line keeps its column where the line has room.
            spaces = len(text[end:]) - len(text[end:].lstrip(" "))
            if text[end + spaces : end + spaces + 1] == "#":
                grown = len(new) - len(old) + len(written) - (end - start)
                written += " " * max(1, spaces - grown)
                end += spaces
            edits += [(key.start_mark.index, key.end_mark.index, new), (start, end, written)]
    except yaml.YAMLError:
        return text
    finally:
        loader.dispose()
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _field(node: yaml.Node | None, name: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == name:
                return value
    return None
