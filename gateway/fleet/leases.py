"""Leases: places in capacity sets that every replica sees, and that lapse when a replica dies.

A capacity set is a sorted set in Redis: a backend's slots (weighted by the KV-cache bytes each
request reserves), a shadow target's concurrent copies, a pool's share for copies. A holder
takes a place in several sets at once, all or none, under one lease id, and gives them back
when done. While it holds them, the heartbeat renews their expiry; a replica that dies stops
renewing, and its places come free once GATEWAY_SLOT_LEASE_S has passed.

Every place a replica holds is known here, including those taken from local state during an
outage, so that on rejoining it can register them all again: Redis may have restarted empty.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import SharedStateUnavailable
from gateway.fleet.sharedstate import SharedState

# KEYS[1] the boot token, KEYS[2..] the sets; ARGV: boot token, lease id, lease ms, then a
# (limit, weight limit) pair per set (-1: no weight limit). The weight is the lease id's last
# field. Return {1 or 0, n1, w1, n2, w2...}: taken or not, each set's places and weight before.
TAKE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local weight = tonumber(string.match(ARGV[2], ':(%d+)$'))
local out = {1}
for i = 2, #KEYS do
  local key = KEYS[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local limit, wlimit = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local n, w = redis.call('ZCARD', key), 0
  if wlimit >= 0 then
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      w = w + tonumber(string.match(m, ':(%d+)$'))
    end
  end
  out[#out + 1] = n
  out[#out + 1] = w
  if n >= limit or (wlimit >= 0 and w + weight > wlimit) then out[1] = 0 end
end
if out[1] == 1 then
  for i = 2, #KEYS do redis.call('ZADD', KEYS[i], now + tonumber(ARGV[3]), ARGV[2]) end
end
return out
"""

# KEYS[1] a waiting flag ('' for none), KEYS[2..] the sets; ARGV: lease id, channel, notice.
# Tell the replicas that wait for the pool that a place came free.
GIVE_BACK = """
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
if KEYS[1] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 0
"""

# KEYS: sets, one per lease id in ARGV[3..]; ARGV[1] lease ms, ARGV[2] 'XX' to only extend
# leases Redis still has, '' to register them again.
RENEW = """
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if ARGV[2] == 'XX' then
    redis.call('ZADD', key, 'XX', expiry, ARGV[i + 2])
  else
    redis.call('ZADD', key, expiry, ARGV[i + 2])
  end
end
return #KEYS
"""

# KEYS: sets. Return {n1, w1, n2, w2...}: the live places and weight of each.
COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local w = 0
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    w = w + (tonumber(string.match(m, ':(%d+)$')) or 0)
  end
  out[#out + 1] = redis.call('ZCARD', key)
  out[#out + 1] = w
end
return out
"""


@dataclass(frozen=True, slots=True)
class Place:
    """A capacity set and how much of it may be held: `limit` places, `weight_limit` weight."""

    name: str
    limit: int
    weight_limit: float = -1.0  # -1: only places count


@dataclass(frozen=True, slots=True)
class Occupancy:
    """How full a capacity set was when last seen: places taken, and their total weight."""

    places: int
    weight: float


class Leases:
    """Take, renew and give back places in the replicas' capacity sets."""

    def __init__(self, shared: SharedState):
        self.shared = shared
        self._ids = itertools.count()
        self.held: dict[str, tuple[str, ...]] = {}  # lease id -> the sets it holds a place in
        self._take = shared.redis.register_script(TAKE)
        self._give_back = shared.redis.register_script(GIVE_BACK)
        self._renew = shared.redis.register_script(RENEW)
        self._count = shared.redis.register_script(COUNT)
        shared.on_reset(self.register)
        shared.on_beat(self.renew)

    def new(self, places: Sequence[Place], weight: float = 0.0) -> str:
        """Hold places under a new lease id, in this replica's books only (nothing is sent)."""
        lease = f"{self.shared.replica}:{next(self._ids)}:{int(weight)}"
        self.held[lease] = tuple(self.shared.key("lease", p.name) for p in places)
        return lease

    async def take(self, lease: str, places: Sequence[Place]) -> tuple[bool, list[Occupancy]]:
        """Take the lease's places in Redis, all or none; return whether, and how full they were.

        Raises SharedStateUnavailable when Redis fails or has lost its data since this replica
        joined; the lease stays in this replica's books either way until `drop`.
        """
        shared = self.shared
        keys = [shared.key("boot"), *self.held[lease]]
        args: list[bytes | str | int | float] = [shared.boot or b"", lease, shared.lease_ms]
        for place in places:
            args += [place.limit, place.weight_limit]
        out = await shared.run(self._take, keys, args)
        if out[0] == -1:
            shared.lost("Redis lost its data since this replica joined")
            raise SharedStateUnavailable("Redis lost its data since this replica joined")
        seen = [Occupancy(int(out[i]), float(out[i + 1])) for i in range(1, len(out), 2)]
        return out[0] == 1, seen

    def forget(self, lease: str) -> None:
        """Forget a lease that Redis refused: it holds nothing there."""
        self.held.pop(lease, None)

    def drop(self, lease: str, waiting: str = "", **freed: object) -> None:
        """Give a lease's places back, in the background.

        If some replica waits for the pool named `waiting`, it gets a "freed" notice with the
        `freed` fields.
        """
        sets = self.held.pop(lease, None)
        if sets is None or not self.shared.up:
            return  # not in Redis, or Redis is out: it lapses there, or is never registered
        shared = self.shared
        flag = shared.key("waiting", waiting) if waiting else ""
        notice = shared.notice("freed", pool=waiting, **freed)
        shared.spawn(shared.run(self._give_back, [flag, *sets], [lease, shared.channel, notice]))

    async def register(self) -> None:
        """Register every held lease again (on joining: Redis may have restarted empty)."""
        await self._send_renewal("")

    async def renew(self) -> None:
        """Extend the expiry of every held lease Redis still has."""
        await self._send_renewal("XX")

    async def _send_renewal(self, mode: str) -> None:
        keys: list[str] = []
        ids: list[str] = []
        for lease, sets in list(self.held.items()):
            keys += sets
            ids += [lease] * len(sets)
        if keys:
            await self.shared.run(self._renew, keys, [self.shared.lease_ms, mode, *ids])

    async def occupancy(self, names: Sequence[str]) -> list[Occupancy]:
        """Return how full each capacity set is now, every replica's places included."""
        keys = [self.shared.key("lease", n) for n in names]
        out = await self.shared.run(self._count, keys, [])
        return [Occupancy(int(out[i]), float(out[i + 1])) for i in range(0, len(out), 2)]
