"""Rate limits: how often one socket or one user may do a costly thing.

`TokenBucket` lives in one process's memory: right for a socket, which belongs to one
process. Limits that must hold across processes (per user, per address) use `cache_allow`,
which counts in Django's cache: the local memory cache by default, a shared cache (Redis) in a
deployment of several processes (docs/security.md).
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


def cache_allow(key: str, *, limit: int, window_seconds: int) -> bool:
    """Count one action under `key`; False once `limit` actions fell in the current window.

    A fixed window (the counter expires with it): simple, shared through the cache, and at
    most twice `limit` across a window boundary.
    """
    bucket = f"throttle:{key}:{int(time.time() // window_seconds)}"
    if cache.add(bucket, 1, timeout=window_seconds + 1):
        return True
    try:
        count = cache.incr(bucket)
    except ValueError:  # expired between add and incr
        cache.add(bucket, 1, timeout=window_seconds + 1)
        return True
    return count <= limit
