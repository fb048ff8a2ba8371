"""A burst of connections to a Daphne process that has not accepted them yet.

Daphne listens through Twisted's endpoint strings, whose listen backlog is 50: the kernel
dropped the SYNs of a burst beyond that while the event loop was busy (200 users' turns ending
together, each posting its next message on a new connection), and each dropped client waited
TCP's 1 s retransmission before it connected (geosense/daphne_hooks.py `LISTEN_BACKLOG`).
"""

import os
import signal

from geosense.daphne_hooks import LISTEN_BACKLOG
from tests.browser.daphne_server import DaphneServers
from tests.burst import connects_completed

BURST = 300


def test_a_burst_of_connections_to_a_busy_process_is_queued_not_dropped(
    daphne_server_factory: DaphneServers,
):
    """The process stopped (as a busy loop that accepts nothing for a while), 300 clients
    connect at once: every handshake completes at once, none waits for a SYN retransmission
    (with Twisted's backlog of 50, ~50 did and the rest waited a second or more)."""
    server = daphne_server_factory({"GEOSENSE_TEST_SERVER": "listen-backlog"})
    assert BURST < LISTEN_BACKLOG
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        completed = connects_completed(server.port, BURST, within=0.5)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert completed == BURST
