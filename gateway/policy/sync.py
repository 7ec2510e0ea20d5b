"""Keep a running gateway on the active policy version: poll the version store, swap on change.

Every replica polls the one-row active pointer (cheap) on an interval, and syncs at once after a
PUT or rollback it handled itself. With shared state it then tells the other replicas, which
sync at once too, so every replica serves a new version within a second; the poll remains for
when a notice is lost (Redis out). The database read runs in a thread; the swap runs on the
event loop, between requests.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import sqlalchemy as sa

from gateway.errors import PolicyError, PolicyStoreUnavailable
from gateway.metrics import GatewayMetrics
from gateway.periodic import Periodic, Tasks
from gateway.policy import versions
from gateway.policy.apply import apply
from gateway.policy.credentials import Access
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy
from gateway.policy.versions import PolicyVersion

log = logging.getLogger(__name__)

Apply = Callable[[Policy, PolicyVersion], None]


class PolicyWatcher:
    """Apply the store's active version whenever it differs from the one serving."""

    def __init__(
        self,
        db: sa.Engine,
        metrics: GatewayMetrics,
        serving: Callable[[], int],
        apply: Apply,
        *,
        interval_s: float = 2.0,
        announce: Callable[[int], None] | None = None,
    ):
        self._db = db
        self._metrics = metrics
        self._serving = serving
        self._apply = apply
        self._announce = announce
        self._refused: int | None = None
        self._lock = asyncio.Lock()
        self._nudged = Tasks()
        self.periodic = Periodic("policy-watcher", interval_s, self._poll)

    async def sync(self, *, announce: bool = True) -> int:
        """Apply the active version if it is new; return the version serving afterwards.

        After a change this replica made (an apply, a rollback, a rollout step, a saved file),
        `announce` tells the other replicas to sync too.
        """
        async with self._lock:  # one sync at a time: a poll and a PUT never swap in reverse
            version = await asyncio.to_thread(versions.active_version, self._db)
            if version is None or version == self._serving() or version == self._refused:
                return self._serving()
            stored = await asyncio.to_thread(versions.get, self._db, version)
            try:
                source = f"policy version {version}"
                policy = await asyncio.to_thread(parse_policy, stored.content, source)
                # Applying builds the fleet, which refuses a policy whose upstream keys this
                # replica lacks before anything changes.
                self._apply(policy, stored)
            except PolicyError as exc:
                # Stored versions were valid where they were applied; this replica's code may be
                # older, or its environment may lack a key the version names.
                self._refused = version
                self._metrics.policy_reloads.labels("invalid").inc()
                log.error("not applying policy version %d: %s", version, exc)
                return self._serving()
            self._metrics.policy_reloads.labels("ok").inc()
            log.info("serving policy version %d (%s)", version, stored.message)
            if announce and self._announce is not None:
                self._announce(version)
            return version

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
        await self._nudged.cancel()

    def nudge(self) -> None:
        """Sync now, in the background: another replica changed the active version."""
        self._nudged.spawn(self._poll(), name="policy-sync")

    async def _poll(self) -> None:
        try:
            await self.sync(announce=False)
        except PolicyStoreUnavailable as exc:
            self._metrics.policy_reloads.labels("error").inc()
            log.warning("could not check the active policy version: %s", exc.message)
        except Exception:
            self._metrics.policy_reloads.labels("error").inc()
            raise


class FileWatcher:
    """Apply a policy file whenever it is saved (`gateway serve --watch`), if it is valid.

    A saved file that fails validation is logged with its errors and not applied; the gateway
    keeps serving the active version. A valid one becomes a new version in the store, so the
    other replicas follow it as they would an apply.
    """

    def __init__(
        self,
        path: Path,
        db: sa.Engine,
        metrics: GatewayMetrics,
        synced: Callable[[], Awaitable[int]],
        access: Access | None = None,
        *,
        interval_s: float = 1.0,
    ):
        self._path = path
        self._access = access
        self._db = db
        self._metrics = metrics
        self._synced = synced
        self._seen = self._stamp()
        self.periodic = Periodic("policy-file-watcher", interval_s, self.check)

    def _stamp(self) -> tuple[float, int] | None:
        try:
            stat = self._path.stat()
        except OSError:
            return None
        return (stat.st_mtime, stat.st_size)

    async def check(self) -> bool:
        """Apply the file if it changed since the last look and is valid; say if it applied."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return False
        self._seen = stamp
        text = self._path.read_text()
        try:
            applied = await asyncio.to_thread(
                apply,
                self._db,
                text,
                str(self._path),
                author=f"watch@{socket.gethostname()}",
                message=f"saved {self._path.name}",
                access=self._access,
            )
        except PolicyError as exc:
            self._metrics.policy_reloads.labels("invalid").inc()
            log.error("not applying %s: %s", self._path, exc)
            return False
        if applied.changed:
            await self._synced()
        return applied.changed

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
