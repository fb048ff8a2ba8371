"""Issue 12, item 3: a login flood neither lets a password through nor starves the process.

Against a live Daphne: 16 threads post 64 wrong passwords for `demo` from one address while
another user's API requests are timed; then a real login from another address is timed. Before
the fix, 300 wrong passwords then the right one logged in, and a 16-way flood made a real login
take 11.6 s (every password hash ran on the thread all sync work of the process shares).
"""

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from geosense.accounts.login import WINDOW_SECONDS
from tests.security.live import LatencyProbe, account, login_attempt

FLOOD_THREADS = 16
FLOOD_ATTEMPTS = 64
# The failures are counted in fixed 15-minute windows (geosense/accounts/login.py): a flood and
# the login right after it must fall in one, or the right password gets through a new window
# (it did once, a flood on a loaded machine around 00:30). Far more than a flood takes.
WINDOW_LEFT_SECONDS = 90


def window_wait() -> None:
    """Until the current window has `WINDOW_LEFT_SECONDS` left (at most that long)."""
    left = WINDOW_SECONDS - time.time() % WINDOW_SECONDS
    if left < WINDOW_LEFT_SECONDS:
        time.sleep(left + 1)


@pytest.fixture(scope="module")
def server(daphne_server_factory):
    return daphne_server_factory(env={"GEOSENSE_CLIENT_TOOL_TIMEOUT": "11"})


def test_a_login_flood_is_refused_and_starves_nobody(server):
    victim = account(server, "victim")
    walker = account(server, "walker")
    window_wait()
    probe = LatencyProbe(server, victim.token).start()
    with ThreadPoolExecutor(FLOOD_THREADS) as pool:
        statuses = Counter(
            pool.map(
                lambda n: login_attempt(server, "demo", f"guess-{n}", timeout=180).status,
                range(FLOOD_ATTEMPTS),
            )
        )
    right_after_flood = login_attempt(server, "demo", "demo")
    started = time.monotonic()
    real = login_attempt(server, walker.name, walker.password, source="127.0.0.2")
    real_login_seconds = time.monotonic() - started
    probe.stop()
    print(statuses, f"real login {real_login_seconds:.2f} s", probe.summary(), sep="\n")

    # 5 failures for demo from this address, then refusals
    assert statuses[200] == 5 and statuses[429] == FLOOD_ATTEMPTS - statuses[200]
    assert right_after_flood.status == 429  # the right password no longer gets through
    assert real.status == 302  # another address logs in, without waiting behind the flood
    assert real_login_seconds < 3
    # Another user is served throughout; how fast is the load of 320 requests in a few
    # seconds, not of password hashes (docs/security.md gives the figures).
    assert probe.failures == 0
