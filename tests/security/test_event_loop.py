"""Issue 12, item 2: no user-supplied schema or value is checked on the event loop.

One hostile user floods registrations of heavy declarations from one socket, and another
answers `location_get` with the costliest value its admitted result schema allows, while
another user's requests (an API call, and a frame's round trip on its socket) are timed
against the same live Daphne process: first at rest, then under the attack.

Before the fix, another user's p99 under this attack was 28.5 s. The bound asserted is the
issue's 100 ms, added to what the same probe measured at rest just before, so that a machine
busy with other work does not fail the test (on a quiet machine the rest p99 is a few ms); a
measurement spoilt by such work is taken once more.
"""

import asyncio
import time

import pytest

from tests.security.attacks import costly_answers, registration_flood
from tests.security.live import SOCKET, LatencyProbe, account

ATTACK_SECONDS = 12
REST_SECONDS = 5
P99_LIMIT_MS = 100


@pytest.fixture(scope="module")
def server(daphne_server_factory):
    # A server of its own: the attack leaves its sessions and registrations behind.
    return daphne_server_factory(env={"GEOSENSE_CLIENT_TOOL_TIMEOUT": "10"})


def _probes(server, token: str) -> list[LatencyProbe]:
    return [LatencyProbe(server, token).start(), LatencyProbe(server, token, path=SOCKET).start()]


def _attacked(server, mallory, trudy, victim):
    """One measurement: the probes at rest, then under the attack."""
    at_rest = _probes(server, victim.token)
    time.sleep(REST_SECONDS)
    for probe in at_rest:
        probe.stop()

    async def attack():
        return await asyncio.gather(
            registration_flood(server, trudy, frames=300, seconds=ATTACK_SECONDS),
            costly_answers(server, mallory, seconds=ATTACK_SECONDS),
        )

    attacked = _probes(server, victim.token)
    try:
        flood, answers = asyncio.run(attack())
    finally:
        for probe in attacked:
            probe.stop()
    for rest, probe in zip(at_rest, attacked, strict=True):
        print(f"{probe.path} at rest: {rest.summary()}\n{probe.path} attacked: {probe.summary()}")
    print(flood, answers, sep="\n")
    return at_rest, attacked, flood, answers


def _within_bound(at_rest, attacked) -> bool:
    return all(
        probe.failures == 0 and probe.quantile(0.99) < P99_LIMIT_MS + rest.quantile(0.99)
        for rest, probe in zip(at_rest, attacked, strict=True)
    )


def test_one_hostile_user_does_not_slow_another_users_requests(server):
    # Two hostile users: each gets the whole budget a user may spend.
    mallory, trudy = account(server, "mallory"), account(server, "trudy")
    victim = account(server, "victim")
    # A machine busy with other work can spoil one measurement; the attack is measured again
    # once (before the fix, every measurement was seconds over the bound).
    for _ in range(2):
        at_rest, attacked, flood, answers = _attacked(server, mallory, trudy, victim)
        assert answers.sent >= 3 and flood.sent >= 100
        assert "uniqueItems over 2,700 objects" in answers.notes[0]  # refused at registration
        if _within_bound(at_rest, attacked):
            return
    raise AssertionError("\n".join(p.summary() for p in attacked))
