"""Follow the KV-cache events of the backends whose engines publish them.

For each backend with `kv_events` in the policy, the gateway subscribes to its engine's
ZeroMQ PUB socket (vLLM's `--kv-events-config`: frames topic, 8-byte big-endian sequence
number, msgpack `EventBatch`) and applies every batch to that backend's exact index
(gateway/fleet/engine_blocks.py), which the router then reads instead of its estimate
(gateway/fleet/prefixes.py). Each replica subscribes for itself: a PUB socket serves many
subscribers, and every replica then knows what the engines hold, whoever sent them what.

The sequence numbers say what was missed:

- the first batch heard: what the engine published before it is asked of its replay socket
  (`kv_events_replay`), from 0; what the buffer no longer has is blocks the index does not know,
  so it holds less than the engine, never more;
- a number past the one expected: a gap; the missing batches are asked of the replay socket and
  applied in order. Where they cannot all be had (no replay socket, a buffer that moved on, no
  answer within `REPLAY_TIMEOUT_S`) a removal may be missing, so the index is not trusted, and
  the router uses the estimate, until the engine clears its cache (`AllBlocksCleared`) or
  restarts;
- a (re)connection: the publisher may have started again, so its engine did, with an empty
  cache, and a new subscription misses a publisher's first messages: the index is cleared at
  once and rebuilt from the replay buffer (without one, from the batch heard next); batches the
  replay already gave are not applied twice;
- a number below the one expected on one connection: the publisher's numbers started again;
  the index is cleared and rebuilt the same way.

Events stop without a word when an engine hangs or its link breaks: every `STALE_S` a watchdog
checks each backend, and one that was sent prompts that should have stored blocks
(`EngineBlocks.unconfirmed`) and published nothing since the last check is not `live`: the
estimate serves until its next batch. Batches in either of vLLM's encodings are read: maps
tagged by `type` (vLLM now) or arrays led by the tag (`array_like`, vLLM before 0.10).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from gateway.fleet.engine_blocks import Cleared, EngineBlocks, Event, Removed, Stored
from gateway.fleet.prefixes import PrefixIndex
from gateway.policy.definition import Policy

log = logging.getLogger(__name__)

STALE_S = 5.0
REPLAY_TIMEOUT_S = 1.0
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class MalformedBatch(ValueError):
    """A payload that is not an EventBatch in either of vLLM's encodings."""


def decode(payload: bytes) -> list[Event]:
    """Return the events of one msgpack EventBatch."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedBatch(f"not msgpack: {exc}") from exc
    if isinstance(batch, dict):
        events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    else:
        raise MalformedBatch(f"an EventBatch is a map or an array, got {type(batch).__name__}")
    if not isinstance(events, list):
        raise MalformedBatch("an EventBatch's events are an array")
    return [_event(event) for event in events]


# The fields of each event after its tag, in vLLM's order (its array_like encoding).
_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _event(raw: Any) -> Event:
    if isinstance(raw, dict):
        tag, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        fields = dict(zip(_FIELDS.get(tag, ()), raw[1:], strict=False))
    else:
        raise MalformedBatch(f"an event is a map or an array, got {type(raw).__name__}")
    try:
        if tag == "BlockStored":
            return Stored(
                list(fields["block_hashes"]),
                fields.get("parent_block_hash"),
                [int(t) for t in fields["token_ids"]],
                int(fields["block_size"]),
                fields.get("medium"),
            )
        if tag == "BlockRemoved":
            return Removed(list(fields["block_hashes"]), fields.get("medium"))
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedBatch(f"a {tag} event without its fields: {exc}") from exc
    if tag == "AllBlocksCleared":
        return Cleared()
    raise MalformedBatch(f"unknown event type {tag!r}")


async def _poll(*sockets: zmq.asyncio.Socket) -> list[tuple[Any, int]]:
    """Wait until one of the sockets has a message."""
    poller = zmq.asyncio.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    return await poller.poll()


@dataclass(slots=True)
class _Feed:
    """One backend's subscription."""

    endpoint: str
    replay: str | None
    engine: EngineBlocks
    task: asyncio.Task[None] | None = None
    batches: int = 0  # heard in all
    checked: int = 0  # heard by the watchdog's last check
    expected: int | None = None  # the next sequence number
    replayed: int = 0  # batches below this number came from the replay at (re)connection


@dataclass
class KvEventSubscriber:
    """Subscribe to the backends' KV-event publishers and keep the index's exact part."""

    index: PrefixIndex
    stale_s: float = STALE_S
    _context: zmq.asyncio.Context | None = None  # made with the first subscription
    _feeds: dict[str, _Feed] = field(default_factory=dict)
    _watchdog: asyncio.Task[None] | None = None
    _stopping: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def context(self) -> zmq.asyncio.Context:
        if self._context is None:
            self._context = zmq.asyncio.Context()
        return self._context

    def configure(self, endpoints: Mapping[str, tuple[str, str | None]]) -> None:
        """Follow these backends' publishers (backend -> endpoint, replay endpoint); stop
        following the others. A backend whose endpoints changed starts afresh."""
        for name in list(self._feeds):
            feed = self._feeds[name]
            if endpoints.get(name) != (feed.endpoint, feed.replay):
                self._stop(name)
        for name, (endpoint, replay) in endpoints.items():
            if name not in self._feeds:
                feed = _Feed(endpoint, replay, EngineBlocks())
                self._feeds[name] = feed
                self.index.engines[name] = feed.engine
                feed.task = asyncio.get_running_loop().create_task(self._follow(name, feed))
        if self._feeds and self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        """Stop every subscription and close the sockets."""
        for name in list(self._feeds):
            self._stop(name)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._stopping.append(self._watchdog)
            self._watchdog = None
        # Each task closes its socket as it ends, before the context goes.
        await asyncio.gather(*self._stopping, return_exceptions=True)
        self._stopping.clear()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    def _stop(self, name: str) -> None:
        feed = self._feeds.pop(name)
        self.index.engines.pop(name, None)
        if feed.task is not None:
            feed.task.cancel()
            self._stopping = [task for task in self._stopping if not task.done()]
            self._stopping.append(feed.task)

    async def _follow(self, name: str, feed: _Feed) -> None:
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        # Each (re)connection may be to an engine started again, whose first batches a new
        # subscription can miss (`_connected`).
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        sub.connect(feed.endpoint)
        try:
            while True:
                ready = dict(await _poll(sub, monitor))
                if monitor in ready:
                    await monitor.recv_multipart()
                    await self._connected(name, feed)
                if sub not in ready:
                    continue
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    log.warning("backend %s published a message of %d frames", name, len(frames))
                    continue
                await self._heard(name, feed, int.from_bytes(frames[1], "big"), frames[2])
        except asyncio.CancelledError:
            raise
        except Exception:  # a subscription must not die silently: the estimate takes over
            log.exception("following the KV events of backend %s failed", name)
            feed.engine.live = False
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _connected(self, name: str, feed: _Feed) -> None:
        """Start the index afresh from what the engine published so far, as far as its replay
        buffer goes (a link that only blipped gives the same blocks back); without a replay
        socket, from the batch heard next."""
        feed.expected, feed.replayed = None, 0
        if feed.replay is None:
            return
        feed.engine.clear()
        _, after = await self._replay(name, feed, 0)
        if after:
            feed.expected = feed.replayed = after
            feed.engine.live = True

    async def _heard(self, name: str, feed: _Feed, seq: int, payload: bytes) -> None:
        if seq < feed.replayed:
            return  # published before the subscription reached the engine, and replayed since
        engine, expected = feed.engine, feed.expected
        if expected is None or seq < expected:
            # A first batch, since the subscription (re)connected or since the publisher's
            # numbers started again: the engine may be new, with an empty cache. The index is
            # built afresh from what the engine published before this batch, as far as its
            # replay buffer goes (a link that only blipped gives the same blocks back).
            if seq < (expected or 0):
                log.warning("backend %s's publisher started again (seq %d)", name, seq)
            engine.clear()
            await self._replay(name, feed, 0, seq)
        elif seq > expected and not (await self._replay(name, feed, expected, seq))[0]:
            log.warning(
                "backend %s: KV-event batches %d to %d are lost; its index is not trusted until "
                "its engine clears its cache",
                name,
                expected,
                seq - 1,
            )
            engine.trusted = False
        self._apply(name, feed, payload)
        feed.expected = seq + 1
        engine.live = True

    def _apply(self, name: str, feed: _Feed, payload: bytes) -> None:
        feed.batches += 1
        try:
            feed.engine.apply(decode(payload))
        except MalformedBatch as exc:
            log.warning("backend %s published a batch that cannot be read: %s", name, exc)
            feed.engine.trusted = False

    async def _replay(
        self, name: str, feed: _Feed, start: int, stop: int | None = None
    ) -> tuple[bool, int]:
        """Apply, in order, the batches numbered from start (to stop - 1) that the replay socket
        still has; return whether every one of them came, and the number after the last one
        applied (`start` when none was)."""
        if stop is not None and start >= stop:
            return True, start
        if feed.replay is None:
            return False, start
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(feed.replay)
        got, after = start, start  # got: the next number for the run from `start` to be whole
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while await dealer.poll(REPLAY_TIMEOUT_S * 1000):
                frames = await dealer.recv_multipart()
                if len(frames) != 3 or frames[1] == END_SEQ:
                    return got >= (after if stop is None else stop), after
                seq = int.from_bytes(frames[1], "big")
                if start <= seq and (stop is None or seq < stop):
                    self._apply(name, feed, frames[2])
                    got = seq + 1 if seq == got else -1  # -1: a hole before it
                    after = seq + 1
            return False, after
        finally:
            dealer.close(linger=0)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.stale_s)
            self.check()

    def check(self) -> list[str]:
        """Mark not live each backend sent prompts to store and silent since the last check;
        return their names."""
        stale = []
        for name, feed in self._feeds.items():
            if feed.engine.unconfirmed and feed.batches == feed.checked:
                if feed.engine.live:
                    log.warning("backend %s publishes no KV events: its estimate serves", name)
                feed.engine.live = False
                stale.append(name)
            feed.checked = feed.batches
        return stale


def publishers(policy: Policy) -> dict[str, tuple[str, str | None]]:
    """Return the KV-event endpoints of the backends whose policy entry gives them."""
    return {
        backend.name: (backend.kv_events, backend.kv_events_replay)
        for pool in policy.pools.values()
        for backend in pool.backends
        if backend.kv_events is not None
    }
