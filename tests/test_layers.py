"""geosense/layers.py: the process's plumbing around Channels, Daphne and Twisted."""

import socket

import pytest
from twisted.internet import abstract, tcp
from twisted.web import http

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


@pytest.mark.parametrize("queued", [b"", b"ahead "], ids=["idle", "queued"])
def test_a_sequence_written_to_an_idle_connection_is_sent_at_once_in_one_send(queued):
    """Twisted writes an HTTP answer's headers and each chunk of a chunked body (every SSE
    event) with `writeSequence`, which queued them for the reactor's next round as `write`
    did. Nothing queued: its pieces are sent at once, in one `send`; something queued:
    behind it, by the reactor, as before."""

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
        if queued:
            abstract.FileDescriptor.write(connection, queued)
        Reactor.writers.clear()
        theirs.setblocking(False)
        sends = []
        real_send = ours.send
        connection.socket = type("Counted", (), {})()
        connection.socket.send = lambda data: sends.append(data) or real_send(data)
        connection.writeSequence(http.toChunk(b"event"))  # a tuple, as Twisted's HTTP writes it
        if queued:
            assert Reactor.writers == [connection]
            connection.socket = ours
            connection.doWrite()
        else:
            assert Reactor.writers == []
            assert sends == [b"5\r\nevent\r\n"]
        assert theirs.recv(64) == queued + b"5\r\nevent\r\n"


def test_daphnes_requests_leave_form_bodies_to_django(monkeypatch):
    """Twisted parsed every form POST's `Content-Type` (through `email`) and its body into
    `args` on the event loop, a multipart body whole, before Django's limits; Daphne never
    reads `args`. Its requests skip that parse and hand the body on unread."""
    from daphne.http_protocol import WebRequest

    parsed = []
    monkeypatch.setattr(http, "_parseContentType", lambda line: parsed.append(line) or b"")

    class Channel:
        factory = type("Factory", (), {"server": type("Server", (), {})()})()
        factory.server.protocol_connected = lambda request: None
        transport = None

        def getPeer(self):
            return None

        def getHost(self):
            return None

    body = b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n--b--\r\n"
    request = WebRequest(Channel())
    processed = []
    request.process = lambda: processed.append(request.content.read())
    request.requestHeaders.setRawHeaders(b"content-type", [b"multipart/form-data; boundary=b"])
    request.gotLength(len(body))
    request.handleContentChunk(body)
    request.requestReceived(b"POST", b"/api/sessions", b"HTTP/1.1")

    assert parsed == []
    assert request.args == {}
    assert processed == [body]
