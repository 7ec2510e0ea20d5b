"""KV-cache events on vLLM's wire: what each device's prefix cache stores and drops, published.

vLLM, SGLang and TensorRT-LLM publish their KV cache's changes for routers to follow
(`--kv-events-config`); the simulator publishes its devices' (simulator/prefix_cache.py) the way
vLLM does (`vllm/distributed/kv_events.py`, `ZmqEventPublisher`, commit 0181ea3):

- a ZeroMQ PUB socket at `endpoint` sends each batch as three frames: the topic, an 8-byte
  big-endian sequence number (0, 1, 2... from the publisher's start) and the batch in msgpack;
- a batch is an `EventBatch`, a map of `ts` (seconds since the epoch), `events` and
  `data_parallel_rank` (here the device's index); each event a map tagged by `type`:
  `BlockStored` (`block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`,
  `medium`, `lora_name`), `BlockRemoved` (`block_hashes`, `medium`) or `AllBlocksCleared`,
  as msgspec encodes vLLM's structs (fields with defaults left out when they hold them);
- a ROUTER socket at `replay_endpoint`, where given, answers a request for the batches from a
  sequence number on (frames: an empty delimiter, then the number in 8 bytes) with each batch
  still in its buffer of `buffer_steps` (frames: delimiter, number, payload), then the number −1
  and an empty payload.

Batches go out from a thread of their own, as vLLM's do, so the serving loop never waits on a
socket. `lose(n)` keeps the next n batches from the PUB socket but not from the buffer: what a
subscriber sees when a slow link or a full queue drops messages, which it recovers by replay.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from simulator.errors import ProfileError
from simulator.prefix_cache import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent

END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.05  # how long the thread waits for a batch before it looks at the replay socket


class KvEventsConfig(BaseModel):
    """vLLM's `--kv-events-config`, the fields the simulator reads (others are refused)."""

    model_config = ConfigDict(extra="forbid")

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, gt=0)
    hwm: int = Field(default=100_000, gt=0)
    topic: str = ""

    @property
    def enabled(self) -> bool:
        """Say whether events are published at all."""
        return self.enable_kv_cache_events and self.publisher in (None, "zmq")


def parse_config(text: str) -> KvEventsConfig:
    """Parse `--kv-events-config`'s JSON, or raise ProfileError naming what is wrong."""
    try:
        return KvEventsConfig.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise ProfileError(f"--kv-events-config is not valid: {exc}") from exc


def encode(events: list[CacheEvent], rank: int, ts: float) -> bytes:
    """Return one EventBatch in msgpack, as vLLM's publisher encodes it."""
    return msgpack.packb(
        {"ts": ts, "events": [_event(event) for event in events], "data_parallel_rank": rank}
    )


def _event(event: CacheEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
        }
    assert isinstance(event, AllBlocksCleared)
    return {"type": "AllBlocksCleared"}


class Publisher:
    """A ZeroMQ publisher of EventBatches with a replay buffer, on a thread of its own."""

    def __init__(self, config: KvEventsConfig, context: zmq.Context[Any] | None = None):
        self._context = context or zmq.Context.instance()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._pub.bind(config.endpoint)
        self._replay: zmq.Socket[Any] | None = None
        if config.replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.bind(config.replay_endpoint)
        self._topic = config.topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._seq = 0
        self._lose = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[CacheEvent], rank: int) -> None:
        """Queue one batch of a device's events."""
        self._queue.put(encode(events, rank, time.time()))

    def lose(self, batches: int) -> None:
        """Keep the next `batches` batches off the PUB socket (still buffered for replay)."""
        with self._lock:
            self._lose += batches

    def close(self) -> None:
        """Send what is queued, stop the thread and close the sockets."""
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                payload = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if payload is None:
                return
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            with self._lock:
                lost = self._lose > 0
                self._lose -= lost
            if not lost:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))
