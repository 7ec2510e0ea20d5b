"""The prefix index shared between replicas: each tells the others which blocks it sent where.

A replica's index (gateway/fleet/prefixes.py) knows only what that replica sent, so behind a
load balancer spreading one conversation over replicas every replica would think the backend
cold. With Redis, each replica publishes the prefix blocks it sends each backend, batched for
`FLUSH_S`, on the shared channel, and records the others' as if it had sent them.

The bounds: a replica hears another's blocks within `FLUSH_S` plus one pub/sub hop (a request
arriving in between is routed on what the replica knew: at worst the cache-blind choice). A
prompt has at most 2,048 blocks (`gateway/routing/prefix.py`), so a notice stays under about
40 KB a prompt; each replica records every other's sends, so its CPU for the index grows with
the fleet's request rate, not its own. While Redis is out,
each replica knows its own traffic only; nothing missed is replayed after (the engines' reports
correct what that costs), and a new replica starts empty. The index's memory per backend is its
own bound whatever the others send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from gateway.fleet.prefixes import PrefixIndex
from gateway.fleet.sharedstate import SharedState

log = logging.getLogger(__name__)

FLUSH_S = 0.01  # a batch waits this long for more before it is published


class SharedPrefixes:
    """Publish the blocks this replica sends; record the blocks other replicas sent."""

    def __init__(self, shared: SharedState, index: PrefixIndex):
        self.shared = shared
        self.index = index
        self._pending: list[tuple[str, list[int]]] = []
        index.on_sent = self.announce
        shared.on("prefixes", self._heard)

    def announce(self, backend: str, blocks: Sequence[int]) -> None:
        """Queue a prompt's blocks sent to a backend for the next notice."""
        if not self.shared.up:
            return
        if not self._pending:
            asyncio.get_running_loop().call_later(FLUSH_S, self._flush)
        self._pending.append((backend, list(blocks)))

    def _flush(self) -> None:
        sent, self._pending = self._pending, []
        if sent and self.shared.up:
            self.shared.publish("prefixes", sent=sent)

    def _heard(self, notice: dict[str, Any]) -> None:
        sent = notice.get("sent")
        if not isinstance(sent, list):
            log.warning("ignoring a prefixes notice without a list of blocks sent")
            return
        for entry in sent:
            if (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], list)
                and all(type(b) is int for b in entry[1])
            ):
                self.index.heard(entry[0], entry[1])
