"""Rate limits: how often (or how much) one socket or one user may do a costly thing.

`TokenBucket` lives in one process's memory: right for what a socket does, since a socket
belongs to one process. Limits that must hold across processes (per user, per address) use
`cache_allow`, which counts in Django's cache: the local memory cache by default, the shared
Redis cache when `REDIS_URL` is set (docs/security.md).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.cache import cache


@dataclass
class TokenBucket:
    """`burst` units at once, then `rate` units a second (units: actions, bytes, ...)."""

    burst: float
    rate: float
    clock: Callable[[], float] = time.monotonic
    tokens: float = field(init=False)
    stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)
        self.stamp = self.clock()

    def take(self, cost: float = 1) -> bool:
        """Spend `cost` if the bucket holds it; False means: refuse, and spend nothing."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True

    def wait_seconds(self, cost: float = 1) -> float:
        """How long until `cost` can be spent."""
        return max(0.0, (cost - self.tokens) / self.rate)


async def cache_allow(key: str, *, limit: int, window_seconds: int) -> bool:
    """Count one action under `key`; False once more than `limit` fell in the current window.

    A fixed window whose counter expires with it: shared through the cache, and at most twice
    `limit` across a window's boundary.
    """
    bucket = f"throttle:{key}:{int(time.time() // window_seconds)}"
    if await cache.aadd(bucket, 1, timeout=window_seconds + 1):
        return True
    try:
        count = await cache.aincr(bucket)
    except ValueError:  # expired between add and incr
        await cache.aadd(bucket, 1, timeout=window_seconds + 1)
        return True
    return count <= limit
