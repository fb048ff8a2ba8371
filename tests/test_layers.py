"""geosense/layers.py: the process's plumbing around Channels, Daphne and Twisted."""

import socket
import sys
from contextlib import contextmanager

import pytest
from twisted.internet import abstract, tcp
from twisted.web import http

import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)
from geosense.layers import LISTEN_BACKLOG
from tests.autobahn_socket import socket_opened
from tests.daphne_probe import Channel, functions_called


@contextmanager
def _connection(queued: bytes):
    """A Twisted TCP connection over a socket pair (ours, theirs: non-blocking), `queued`
    waiting for the reactor's write round as Twisted queues it; `writers` lists the
    connections that asked the reactor for that round since."""
    writers: list = []

    class Reactor:
        def addWriter(self, writer):
            writers.append(writer)

        def removeWriter(self, writer):
            pass

    ours, theirs = socket.socketpair()
    with ours, theirs:
        connection = tcp.Connection(ours, None, reactor=Reactor())
        connection.connected = True
        if queued:
            abstract.FileDescriptor.write(connection, queued)
        writers.clear()
        theirs.setblocking(False)
        yield connection, ours, theirs, writers


@pytest.mark.parametrize("queued", [b"", b"ahead "], ids=["idle", "queued"])
def test_a_write_to_an_idle_connection_is_sent_at_once(queued):
    """Twisted queued every write for the reactor's next round: two epoll changes (writable
    on, then off) and a loop round per frame or SSE chunk. Nothing queued: sent at once;
    something queued: behind it, by the reactor, as before."""

    with _connection(queued) as (connection, _ours, theirs, writers):
        connection.write(b"frame")
        if queued:
            assert writers == [connection]  # the reactor sends both, in order
            connection.doWrite()
        else:
            assert writers == []
        assert theirs.recv(64) == queued + b"frame"


@pytest.mark.parametrize("queued", [b"", b"ahead "], ids=["idle", "queued"])
def test_a_sequence_written_to_an_idle_connection_is_sent_at_once_in_one_send(queued):
    """Twisted writes an HTTP answer's headers and each chunk of a chunked body (every SSE
    event) with `writeSequence`, which queued them for the reactor's next round as `write`
    did. Nothing queued: its pieces are sent at once, in one `send`; something queued:
    behind it, by the reactor, as before."""

    with _connection(queued) as (connection, ours, theirs, writers):
        sends = []
        real_send = ours.send
        connection.socket = type("Counted", (), {})()
        connection.socket.send = lambda data: sends.append(data) or real_send(data)
        connection.writeSequence(http.toChunk(b"event"))  # a tuple, as Twisted's HTTP writes it
        if queued:
            assert writers == [connection]
            connection.socket = ours
            connection.doWrite()
        else:
            assert writers == []
            assert sends == [b"5\r\nevent\r\n"]
        assert theirs.recv(64) == queued + b"5\r\nevent\r\n"


def test_daphnes_requests_leave_form_bodies_to_django(monkeypatch):
    """Twisted parsed every form POST's `Content-Type` (through `email`) and its body into
    `args` on the event loop, a multipart body whole, before Django's limits; Daphne never
    reads `args`. Its requests skip that parse and hand the body on unread."""
    from daphne.http_protocol import WebRequest

    parsed = []
    monkeypatch.setattr(http, "_parseContentType", lambda line: parsed.append(line) or b"")

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


def _layers_calls(action) -> list[str]:
    """The Python functions of geosense/layers.py that run while `action()` runs."""
    return functions_called(action, where=("geosense/layers.py",))


def test_a_sequence_is_checked_and_sent_without_a_python_call_per_piece():
    """An SSE chunk is three pieces (size, event, line end): each was checked by a generator
    step of its own, four Python calls per chunk on the event loop."""
    with _connection(b"") as (connection, _ours, theirs, _writers):
        calls = _layers_calls(lambda: connection.writeSequence(http.toChunk(b"event")))
        assert theirs.recv(64) == b"5\r\nevent\r\n"
    assert calls == ["write_sequence_now", "_idle", "_send_now"]


def test_a_frame_sent_makes_its_unwritten_debug_text_without_a_python_call():
    """autobahn asks `hltype` and `hlval` three times for every frame it sends, for a debug
    line that is not written: each deferred text took two Python calls (a function and an
    `__init__`); it is a `functools.partial`, made in C, formatted only if written."""
    from autobahn import util
    from autobahn.websocket import protocol as autobahn_protocol

    protocol, transport = socket_opened()
    calls = _layers_calls(lambda: protocol.sendMessage(b'{"type": "event"}'))

    assert transport.value().endswith(b'{"type": "event"}')
    assert calls == []
    deferred = autobahn_protocol.hlval(42, color="green")
    assert not isinstance(deferred, str), "autobahn's own hlval ran (inspect, click.style)"
    assert not isinstance(autobahn_protocol.hltype(protocol.sendMessage), str)
    assert str(deferred) == f"{deferred}" == str(util.hlval(42, color="green"))


def test_a_response_message_through_daphne_takes_no_deprecation_proxy_or_python_hash():
    """Each chunk of a streamed answer went through Daphne's `Server.handle_reply`, which hashed
    the request twice by a Python `__hash__`, and `WebRequest.handle_reply`, which looked up
    `http.Request` through Twisted's deprecation proxy of the module (six Python calls): 13
    Python calls in Daphne and Twisted a chunk, 5 now."""
    from daphne.http_protocol import WebRequest
    from daphne.server import Server

    channel = Channel()
    request = WebRequest(channel)
    request.clientproto, request.method = b"HTTP/1.1", b"POST"
    server = Server.__new__(Server)
    server.connections = {request: {}}

    # Daphne's own dispatch, which a middle chunk now skips (geosense/daphne_hooks.py).
    handle_reply = getattr(Server.handle_reply, "__wrapped__", Server.handle_reply)

    def send(message) -> None:
        with pytest.raises(StopIteration):  # Daphne's send never waits for HTTP messages
            handle_reply(server, request, message).send(None)

    send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]})
    send({"type": "http.response.body", "body": b": ok\n\n", "more_body": True})
    calls: list[str] = []

    def count(frame, event, arg):
        if event == "call" and (
            "/daphne/" in frame.f_code.co_filename or "/twisted/" in frame.f_code.co_filename
        ):
            calls.append(frame.f_code.co_name)

    message = {"type": "http.response.body", "body": b"event: x\n\n", "more_body": True}
    sys.setprofile(count)
    try:
        send(message)
    finally:
        sys.setprofile(None)

    assert b"".join(channel.written[-1]) == b"a\r\nevent: x\n\n\r\n"
    assert calls == ["handle_reply", "check_headers_type", "handle_reply", "write", "toChunk"]


@pytest.mark.parametrize("verbosity", [1, 2])
def test_twisteds_access_line_is_made_only_where_daphne_keeps_twisteds_log(verbosity):
    """At Daphne's default verbosity (1) Twisted's log goes nowhere, yet Twisted formatted and
    emitted a combined access-log line for every request as it ended (27 Python calls, ~9 us);
    at a higher verbosity Daphne hands Twisted's log to Python's logging, and the line goes
    on."""
    from daphne.http_protocol import HTTPFactory, WebRequest
    from twisted.python import log

    channel = Channel()
    channel.factory.server.verbosity = verbosity
    factory = HTTPFactory(channel.factory.server)
    factory.startFactory()
    kept = factory._logFile
    request = WebRequest(channel)
    request.clientproto, request.method, request.uri = b"HTTP/1.1", b"GET", b"/api/sessions"
    calls: list[str] = []

    def count(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    try:
        sys.setprofile(count)
        try:
            factory.log(request)
        finally:
            sys.setprofile(None)
    finally:
        factory.stopFactory()

    if verbosity == 1:
        assert calls == ["log"]
    else:
        assert kept is log.logfile
        assert "combinedLogFormatter" in calls


@pytest.mark.parametrize(
    ("description", "backlog"),
    [
        ("tcp:port=0:interface=127.0.0.1", LISTEN_BACKLOG),  # Daphne's `-b HOST -p PORT`
        ("tcp:port=0:interface=127.0.0.1:backlog=7", 7),  # an operator's own choice
        ("unix:/tmp/geosense.sock", LISTEN_BACKLOG),  # Daphne's `-u PATH`
    ],
)
def test_an_endpoint_daphne_opens_gets_a_backlog_unless_it_names_one(description, backlog):
    from daphne import server

    endpoint = server.serverFromString(object(), description)
    assert endpoint._backlog == backlog
