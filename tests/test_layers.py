"""geosense/layers.py: the process's plumbing around Channels, Daphne and Twisted."""

import socket

import pytest
from twisted.internet import abstract, tcp

import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)


@pytest.mark.parametrize("queued", [b"", b"ahead "], ids=["idle", "queued"])
def test_a_write_to_an_idle_connection_is_sent_at_once(queued):
    """Twisted queued every write for the reactor's next round: two epoll changes (writable
    on, then off) and a loop round per frame or SSE chunk. Nothing queued: sent at once;
    something queued: behind it, by the reactor, as before."""

    class Reactor:
        writers: list = []

        def addWriter(self, writer):
            self.writers.append(writer)

        def removeWriter(self, writer):
            pass

    ours, theirs = socket.socketpair()
    with ours, theirs:
        connection = tcp.Connection(ours, None, reactor=Reactor())
        connection.connected = True
        if queued:  # waiting for the reactor's write round, as Twisted queues it
            abstract.FileDescriptor.write(connection, queued)
        Reactor.writers.clear()
        theirs.setblocking(False)
        connection.write(b"frame")
        if queued:
            assert Reactor.writers == [connection]  # the reactor sends both, in order
            connection.doWrite()
        else:
            assert Reactor.writers == []
        assert theirs.recv(64) == queued + b"frame"
