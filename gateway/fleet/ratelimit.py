"""Rate limits: token buckets, kept in memory or in Redis where every replica spends from them.

A bucket holds up to `capacity` tokens and refills at `rate` tokens a second. Tenants' limits
(requests and tokens per minute, from the policy) and shadow targets' copies per second are
buckets. With shared state a bucket lives in Redis, so N replicas together allow what one
would; while Redis is unreachable each replica keeps a local bucket with its share of the rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.errors import ExceedsRateLimit, RateLimited, SharedStateUnavailable
from gateway.fleet.sharedstate import SharedState
from gateway.policy.definition import RateLimit, Tenant

# KEYS: buckets; ARGV: (rate per second, capacity, cost) per bucket. All or nothing: spend
# every cost if every bucket has it, else spend nothing. Return 0, or the ms until they would.
SPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local wait, levels = 0, {}
for i, key in ipairs(KEYS) do
  local rate, cap, cost = tonumber(ARGV[3*i - 2]), tonumber(ARGV[3*i - 1]), tonumber(ARGV[3*i])
  local v = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(v[1]) or cap
  local ts = tonumber(v[2]) or now
  tokens = math.min(cap, tokens + math.max(0, now - ts) / 1000 * rate)
  levels[i] = tokens
  if tokens < cost then wait = math.max(wait, (cost - tokens) / rate * 1000) end
end
if wait > 0 then return math.ceil(wait) end
for i, key in ipairs(KEYS) do
  local rate, cap, cost = tonumber(ARGV[3*i - 2]), tonumber(ARGV[3*i - 1]), tonumber(ARGV[3*i])
  redis.call('HSET', key, 'tokens', levels[i] - cost, 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(cap / rate * 1000) + 1000)
end
return 0
"""


# KEYS[1] a bucket; ARGV: rate per second, capacity, tokens used beyond what was spent (less
# than 0 gives some back). Settle them whatever the level: a bucket may owe up to its capacity.
SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate, cap, extra = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or cap
local ts = tonumber(v[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - ts) / 1000 * rate)
tokens = math.max(-cap, math.min(cap, tokens - extra))
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return 0
"""


class Bucket:
    """One token bucket in memory."""

    __slots__ = ("capacity", "rate", "tokens", "updated")

    def __init__(self, rate: float, capacity: float, now: float):
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.updated = now

    def refill(self, now: float) -> float:
        """Add what the time since the last look earned; return the tokens now."""
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now
        return self.tokens

    def wait_s(self, cost: float, now: float) -> float:
        """Return how long until the bucket holds cost tokens (0: now)."""
        missing = min(cost, self.capacity) - self.refill(now)
        return max(0.0, missing / self.rate)

    def take(self, cost: float, now: float) -> bool:
        """Spend cost tokens if the bucket has them; return whether it did."""
        if self.wait_s(cost, now) > 0:
            return False
        self.tokens -= min(cost, self.capacity)
        return True

    def settle(self, extra: float, now: float) -> None:
        """Take tokens used beyond what was spent (give some back if less), owing at most a
        bucket's worth."""
        self.tokens = max(-self.capacity, min(self.capacity, self.refill(now) - extra))


@dataclass(frozen=True, slots=True)
class Draw:
    """Tokens to spend from a named bucket, and the bucket's rate and capacity."""

    bucket: str
    rate: float
    capacity: float
    cost: float = 1.0


class TokenBuckets:
    """Named token buckets: in Redis when state is shared, in memory otherwise.

    `take` spends from several buckets at once, all or none, so a request over one limit
    spends nothing from the others.
    """

    def __init__(
        self, shared: SharedState | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.shared = shared
        self.clock = clock
        self._local: dict[tuple[str, float, float], Bucket] = {}
        self._spend = shared.redis.register_script(SPEND) if shared is not None else None
        self._settle = shared.redis.register_script(SETTLE) if shared is not None else None

    async def take(self, draws: Sequence[Draw]) -> float:
        """Spend every draw if all its buckets can; return 0, or the seconds until they could."""
        shared, spend = self.shared, self._spend
        if shared is not None and spend is not None and shared.up:
            keys = [shared.key("bucket", d.bucket) for d in draws]
            args: list[float] = []
            for d in draws:
                args += [d.rate, d.capacity, min(d.cost, d.capacity)]
            try:
                waited_ms = await shared.run(spend, keys, args)
                # No bucket needs longer than its refill from empty: a larger answer is not one.
                longest = max(d.capacity / d.rate for d in draws)
                return min(max(int(waited_ms) / 1000, 0.0), longest)
            except SharedStateUnavailable:
                pass  # spend from this replica's share instead
        return self.take_local(draws)

    async def settle(self, draw: Draw) -> None:
        """Settle a draw's bucket for what was really used: `draw.cost` beyond what was spent."""
        shared, settle = self.shared, self._settle
        if shared is not None and settle is not None and shared.up:
            try:
                await shared.run(
                    settle,
                    [shared.key("bucket", draw.bucket)],
                    [draw.rate, draw.capacity, draw.cost],
                )
                return
            except SharedStateUnavailable:
                pass  # settle this replica's share instead
        self._bucket(draw, self.clock()).settle(draw.cost, self.clock())

    def _bucket(self, draw: Draw, now: float) -> Bucket:
        """Return this replica's own bucket for a draw (its share while Redis is out)."""
        share = self.shared.share(1.0) if self.shared is not None else 1.0
        key = (draw.bucket, draw.rate * share, draw.capacity * share)
        bucket = self._local.get(key)
        if bucket is None:
            bucket = self._local[key] = Bucket(key[1], max(key[2], 1.0), now)
        return bucket

    def take_local(self, draws: Sequence[Draw]) -> float:
        """Spend from this replica's own buckets (its share of each rate while Redis is out)."""
        now = self.clock()
        buckets = [self._bucket(d, now) for d in draws]
        wait = max((b.wait_s(d.cost, now) for b, d in zip(buckets, draws, strict=True)), default=0)
        if wait > 0:
            return wait
        for bucket, d in zip(buckets, draws, strict=True):
            bucket.take(d.cost, now)
        return 0.0


def tenant_draws(name: str, limit: RateLimit, tokens: int) -> list[Draw]:
    """Return what one request of a tenant spends from its buckets."""
    draws = []
    if limit.requests_per_minute is not None:
        rpm = limit.requests_per_minute
        draws.append(Draw(f"tenant:{name}:requests", rpm / 60, rpm))
    tokens_draw = _tokens_draw(name, limit, tokens)
    if tokens_draw is not None:
        draws.append(tokens_draw)
    return draws


def _tokens_draw(name: str, limit: RateLimit, tokens: float) -> Draw | None:
    if limit.tokens_per_minute is None:
        return None
    tpm = limit.tokens_per_minute
    return Draw(f"tenant:{name}:tokens", tpm / 60, tpm, tokens)


async def admit_tenant(buckets: TokenBuckets, tenant: Tenant | None, tokens: int) -> None:
    """Raise RateLimited when a request that may use `tokens` would put its tenant over its
    rate limit; else spend them. A request that alone may use more than its tenant's tokens a
    minute is refused outright: no wait would let it through."""
    if tenant is None or tenant.rate_limit is None:
        return
    tpm = tenant.rate_limit.tokens_per_minute
    if tpm is not None and tokens > tpm:
        raise ExceedsRateLimit(
            f"this request may use up to {tokens} tokens (its prompt, and max_tokens for each "
            f"answer), more than tenant {tenant.name!r} may use in a minute ({tpm:g}); lower "
            "max_tokens or n",
            param="max_tokens",
        )
    draws = tenant_draws(tenant.name, tenant.rate_limit, tokens)
    wait_s = await buckets.take(draws)
    if wait_s > 0:
        raise RateLimited(
            f"tenant {tenant.name!r} is over its rate limit "
            f"({tenant.rate_limit.describe()}); retry in {math.ceil(wait_s)} s",
            retry_after_s=wait_s,
        )


async def settle_tenant(
    buckets: TokenBuckets, tenant: Tenant | None, spent: int, used: int
) -> None:
    """Charge a tenant what a request used, where it was charged `spent` up front."""
    if tenant is None or tenant.rate_limit is None or used == spent:
        return
    draw = _tokens_draw(tenant.name, tenant.rate_limit, used - spent)
    if draw is not None:
        await buckets.settle(draw)
