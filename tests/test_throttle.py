"""The in-process token bucket behind the socket's limits."""

from geosense.throttle import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_refills_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(burst=3, rate=0.5, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_seconds() == 2.0
    clock.now = 2.0
    assert bucket.take() and not bucket.take()


def test_a_cost_larger_than_what_is_left_is_refused_and_spends_nothing():
    clock = Clock()
    bucket = TokenBucket(burst=100, rate=10, clock=clock)
    assert bucket.take(80)
    assert not bucket.take(30)
    assert bucket.take(20)
