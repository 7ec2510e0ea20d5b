"""Policy versions in the database: each apply and rollback is a version; one row says which serves.

`policy_versions` is append-only history (content, hash, author, time, message). `active_policy`
holds exactly one row pointing at the version every replica should serve: switching is one UPDATE
in the same transaction as the new version's INSERT, so there is never a moment with no active
version or two, and replicas poll that one small row. SQLAlchemy errors become
PolicyStoreUnavailable here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from gateway.db.schema import active_policy, policy_versions
from gateway.errors import Conflict, PolicyStoreUnavailable, PolicyVersionNotFound
from gateway.policy.load import content_hash


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """One stored policy version."""

    version: int
    content: str
    hash: str
    author: str
    created: float
    message: str
    restores: int | None = None

    def summary(self) -> dict[str, object]:
        """Return the version's metadata, without its content."""
        return {
            "version": self.version,
            "hash": self.hash,
            "author": self.author,
            "created": self.created,
            "message": self.message,
            "restores": self.restores,
        }


@contextmanager
def _converted() -> Iterator[None]:
    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        raise PolicyStoreUnavailable(
            f"the policy versions cannot be read or written ({type(exc).__name__}); "
            "run `gateway db upgrade` if the table is missing"
        ) from exc


def _row(row: sa.Row[tuple[object, ...]]) -> PolicyVersion:
    m = row._mapping
    return PolicyVersion(
        m["version"],
        m["content"],
        m["hash"],
        m["author"],
        m["created"],
        m["message"],
        m["restores"],
    )


def active_version(db: sa.Engine) -> int | None:
    """Return the number of the active version, or None before the first apply."""
    with _converted(), db.connect() as conn:
        return conn.execute(
            sa.select(active_policy.c.version).where(active_policy.c.id == 1)
        ).scalar()


def get(db: sa.Engine, version: int) -> PolicyVersion:
    """Return a stored version, or raise PolicyVersionNotFound."""
    with _converted(), db.connect() as conn:
        row = conn.execute(
            sa.select(policy_versions).where(policy_versions.c.version == version)
        ).first()
    if row is None:
        raise PolicyVersionNotFound(f"policy version {version} does not exist")
    return _row(row)


def active(db: sa.Engine) -> PolicyVersion | None:
    """Return the active version, or None before the first apply."""
    version = active_version(db)
    return None if version is None else get(db, version)


def history(db: sa.Engine, limit: int = 50) -> list[PolicyVersion]:
    """Return the newest versions first."""
    with _converted(), db.connect() as conn:
        rows = conn.execute(
            sa.select(policy_versions).order_by(policy_versions.c.version.desc()).limit(limit)
        ).all()
    return [_row(r) for r in rows]


def record(
    db: sa.Engine,
    content: str,
    author: str,
    message: str,
    *,
    restores: int | None = None,
    only_if_none: bool = False,
) -> PolicyVersion:
    """Store content as the next version and make it active, in one transaction.

    The caller validates the content first. With only_if_none, store it only when no version is
    active yet, and otherwise return the active one (how a starting gateway seeds the history).
    """
    with _converted():
        try:
            with db.begin() as conn:
                current = conn.execute(
                    sa.select(active_policy.c.version).where(active_policy.c.id == 1)
                ).scalar()
                if only_if_none and current is not None:
                    return get(db, current)
                latest = conn.execute(sa.select(sa.func.max(policy_versions.c.version))).scalar()
                row = PolicyVersion(
                    int(latest or 0) + 1,
                    content,
                    content_hash(content),
                    author[:128],
                    time.time(),
                    message,
                    restores,
                )
                conn.execute(policy_versions.insert().values(**row.summary(), content=content))
                pointer = {"version": row.version, "updated": row.created}
                if current is None:
                    conn.execute(active_policy.insert().values(id=1, **pointer))
                else:
                    conn.execute(active_policy.update().where(active_policy.c.id == 1), pointer)
                return row
        except sa.exc.IntegrityError:
            # Another apply took the same version number first; what it stored is active now.
            if only_if_none:
                found = active(db)
                if found is not None:
                    return found
            raise PolicyStoreUnavailable(
                "another policy was applied at the same moment; check `gateway policy history` "
                "and apply again"
            ) from None


def rollback_target(db: sa.Engine, version: int | None = None) -> PolicyVersion:
    """Return the version a rollback serves again: `version`, or the one before the active."""
    current = active_version(db)
    if current is None:
        raise Conflict("there is no policy version to roll back from")
    if version is None:
        with _converted(), db.connect() as conn:
            version = conn.execute(
                sa.select(sa.func.max(policy_versions.c.version)).where(
                    policy_versions.c.version < current
                )
            ).scalar()
        if version is None:
            raise Conflict(f"version {current} is the first; there is none to roll back to")
    return get(db, version)


def contents(db: sa.Engine) -> list[str]:
    """Return the distinct texts of every stored version."""
    with _converted(), db.connect() as conn:
        rows = conn.execute(sa.select(policy_versions.c.content).distinct()).scalars()
        return list(rows)
