"""Rate limits: how often (or how much) one socket or one user may do a costly thing.

`TokenBucket` lives in one process's memory: right for what a socket does, since a socket
belongs to one process.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field


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
