"""geosense/daphne_hooks.py: connections, answers and frames through Daphne, Twisted and autobahn
with fewer Python calls, and the same bytes; Daphne's listen backlog."""

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from contextlib import contextmanager

import pytest
from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.http_protocol import WebRequest
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import abstract, asyncioreactor, error, posixbase, tcp
from twisted.python import failure, log
from twisted.web import http, http_headers
from twisted.web.http_headers import Headers, InvalidHeaderName
from txaio import tx as txaio_tx

import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)
from geosense.daphne_hooks import _SOCKET_REPLY, LISTEN_BACKLOG
from tests.autobahn_socket import socket_opened
from tests.source_pins import source_digests


class Channel:
    """What a Daphne request needs of its HTTP channel; what it writes goes to `written`."""

    factory = type("Factory", (), {"server": type("Server", (), {"server_name": "daphne"})()})()
    factory.server.protocol_connected = lambda request: None
    transport = None

    def __init__(self) -> None:
        self.written: list = []
        self.writeSequence = self.written.append

    def writeHeaders(self, *status_and_headers):
        self.written.append(status_and_headers)

    def getPeer(self):
        return None

    def getHost(self):
        return None


def functions_called(action: Callable[[], object], *, where: tuple[str, ...]) -> list[str]:
    """The Python functions whose file's path holds one of `where` that run while `action()`
    runs, in order."""
    calls: list[str] = []

    def count(frame, event, arg):
        if event == "call" and any(part in frame.f_code.co_filename for part in where):
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


BODY = {"type": "http.response.body", "body": b"event: x\n\n", "more_body": True}

# What the hooks stand in for, as they were written for Daphne 4.2.3 and Twisted 26.10.0: the
# digest of each function's source. A change here means reading the hooks against the new code
# (geosense/daphne_hooks.py's `handle_reply` is Daphne's `Server.handle_reply` with its fast path).
ASSUMED_SOURCES = {
    "Server.handle_reply": "9d9dbaea6de0657a",
    "Server.check_headers_type": "30eb62919fcdd075",
    "WebRequest.handle_reply": "3e14b239c2602d95",
    "Request.write": "0e547d4f76bd1472",
    "HTTPChannel.writeSequence": "06492eb61e8f8b80",  # a chunk's pieces, one transport write
    "toChunk": "f326a3bed37a6be6",
    "HTTPChannel.writeHeaders": "3521e56c0fe24bc2",  # an answer's head, with its first chunk
    "log.callWithLogger": "802f8564bca3531f",
    "autobahn sendMessage": "048d6bcf0d712309",  # a text frame made as these make it
    "autobahn sendFrame": "89cc8b024c413aa0",
    "autobahn sendData": "5dcca425b048b07e",
    "AsyncioSelectorReactor.addReader": "61b77f35b35cd2e5",
    "AsyncioSelectorReactor.addWriter": "dd13a0098bb09d36",
    "WebSocketProtocol.__eq__": "9717acc71a5a476e",  # by identity: hashing by identity agrees
    "WebSocketProtocol.handle_reply": "5331423b1cf2016a",
    "WebSocketProtocol.serverSend": "345f21330d2a18ce",
    "Headers.addRawHeader": "c4fe96cc1a6e7950",
    "Headers.getRawHeaders": "72248d917adfe3b6",
    "_NameEncoder.encode": "7b453627217624ac",
    "_sanitizeLinearWhitespace": "eae40a7049d09f94",
    "txaio Logger._set_log_level": "674ffbcc3702cd37",  # a level off binds its method to `_no_op`
    "txaio Logger.__get__": "8ec89199ae8faacf",  # `protocol.log` is the class's logger
    "Headers.setRawHeaders": "0a56d26c55e15b59",  # Transfer-Encoding replaced in place, Server appended last
    "Headers.hasHeader": "fa21ba93e0fac664",
    "Request.setHeader": "eb86f09aeab0f711",
    "maybeDeferred": "0be47f7ed8e442b9",  # a plain result handed back unwrapped where Daphne yields it
    "WebRequest.process": "e9babd1c97ce710b",  # (Daphne's, an `inlineCallbacks` generator)
    "Logger.isEnabledFor": "3418ce7db8104e66",  # a level its cache holds off is off: the debug checks' shortcut
    "HTTPChannel.headerReceived": "c5cb8e0dd2fe0b44",  # a request's header line, in one call where it knows it
    "HTTPChannel._maybeChooseTransferDecoder": "3b92d266a3c7bd2c",
    # An answered connection's close, at once where nothing is queued:
    "HTTPChannel.loseConnection": "ad10d919b228424b",
    "tcp ConnectionMixin.loseConnection": "fc4b216ae210b045",
    "FileDescriptor.loseConnection": "e13b8468f05208ae",
    "FileDescriptor.doWrite": "a986d7b1b1054e43",
    "FileDescriptor._postLoseConnection": "684e97f94f7e5041",
    "FileDescriptor.unregisterProducer": "5f09066c8d7f05b0",
    "PosixReactorBase._disconnectSelectable": "9d6de0e555ea44fe",
}


def _request_started() -> tuple[Server, WebRequest, Channel]:
    """A Daphne server and a request whose streamed answer has started (headers, `: ok`)."""
    channel = Channel()
    request = WebRequest(channel)
    request.clientproto, request.method = b"HTTP/1.1", b"POST"
    server = Server.__new__(Server)
    server.connections = {request: {}}
    _send(server, request, {"type": "http.response.start", "status": 200, "headers": []})
    _send(server, request, {"type": "http.response.body", "body": b": ok\n\n", "more_body": True})
    return server, request, channel


def _send(server: Server, request: WebRequest, message: dict) -> None:
    with pytest.raises(StopIteration):  # Daphne's send never waits for HTTP messages
        server.handle_reply(request, message).send(None)


def _calls(action) -> list[str]:
    """The Python functions of Daphne, Twisted, logging and the hooks that run while `action()`
    runs."""
    return functions_called(
        action, where=("/daphne/", "/twisted/", "/logging/", "geosense/daphne_hooks.py")
    )


def test_the_functions_the_hooks_stand_in_for_are_those_they_were_written_for():
    from daphne import http_protocol
    from twisted.web.http_headers import _NameEncoder, _sanitizeLinearWhitespace

    originals = {
        "Server.handle_reply": Server.handle_reply.__wrapped__,
        "Server.check_headers_type": Server.check_headers_type,
        "WebRequest.handle_reply": WebRequest.handle_reply,
        "Request.write": http.Request.write,
        "HTTPChannel.writeSequence": http.HTTPChannel.writeSequence,
        "toChunk": http.toChunk,
        "HTTPChannel.writeHeaders": http.HTTPChannel.writeHeaders,
        "log.callWithLogger": log.callWithLogger,
        "autobahn sendMessage": AutobahnProtocol.sendMessage,
        "autobahn sendFrame": AutobahnProtocol.sendFrame,
        "autobahn sendData": AutobahnProtocol.sendData,
        "AsyncioSelectorReactor.addReader": asyncioreactor.AsyncioSelectorReactor.addReader,
        "AsyncioSelectorReactor.addWriter": asyncioreactor.AsyncioSelectorReactor.addWriter,
        "WebSocketProtocol.__eq__": WebSocketProtocol.__eq__,
        "WebSocketProtocol.handle_reply": WebSocketProtocol.handle_reply,
        "WebSocketProtocol.serverSend": WebSocketProtocol.serverSend,
        "Headers.addRawHeader": Headers.addRawHeader.__wrapped__,
        "Headers.getRawHeaders": Headers.getRawHeaders.__wrapped__,
        "_NameEncoder.encode": _NameEncoder.encode,
        "_sanitizeLinearWhitespace": _sanitizeLinearWhitespace,
        "txaio Logger._set_log_level": txaio_tx.Logger._set_log_level,
        "txaio Logger.__get__": txaio_tx.Logger.__get__,
        "Headers.setRawHeaders": Headers.setRawHeaders,
        "Headers.hasHeader": Headers.hasHeader,
        "Request.setHeader": http.Request.setHeader,
        "maybeDeferred": http_protocol.maybeDeferred.__wrapped__,
        "WebRequest.process": WebRequest.process.__wrapped__,
        "Logger.isEnabledFor": logging.Logger.isEnabledFor,
        "HTTPChannel.headerReceived": http.HTTPChannel.headerReceived.__wrapped__,
        "HTTPChannel._maybeChooseTransferDecoder": http.HTTPChannel._maybeChooseTransferDecoder,
        "HTTPChannel.loseConnection": http.HTTPChannel.loseConnection.__wrapped__,
        "tcp ConnectionMixin.loseConnection": tcp.Server.loseConnection,
        "FileDescriptor.loseConnection": abstract.FileDescriptor.loseConnection,
        "FileDescriptor.doWrite": abstract.FileDescriptor.doWrite,
        "FileDescriptor._postLoseConnection": tcp.Server._postLoseConnection,
        "FileDescriptor.unregisterProducer": abstract.FileDescriptor.unregisterProducer,
        "PosixReactorBase._disconnectSelectable": posixbase.PosixReactorBase._disconnectSelectable,
    }
    assert source_digests(originals) == ASSUMED_SOURCES


def test_a_middle_chunk_goes_to_twisteds_write_without_daphnes_dispatch():
    """Daphne's `Server.handle_reply`, `check_headers_type`, `WebRequest.handle_reply` and its
    debug line (`debug`, `isEnabledFor`) ran for every SSE chunk before Twisted's write: 5
    Python calls, 1 now (the hook's `handle_reply`; `isEnabledFor` only where logging has
    not found DEBUG off)."""
    server, request, channel = _request_started()

    calls = _calls(lambda: _send(server, request, BODY))

    assert b"".join(channel.written[-1]) == b"a\r\nevent: x\n\n\r\n"
    assert calls == ["handle_reply", "write", "toChunk"]


def _answer_streaming(method: bytes = b"POST", status: int = 200):
    """A Daphne request on Twisted's own HTTP channel over an in-memory transport, its answer
    started (`: ok` written: the headers are out), and its server."""
    from twisted.internet.testing import StringTransport

    channel = http.HTTPChannel()
    channel.makeConnection(StringTransport())
    channel.factory = Channel.factory
    request = WebRequest(channel)
    request.clientproto, request.method = b"HTTP/1.1", method
    server = Server.__new__(Server)
    server.connections = {request: {}}
    _send(server, request, {"type": "http.response.start", "status": status, "headers": []})
    _send(server, request, {"type": "http.response.body", "body": b": ok\n\n", "more_body": True})
    return server, request, channel.transport


CHUNKS = [b"event: x\n\n", b"d" * 15, b"d" * 16, b"\x00\r\n", b"x" * 70_000, b"", b"\xc3\xa9"]


@pytest.mark.parametrize("method, status", [(b"POST", 200), (b"HEAD", 200), (b"POST", 204)])
def test_a_started_answers_chunks_are_written_as_twisted_writes_them(method, status):
    """The same bytes on the connection, and the same `sentLength`, as Twisted's
    `Request.write` under Daphne's own `handle_reply`, for chunks of every size (and none), in
    a chunked answer and in answers Twisted does not chunk (a HEAD, a 204)."""
    ours, ours_request, ours_transport = _answer_streaming(method, status)
    theirs, theirs_request, theirs_transport = _answer_streaming(method, status)
    daphnes = Server.handle_reply.__wrapped__
    for chunk in CHUNKS:
        message = {"type": "http.response.body", "body": chunk, "more_body": True}
        _send(ours, ours_request, message)
        with pytest.raises(StopIteration):
            daphnes(theirs, theirs_request, message).send(None)

    assert ours_transport.value() == theirs_transport.value()
    assert ours_request.sentLength == theirs_request.sentLength
    if method == b"POST" and status == 200:  # chunked
        assert ours_transport.value().endswith(b"\r\n2\r\n\xc3\xa9\r\n")


def test_a_chunk_of_a_started_answer_is_handed_to_the_connection_in_one_piece():
    """Twisted's `Request.write`, `toChunk` and the channel's `writeSequence` ran for every SSE
    chunk between the hook and the connection's write: the chunk is made by the hook."""
    server, request, transport = _answer_streaming()
    _send(server, request, BODY)  # logging's level cache filled

    calls = functions_called(
        lambda: _send(server, request, BODY),
        where=("/daphne/", "/twisted/web/", "/logging/", "geosense/daphne_hooks.py"),
    )

    assert transport.value().endswith(b"a\r\nevent: x\n\n\r\na\r\nevent: x\n\n\r\n")
    assert calls == ["handle_reply"]


@pytest.mark.parametrize("disabled", [False, True])
def test_a_chunks_debug_check_asks_logging_only_where_debug_may_be_on(caplog, disabled):
    """`isEnabledFor` (a Python call a chunk and a frame) is asked only until the logger has
    found DEBUG off; a level set, or a logger disabled, is heard as logging hears it."""
    from daphne.http_protocol import logger as daphne_logger

    server, request, _channel = _request_started()
    assert _calls(lambda: _send(server, request, BODY))[-1] != "isEnabledFor"

    caplog.set_level(logging.DEBUG, logger="daphne.http_protocol")  # its cache cleared
    daphne_logger.disabled = disabled
    try:
        _send(server, request, BODY)
    finally:
        daphne_logger.disabled = False

    lines = [r.getMessage() for r in caplog.records if r.name == "daphne.http_protocol"]
    assert lines == ([] if disabled else ["HTTP response chunk for None"])


def test_a_chunk_for_a_connection_gone_is_not_written_as_twisted_does_not_write_it():
    server, request, transport = _answer_streaming()
    written, sent = transport.value(), request.sentLength
    request._disconnected = True

    _send(server, request, BODY)

    assert (transport.value(), request.sentLength) == (written, sent)


def test_a_middle_chunks_debug_line_is_written_where_debug_logging_is_on(caplog):
    server, request, _channel = _request_started()
    request.client_addr = ["127.0.0.1", 50000]

    with caplog.at_level(logging.DEBUG, logger="daphne.http_protocol"):
        _send(server, request, BODY)

    assert caplog.messages == ["HTTP response chunk for ['127.0.0.1', 50000]"]


@pytest.mark.parametrize("closed", ["unknown", "disconnected", "finished", "no channel"])
def test_a_chunk_for_a_closed_answer_is_dropped_as_daphne_drops_it(closed):
    server, request, channel = _request_started()
    written = len(channel.written)
    if closed == "unknown":
        server.connections.clear()
    elif closed == "disconnected":
        server.connections[request]["disconnected"] = True
    elif closed == "finished":
        request.finished = True
    else:
        request.channel = None

    _send(server, request, BODY)

    assert len(channel.written) == written


def test_a_chunk_before_the_start_is_refused_as_daphne_refuses_it():
    request = WebRequest(Channel())
    server = Server.__new__(Server)
    server.connections = {request: {}}

    with pytest.raises(ValueError, match="not yet been started"):
        _send(server, request, BODY)


def test_the_last_chunk_takes_daphnes_own_path(monkeypatch):
    server, request, _channel = _request_started()
    replies: list[dict] = []
    monkeypatch.setattr(
        WebRequest, "handle_reply", lambda request, message: replies.append(message)
    )
    last = {"type": "http.response.body", "body": b"end"}

    _send(server, request, BODY)
    _send(server, request, last)

    assert replies == [last]


def test_a_sockets_frame_goes_to_its_protocol_without_the_start_check_or_a_python_hash(
    monkeypatch,
):
    """A socket's every frame went through `check_headers_type` and Daphne's Python
    `WebSocketProtocol.__hash__` (twice) on its way to the protocol."""
    socket = WebSocketProtocol.__new__(WebSocketProtocol)
    frames: list[dict] = []
    monkeypatch.setattr(WebSocketProtocol, "handle_reply", lambda _socket, m: frames.append(m))
    server = Server.__new__(Server)
    server.connections = {socket: {}}
    frame = {"type": "websocket.send", "text": '{"type": "event"}'}

    calls = _calls(lambda: _send(server, socket, frame))

    assert frames == [frame]
    assert calls == ["handle_reply"]
    server.connections[socket]["disconnected"] = True
    _send(server, socket, frame)
    assert frames == [frame]


def _socket_open(sent: list) -> WebSocketProtocol:
    """A Daphne socket protocol, accepted, whose frames autobahn would send go to `sent`."""
    socket = WebSocketProtocol.__new__(WebSocketProtocol)
    socket.state = WebSocketProtocol.STATE_OPEN
    socket.client_addr = ["127.0.0.1", 50000]
    socket.sendMessage = lambda payload, binary=False: sent.append((payload, binary))
    return socket


def test_a_sockets_text_frame_goes_to_autobahns_send_without_daphnes_dispatch():
    """Daphne's `WebSocketProtocol.handle_reply`, `serverSend` and its debug line (`debug`,
    `isEnabledFor`) ran for every frame a socket's consumer sent (each turn event, each client
    tool's invoke): 5 Python calls before autobahn's `sendMessage`, 1 now."""
    sent: list = []
    socket = _socket_open(sent)
    server = Server.__new__(Server)
    server.connections = {socket: {}}
    frame = {"type": "websocket.send", "text": '{"é": 1}'}
    _send(server, socket, frame)  # logging's level cache filled

    calls = _calls(lambda: _send(server, socket, frame))

    assert sent == [('{"é": 1}'.encode(), False)] * 2
    assert calls == ["handle_reply"]


@pytest.mark.parametrize(
    "frame",
    [
        {"text": '{"type": "event"}'},
        {"bytes": b"\x00\x01"},
        {"text": ""},
        {"text": "", "bytes": b"b"},
        {"text": None, "bytes": None},
        {},
    ],
    ids=["text", "bytes", "empty text", "empty text and bytes", "nones", "neither"],
)
def test_a_sockets_frame_is_sent_as_daphne_sends_it(frame):
    by_hook: list = []
    by_daphne: list = []
    hooked, own = _socket_open(by_hook), _socket_open(by_daphne)
    server = Server.__new__(Server)
    server.connections = {hooked: {}}
    message = {"type": "websocket.send", **frame}

    _send(server, hooked, message)
    _SOCKET_REPLY(own, message)

    assert by_hook == by_daphne


def test_a_frame_with_text_and_bytes_or_before_the_accept_is_refused_as_daphne_refuses_it():
    socket = _socket_open([])
    server = Server.__new__(Server)
    server.connections = {socket: {}}

    with pytest.raises(ValueError, match="contains both bytes and text"):
        _send(server, socket, {"type": "websocket.send", "text": "a", "bytes": b"b"})
    socket.state = WebSocketProtocol.STATE_CONNECTING
    with pytest.raises(ValueError, match="has not been accepted"):
        _send(server, socket, {"type": "websocket.send", "text": "a"})


def test_a_sockets_frames_debug_line_is_written_where_debug_logging_is_on(caplog):
    socket = _socket_open([])
    server = Server.__new__(Server)
    server.connections = {socket: {}}

    with caplog.at_level(logging.DEBUG, logger="daphne.ws_protocol"):
        _send(server, socket, {"type": "websocket.send", "text": "a"})

    assert caplog.messages == ["Sent WebSocket packet to client for ['127.0.0.1', 50000]"]


def test_a_start_with_a_header_not_in_bytes_is_answered_500_and_refused_as_daphne_does(
    monkeypatch,
):
    request = WebRequest(Channel())
    server = Server.__new__(Server)
    server.connections = {request: {}}
    errors: list[tuple] = []
    monkeypatch.setattr(request, "basic_error", lambda *error: errors.append(error))

    with pytest.raises(ValueError, match="expected to be `bytes`"):
        _send(
            server,
            request,
            {"type": "http.response.start", "status": 200, "headers": [("x", b"1")]},
        )
    with pytest.raises(KeyError):  # no type: Daphne's check fails on it
        _send(server, request, {"status": 200})

    assert errors == [(500, b"Server Error", "Server Error")]


HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"Cache-Control", b"no-cache"),
    (b"content-type", b"text/plain"),  # a second value of the same name
    ("X-Text", "caf\u00e9"),  # str name and value: Twisted's own path
    (b"x-folded", b"a\r\n b\nc"),  # line breaks folded as Twisted folds them
    (b"x-empty", b""),
    (b"www-authenticate", b"Bearer"),  # a name of Twisted's special cases
]


def test_headers_are_added_as_twisted_adds_them():
    twisteds = Headers.addRawHeader.__wrapped__
    for _ in range(2):  # the names new, then in Twisted's cache
        ours, theirs = Headers(), Headers()
        for name, value in HEADERS:
            ours.addRawHeader(name, value)
            twisteds(theirs, name, value)
        assert ours._rawHeaders == theirs._rawHeaders
        assert list(ours.getAllRawHeaders()) == list(theirs.getAllRawHeaders())
    with pytest.raises(InvalidHeaderName):
        Headers().addRawHeader(b"bad name", b"1")


def test_a_header_twisted_knows_is_added_in_one_python_call():
    """`addRawHeader`, `_NameEncoder.encode`, `_sanitizeLinearWhitespace`: three Python calls
    for every header of every answer (and request)."""
    headers = Headers()
    headers.addRawHeader(b"content-type", b"text/event-stream")

    calls = _calls(lambda: headers.addRawHeader(b"content-type", b"text/html"))

    assert calls == ["add_raw_header_known"]
    assert headers.getRawHeaders(b"content-type") == [b"text/event-stream", b"text/html"]


def test_the_hooks_are_installed_once():
    handle_reply, add_raw_header = Server.handle_reply, http_headers.Headers.addRawHeader
    from geosense.daphne_hooks import daphne_hooks_install

    daphne_hooks_install()

    assert Server.handle_reply is handle_reply
    assert http_headers.Headers.addRawHeader is add_raw_header


@pytest.mark.parametrize("library", ["daphne", "twisted", "autobahn", "txaio"])
def test_the_hooks_stay_out_of_a_library_they_were_not_written_for(monkeypatch, caplog, library):
    """All but the listen backlog (through Twisted's documented endpoint strings) and the form
    parsing's switch (an attribute Twisted's request reads)."""
    import importlib

    from daphne import server

    from geosense.daphne_hooks import daphne_hooks_install

    daphnes, twisteds = Server.handle_reply.__wrapped__, Headers.addRawHeader.__wrapped__
    monkeypatch.setattr(Server, "handle_reply", daphnes)
    monkeypatch.setattr(Headers, "addRawHeader", twisteds)
    monkeypatch.setattr(server, "serverFromString", server.serverFromString.__wrapped__)
    monkeypatch.setattr(importlib.import_module(library), "__version__", "99.0.0")
    # A release that renamed the private names the hooks read still starts (review 31-b L1).
    monkeypatch.delattr(txaio_tx, "_no_op")
    monkeypatch.delattr(http_headers._nameEncoder, "_canonicalHeaderCache")

    daphne_hooks_install()

    assert Server.handle_reply is daphnes and Headers.addRawHeader is twisteds
    assert "not installed" in caplog.text and "99.0.0" in caplog.text
    assert server.serverFromString(object(), "tcp:port=0")._backlog == LISTEN_BACKLOG
    assert WebRequest.__init__.without_form_parsing


def test_the_module_reads_no_private_name_of_the_libraries_when_imported():
    """Review 31-b L1: Twisted's canonical-names cache (and txaio's `_no_op`) were read as the
    module was imported, before the versions' check: a release that renamed one would have
    stopped the process from starting instead of serving without the hooks."""
    import subprocess
    import sys

    code = (
        "from twisted.web import http_headers; "
        "del http_headers._nameEncoder._canonicalHeaderCache; "
        "import geosense.daphne_hooks"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_body_message_to_a_socket_is_its_protocols_to_refuse(monkeypatch):
    """Daphne hands any message but a start to the protocol: a body message sent to a socket
    reaches the socket's `handle_reply` (which ignores it) rather than failing on the way."""
    socket = WebSocketProtocol.__new__(WebSocketProtocol)
    messages: list[dict] = []
    monkeypatch.setattr(WebSocketProtocol, "handle_reply", lambda _s, m: messages.append(m))
    server = Server.__new__(Server)
    server.connections = {socket: {}}

    _send(server, socket, BODY)

    assert messages == [BODY]


# --- connections -----------------------------------------------------------------------------


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


def _hook_calls(action) -> list[str]:
    """The Python functions of the hooks alone that run while `action()` runs."""
    return functions_called(action, where=("geosense/daphne_hooks.py",))


def test_a_sequence_is_checked_and_sent_without_a_python_call_per_piece():
    """An SSE chunk is three pieces (size, event, line end): each was checked by a generator
    step of its own, four Python calls per chunk on the event loop; then the connection's
    check and the send were a call each."""
    with _connection(b"") as (connection, _ours, theirs, _writers):
        calls = _hook_calls(lambda: connection.writeSequence(http.toChunk(b"event")))
        assert theirs.recv(64) == b"5\r\nevent\r\n"
    assert calls == ["write_sequence_now", "write_now"]


def test_a_write_to_an_idle_connection_is_sent_in_one_python_call():
    """Each frame and SSE chunk written: the connection's `write`, then its check and send
    (`_unsent`): two Python calls, one now."""
    with _connection(b"") as (connection, _ours, theirs, _writers):
        calls = _hook_calls(lambda: connection.write(b"frame"))
        assert theirs.recv(64) == b"frame"
    assert calls == ["write_now"]


@pytest.mark.parametrize("kernel_takes", [0, 2], ids=["nothing", "part"])
def test_what_the_kernel_does_not_take_is_queued_by_twisted(kernel_takes):
    with _connection(b"") as (connection, ours, theirs, writers):
        connection.socket = type("Full", (), {})()
        connection.socket.send = lambda data: ours.send(data[:kernel_takes])
        connection.write(b"frame")
        assert writers == [connection]
        connection.socket = ours
        connection.doWrite()
        assert theirs.recv(64) == b"frame"


def test_a_frame_sent_makes_its_unwritten_debug_text_without_a_python_call():
    """autobahn asks `hltype` and `hlval` three times for every frame it sends, for a debug
    line that is not written: each deferred text took two Python calls (a function and an
    `__init__`); it is a `functools.partial`, made in C, formatted only if written."""
    from autobahn import util
    from autobahn.websocket import protocol as autobahn_protocol

    protocol, transport = socket_opened()
    calls = _hook_calls(lambda: protocol.sendMessage(b'{"type": "event"}'))

    assert transport.value().endswith(b'{"type": "event"}')
    assert calls == []
    deferred = autobahn_protocol.hlval(42, color="green")
    assert not isinstance(deferred, str), "autobahn's own hlval ran (inspect, click.style)"
    assert not isinstance(autobahn_protocol.hltype(protocol.sendMessage), str)
    assert str(deferred) == f"{deferred}" == str(util.hlval(42, color="green"))


def test_a_response_message_through_daphne_takes_no_deprecation_proxy_or_python_hash():
    """A response message on Daphne's own path (an answer's start and its last chunk; a middle
    chunk takes `handle_reply`'s fast path, tested above) went through Daphne's
    `Server.handle_reply`, which hashed the request twice by a Python `__hash__`, and
    `WebRequest.handle_reply`, which looked up `http.Request` through Twisted's deprecation
    proxy of the module (six Python calls): 13 Python calls in Daphne and Twisted, 5 now."""
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


def test_autobahns_timings_still_read_as_text():
    """The deferred `pformat` is for autobahn's log lines; its `Timings` formats through the
    same module's `pformat` and must still give a text."""
    from autobahn.websocket.protocol import Timings

    timings = Timings()
    timings.track("open")
    assert isinstance(str(timings), str) and "open" in str(timings)


@pytest.mark.parametrize("verbosity", [1, 2])
def test_a_connections_events_are_called_without_a_log_context_where_twisteds_log_goes_nowhere(
    monkeypatch, verbosity
):
    """The asyncio reactor called every read and write event of a connection through Twisted's
    `log.callWithLogger`, which pushed a log context naming the connection for the call: ~8
    Python calls an event (2-3 a turn) for Twisted's log, which at Daphne's default
    verbosity goes nowhere; there the event is called directly. A higher verbosity keeps it."""
    from daphne.http_protocol import HTTPFactory

    monkeypatch.setattr(asyncioreactor, "callWithLogger", log.callWithLogger)
    server = Channel.factory.server
    monkeypatch.setattr(server, "verbosity", verbosity, raising=False)
    factory = HTTPFactory(server)
    factory.startFactory()
    factory.stopFactory()

    class Connection:
        def logPrefix(self):
            return "HTTPChannel,7,127.0.0.1"

    read: list = []
    connection = Connection()
    event = asyncioreactor.callWithLogger

    calls = functions_called(
        lambda: event(connection, read.append, connection),
        where=("/twisted/", "geosense/daphne_hooks.py"),
    )
    event(connection, lambda: read.append(log.context.get(log.ILogContext)["system"]))

    assert read[0] is connection
    if verbosity == 1:
        assert calls == ["_called_without_log_context"]
        assert read[1] == "-"  # the process's own context
    else:
        assert event is log.callWithLogger and len(calls) >= 8
        assert read[1] == "HTTPChannel,7,127.0.0.1"


def test_an_events_failure_is_swallowed_and_logged_as_twisted_does(monkeypatch):
    from geosense.daphne_hooks import _called_without_log_context

    logged = []
    monkeypatch.setattr(log, "err", lambda *args, **kwargs: logged.append(args))

    def fails():
        raise RuntimeError("boom")

    def interrupted():
        raise KeyboardInterrupt

    assert _called_without_log_context(None, fails) is None
    assert len(logged) == 1
    with pytest.raises(KeyboardInterrupt):
        _called_without_log_context(None, interrupted)


def _daphne_socket_opened():
    """Daphne's socket protocol in the state of an autobahn server socket whose handshake is
    done, over an in-memory transport; and its server."""
    opened, transport = socket_opened()
    socket = WebSocketProtocol.__new__(WebSocketProtocol)
    socket.__dict__.update(opened.__dict__)
    socket.client_addr = ["127.0.0.1", 50000]
    server = Server.__new__(Server)
    server.connections = {socket: {}}
    return server, socket, transport


TEXTS = ["x", "a" * 125, "a" * 126, "é" * 40_000, "a" * 65_535, "a" * 65_536, "b" * 70_000]


@pytest.mark.parametrize("text", TEXTS, ids=lambda text: str(len(text.encode())))
@pytest.mark.parametrize("option", [None, "autoFragmentSize", "maxMessagePayloadSize"])
def test_a_sockets_text_frame_is_the_frame_autobahn_makes(text, option):
    """The bytes on the connection and autobahn's traffic counts are those of autobahn's
    `sendMessage`, for every length class of the frame's header; with an option that changes
    the frame (fragments, a payload limit) autobahn's own send runs."""
    server, socket, transport = _daphne_socket_opened()
    theirs, their_transport = socket_opened()
    for protocol in (socket, theirs):
        if option:
            setattr(protocol, option, 1000)
    before = transport.value()
    their_before = their_transport.value()
    outcomes = []
    for send in (
        lambda: _send(server, socket, {"type": "websocket.send", "text": text}),
        lambda: theirs.sendMessage(text.encode(), False),
    ):
        try:
            send()
            outcomes.append(None)
        except Exception as exc:
            outcomes.append(type(exc))

    assert outcomes[0] == outcomes[1]
    assert transport.value()[len(before) :] == their_transport.value()[len(their_before) :]
    assert vars(socket.trafficStats) == vars(theirs.trafficStats)


def test_a_sockets_text_frame_is_written_without_autobahns_three_sends():
    """autobahn's `sendMessage`, `sendFrame`, `sendData` and its debug line's logger (txaio's
    `__get__` and a no-op) ran for every frame a socket's consumer sent (each turn event, each
    client tool's invoke): 5 Python calls between the hook and the connection's write."""
    server, socket, transport = _daphne_socket_opened()
    frame = {"type": "websocket.send", "text": '{"type": "event"}'}
    _send(server, socket, frame)  # logging's level cache filled

    calls = functions_called(
        lambda: _send(server, socket, frame),
        where=("/daphne/", "/autobahn/", "/txaio/", "/logging/", "geosense/daphne_hooks.py"),
    )

    assert transport.value().endswith(b'\x81\x11{"type": "event"}' * 2)
    assert calls == ["handle_reply"]


def test_a_sockets_text_frame_takes_autobahns_path_while_its_debug_lines_are_on():
    """With autobahn's debug logging on, a frame goes through autobahn's own sends, whose
    `sendData` writes its debug line (review 31-a L4); the same bytes either way."""
    from geosense.daphne_hooks import _AUTOBAHN_LOG

    server, socket, transport = _daphne_socket_opened()
    frame = {"type": "websocket.send", "text": '{"type": "event"}'}
    level = _AUTOBAHN_LOG._log_level
    _AUTOBAHN_LOG.set_log_level("debug")
    try:
        calls = functions_called(lambda: _send(server, socket, frame), where=("/autobahn/",))
    finally:
        _AUTOBAHN_LOG.set_log_level(level, keep=False)

    assert {"sendMessage", "sendFrame", "sendData"} <= set(calls)
    assert transport.value().endswith(b'\x81\x11{"type": "event"}')


def _request_fresh(server_name: str = "daphne") -> tuple[Server, WebRequest]:
    channel = Channel()
    request = WebRequest(channel)
    request.clientproto, request.method = b"HTTP/1.1", b"POST"
    request.server = type("Server", (), {"server_name": server_name})()
    server = Server.__new__(Server)
    server.connections = {request: {}}
    return server, request


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"content-type", b"text/event-stream"), (b"x-frame-options", b"DENY")],
        [(b"content-type", b"a"), (b"x-folded", b"a\r\n b"), (b"content-type", b"b")],
        [(b"server", b"ours"), (b"x-a", b"1")],
        [(b"x-never-seen-before-%d" % id(object()), b"1")],  # a name not in Twisted's cache
    ],
    ids=["none", "some", "folded and repeated", "own server", "new name"],
)
@pytest.mark.parametrize("server_name", ["daphne", ""])
def test_an_answers_start_sets_what_daphnes_start_sets(headers, server_name):
    """The status, the headers in order and Daphne's `Server` header (unless the answer has
    one, or the server has no name) as Daphne's `WebRequest.handle_reply` sets them."""
    ours, ours_request = _request_fresh(server_name)
    _theirs, theirs_request = _request_fresh(server_name)
    message = {"type": "http.response.start", "status": 201, "headers": headers}

    _send(ours, ours_request, message)
    WebRequest.handle_reply(theirs_request, message)

    for request in (ours_request, theirs_request):
        assert request._response_started
    assert (ours_request.code, ours_request.code_message) == (201, b"Created")
    assert list(ours_request.responseHeaders.getAllRawHeaders()) == list(
        theirs_request.responseHeaders.getAllRawHeaders()
    )


def test_an_answer_started_twice_or_without_a_status_is_refused_as_daphne_refuses_it():
    server, request = _request_fresh()
    with pytest.raises(ValueError, match="status code is required"):
        _send(server, request, {"type": "http.response.start", "headers": []})
    server, request = _request_fresh()
    _send(server, request, {"type": "http.response.start", "status": 200, "headers": []})
    with pytest.raises(ValueError, match="already been started"):
        _send(server, request, {"type": "http.response.start", "status": 200, "headers": []})


def test_an_answers_start_costs_few_python_calls():
    """Daphne's `WebRequest.handle_reply` added each header through `addRawHeader` (a Python
    call each), then `hasHeader` and `setHeader` for its `Server` header (with
    `setRawHeaders`, the name's encoding twice and the value's folding) and its debug line:
    ~17 Python calls an answer's start with nine headers, not counting the status."""
    server, request = _request_fresh()
    headers = [(b"content-type", b"text/event-stream")] * 9
    warm, warm_request = _request_fresh()
    _send(warm, warm_request, {"type": "http.response.start", "status": 200})  # caches filled

    calls = _calls(
        lambda: _send(
            server, request, {"type": "http.response.start", "status": 200, "headers": headers}
        )
    )

    assert calls == [
        "handle_reply",
        "check_headers_type",
        "_answer_started",
        "setResponseCode",
    ]


def _answer_opened(clientproto: bytes, method: bytes):
    """A Daphne request on Twisted's own HTTP channel over an in-memory transport, nothing
    of its answer sent yet, and its server."""
    from twisted.internet.testing import StringTransport

    channel = http.HTTPChannel()
    channel.makeConnection(StringTransport())
    channel.factory = Channel.factory
    request = WebRequest(channel)
    request.clientproto, request.method = clientproto, method
    server = Server.__new__(Server)
    server.connections = {request: {}}
    return server, request, channel.transport


@pytest.mark.parametrize(
    "clientproto, method, status, headers, first",
    [
        (b"HTTP/1.1", b"POST", 200, [(b"content-type", b"text/event-stream")], b": ok\n\n"),
        (b"HTTP/1.1", b"GET", 200, [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")], b"x"),
        (b"HTTP/1.1", b"POST", 200, [(b"content-length", b"5")], b"hello"),
        (b"HTTP/1.1", b"HEAD", 200, [], b"hello"),
        (b"HTTP/1.1", b"GET", 304, [], b"x"),
        (b"HTTP/1.0", b"GET", 200, [], b"x"),
        (b"HTTP/1.1", b"GET", 200, [(b"transfer-encoding", b"gzip")], b"x"),
        (b"HTTP/1.1", b"POST", 200, [], b""),
    ],
    ids=["sse", "cookies", "length", "head", "304", "http/1.0", "own encoding", "empty"],
)
def test_an_answers_first_part_is_written_as_twisted_writes_it(
    clientproto, method, status, headers, first
):
    """The status line, the headers and the first part (chunked or not), then the next parts,
    are the bytes Twisted's `Request.write` writes under Daphne's own `handle_reply`, with the
    same `sentLength` and chunking, for every kind of answer Twisted writes apart."""
    daphnes = Server.handle_reply.__wrapped__
    sent = []
    for send in (
        _send,
        lambda server, request, message: _daphnes(daphnes, server, request, message),
    ):
        server, request, transport = _answer_opened(clientproto, method)
        for message in (
            {"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": first, "more_body": True},
            {"type": "http.response.body", "body": b"next", "more_body": True},
        ):
            send(server, request, message)
        sent.append((transport.value(), request.sentLength, request.chunked))

    assert sent[0] == sent[1]


def _daphnes(handle_reply, server, request, message) -> None:
    with pytest.raises(StopIteration):
        handle_reply(server, request, message).send(None)


def test_an_answers_head_and_first_part_go_to_the_connection_in_one_write():
    """Twisted's first `Request.write` of an answer read and set its headers through
    `getRawHeaders`, `setRawHeaders` (with the name's encoding and the value's folding),
    `writeHeaders` and `getAllRawHeaders`, then wrote the part through `toChunk` and the
    channel's `writeSequence`: two writes (two `send`s) and ~10 Python calls an answer."""
    warm, warm_request, _ = _answer_opened(b"HTTP/1.1", b"POST")
    _send(warm, warm_request, {"type": "http.response.start", "status": 200, "headers": []})
    _send(warm, warm_request, BODY)  # caches filled
    server, request, transport = _answer_opened(b"HTTP/1.1", b"POST")
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]}
    _send(server, request, start)
    writes = []
    transport.write = writes.append

    calls = functions_called(
        lambda: _send(server, request, BODY),
        where=("/daphne/", "/twisted/web/", "/logging/", "geosense/daphne_hooks.py"),
    )

    assert writes == [
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\nServer: daphne\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"a\r\nevent: x\n\n\r\n"
    ]
    assert calls == ["handle_reply", "_answer_head_written"]


@pytest.mark.parametrize(
    "name",
    [b"Content-Type", b"content-type", b"x-absent", b"x-empty", "Content-Type", b"x-new-%d"],
)
@pytest.mark.parametrize("default", [None, ["d"]])
def test_headers_are_read_as_twisted_reads_them(name, default):
    """A header's values (or the default for one absent or without values), the same object
    as Twisted's `getRawHeaders` returns, for names in its cache or not, bytes or text."""
    if isinstance(name, bytes) and b"%d" in name:
        name = name % id(object())  # a name Twisted has not seen
    twisteds = Headers.getRawHeaders.__wrapped__
    headers = Headers()
    headers.addRawHeader(b"content-type", b"text/event-stream")
    headers._rawHeaders[b"X-Empty"] = []
    twisteds(Headers(), name)  # the name in Twisted's cache, as Twisted's parse leaves it

    ours, theirs = headers.getRawHeaders(name, default), twisteds(headers, name, default)

    assert ours == theirs
    assert type(ours) is type(theirs)
    if isinstance(theirs, list) and isinstance(name, bytes):
        assert ours is theirs


def test_a_header_twisted_knows_is_read_in_one_python_call():
    """`getRawHeaders` and `_NameEncoder.encode`: two Python calls for each of the four headers
    Twisted reads of every request as it parses it."""
    headers = Headers()
    headers.addRawHeader(b"connection", b"close")
    headers.getRawHeaders(b"Connection")  # the name in Twisted's cache, as after a request

    calls = _calls(lambda: headers.getRawHeaders(b"Connection"))

    assert calls == ["get_raw_headers_known"]
    assert headers.getRawHeaders(b"Connection") == [b"close"]


HEADER_LINES = [
    b"Content-Type: application/json",
    b"content-type:application/json",  # the name as clients spell it, no space
    b"Authorization:  Bearer abc \t",  # whitespace stripped as Twisted strips it
    b"X-Empty:",
    b"X-Colons: a:b:c",
    b"Content-Length: 12",  # lengths choose the body's decoder: Twisted's path
    b"Content-Length: x",
    b"Transfer-Encoding: chunked",
    b"X-Nul: a\x00b",  # Twisted answers 400
    b"X-Cr: a\rb",
    b"no colon",
    b"Bad Name: x",
    b"X-Never-Seen-Before-By-Twisted: 1",
]


def _channel_reading(twisteds: bool) -> tuple[http.HTTPChannel, list]:
    """An HTTP channel parsing a request's headers, what it writes (a 400) in `written`."""
    channel = http.HTTPChannel()
    written: list = []
    channel.transport = type(
        "Transport",
        (),
        {"write": written.append, "getPeer": Channel.getPeer, "getHost": Channel.getHost},
    )()
    channel.requests.append(http.Request(channel))
    channel.loseConnection = lambda: written.append("closed")
    if twisteds:
        channel.headerReceived = http.HTTPChannel.headerReceived.__wrapped__.__get__(channel)
    return channel, written


@pytest.mark.parametrize("line", HEADER_LINES)
def test_a_header_line_is_read_as_twisted_reads_it(line):
    for name in (b"Content-Type", b"content-type", b"Authorization", b"X-Empty", b"X-Colons"):
        Headers().addRawHeader(name, b"")  # the names in Twisted's cache, as after a request
    ours, ours_written = _channel_reading(twisteds=False)
    theirs, theirs_written = _channel_reading(twisteds=True)

    assert ours.headerReceived(line) == theirs.headerReceived(line)
    assert ours.requests[-1].requestHeaders == theirs.requests[-1].requestHeaders
    assert ours_written == theirs_written
    assert (ours.length, ours._receivedHeaderCount) == (theirs.length, theirs._receivedHeaderCount)
    assert type(ours._transferDecoder) is type(theirs._transferDecoder)


def test_a_request_past_its_header_limit_is_refused_as_twisted_refuses_it():
    Headers().addRawHeader(b"X-Many", b"")
    ours, ours_written = _channel_reading(twisteds=False)
    theirs, theirs_written = _channel_reading(twisteds=True)
    ours.maxHeaders = theirs.maxHeaders = 2

    assert [ours.headerReceived(b"X-Many: 1") for _ in range(3)] == [True, True, False]
    assert [theirs.headerReceived(b"X-Many: 1") for _ in range(3)] == [True, True, False]
    assert ours_written == theirs_written != []


def test_a_header_line_twisted_knows_is_read_in_one_python_call():
    """`headerReceived`, `_NameEncoder.encode`, `_maybeChooseTransferDecoder` and
    `addRawHeader`: four Python calls for each header of every request."""
    Headers().addRawHeader(b"content-type", b"")
    channel, _written = _channel_reading(twisteds=False)

    calls = _calls(lambda: channel.headerReceived(b"content-type: application/json"))

    assert calls == ["header_received_known"]
    assert channel.requests[-1].requestHeaders.getRawHeaders(b"content-type") == [
        b"application/json"
    ]


# --- an answered connection's close ----------------------------------------------------------


class _Reactor:
    """What a Twisted connection asks of its reactor, in order."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def addReader(self, reader):
        self.asked.append("addReader")

    def removeReader(self, reader):
        self.asked.append("removeReader")

    def addWriter(self, writer):
        self.asked.append("addWriter")

    def removeWriter(self, writer):
        self.asked.append("removeWriter")


@contextmanager
def _http_served():
    """An HTTP channel on a TCP connection Twisted's server side accepted (`tcp.Server`, its
    reactor `_Reactor`), the client's socket, and the reasons the channel was told it lost
    the connection for."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as client:
            accepted, address = listener.accept()
            accepted.setblocking(False)
            channel = http.HTTPChannel()
            channel.timeOut = None
            transport = tcp.Server(accepted, channel, address, None, 1, _Reactor())
            channel.makeConnection(transport)
            lost: list = []
            channel.connectionLost = lost.append
            client.settimeout(5)
            yield channel, transport, client, lost


def _received_to_the_end(client: socket.socket) -> bytes:
    received = b""
    while chunk := client.recv(4096):
        received += chunk
    return received


def test_an_answered_connection_with_nothing_queued_is_closed_at_once():
    """Twisted closed a connection (every turn's stream, each on a connection of its own) in
    its reactor's next write round: the socket watched for writability, a round, an empty
    `send`, unwatched. With nothing queued it is closed at once, as that round closes it:
    reading stopped, the channel told the connection is done, the socket shut down."""
    with _http_served() as (channel, transport, client, lost):
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")  # sent at once: nothing left queued
        transport.reactor.asked.clear()
        channel.loseConnection()

        assert transport.reactor.asked == ["removeReader", "removeWriter"] * 2
        assert [reason.type for reason in lost] == [error.ConnectionDone]
        assert (transport.connected, transport.disconnected, transport.disconnecting) == (0, 1, 1)
        assert transport.producer is None
        assert _received_to_the_end(client) == b"HTTP/1.1 200 OK\r\n\r\n"


def test_a_connection_with_something_queued_is_closed_by_twisteds_write_round():
    with _http_served() as (channel, transport, client, lost):
        abstract.FileDescriptor.write(transport, b"queued")
        transport.reactor.asked.clear()
        channel.loseConnection()

        assert transport.reactor.asked == ["removeReader", "addWriter"]
        assert lost == []
        why = transport.doWrite()  # the round: what is queued sent, then the close
        assert isinstance(why, error.ConnectionDone)
        transport.connectionLost(failure.Failure(why))
        assert [reason.type for reason in lost] == [error.ConnectionDone]
        assert _received_to_the_end(client) == b"queued"


class _AnotherTransport(tcp.Server):
    pass


# Each state in which the early close would be wrong, made on an answered connection with
# nothing queued: the close takes Twisted's own path (review 32-b L6).
_NOT_AT_ONCE = {
    "another transport": lambda channel, t: setattr(t, "__class__", _AnotherTransport),
    "another network producer": lambda channel, t: setattr(channel, "_networkProducer", object()),
    "TLS": lambda channel, t: setattr(t, "TLS", True),
    "not connected": lambda channel, t: setattr(t, "connected", 0),
    "closing": lambda channel, t: setattr(t, "disconnecting", 1),
    "half-closing": lambda channel, t: setattr(t, "_writeDisconnecting", True),
    "half-closed": lambda channel, t: setattr(t, "_writeDisconnected", True),
    "a write queued": lambda channel, t: t._tempDataBuffer.append(b"queued"),
    "a buffer not all sent": lambda channel, t: setattr(t, "dataBuffer", b"unsent"),
    "another producer": lambda channel, t: setattr(t, "producer", object()),
}


@pytest.mark.parametrize("state", [None, *_NOT_AT_ONCE])
def test_an_answered_connection_is_closed_at_once_only_when_nothing_else_may_need_twisted(state):
    from geosense.daphne_hooks import _closed_at_once

    twisteds: list = []
    close = _closed_at_once(twisteds.append)  # Twisted's path, recorded instead of taken
    with _http_served() as (channel, transport, _client, lost):
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        if state is not None:
            _NOT_AT_ONCE[state](channel, transport)
        close(channel)
        if state is None:
            assert (twisteds, [reason.type for reason in lost]) == ([], [error.ConnectionDone])
        else:
            assert (twisteds, lost) == ([channel], [])
        transport.__class__ = tcp.Server


def test_an_answered_connections_close_costs_few_python_calls():
    """Twisted's close of a connection with nothing queued: `loseConnection` (the channel's,
    the transport's, its producer's release, `stopReading`, `startWriting`), then a round's
    `doWrite` (`writeSomeData`, `untilConcludes`, `stopWriting`, `_postLoseConnection`) and
    the reactor's `_disconnectSelectable` before the connection's own `connectionLost`, and
    their reactor calls."""
    with _http_served() as (channel, _transport, _client, lost):
        calls = _calls(channel.loseConnection)

    assert [reason.type for reason in lost] == [error.ConnectionDone]
    # 28 Python calls of Twisted's by its path (the reactor's own besides), 16 now: the
    # connection's own `connectionLost` (the rest) is the same either way.
    assert calls[:4] == ["lose_connection_now", "stopReading", "stopWriting", "connectionLost"]
    assert "doWrite" not in calls and "startWriting" not in calls


# --- a request's application made ------------------------------------------------------------


def _request_processed(create_application) -> tuple[WebRequest, Channel]:
    """A Daphne request received whole (no body) on a channel whose server makes its
    application with `create_application`."""
    server = type(
        "Server",
        (),
        {
            "root_path": "",
            "proxy_forwarded_address_header": None,
            "request_buffer_size": 8192,
            "server_name": "daphne",
            "protocol_connected": lambda self, request: None,
            "protocol_disconnected": lambda self, request: None,
            "log_action": lambda self, protocol, action, details: None,
            "create_application": staticmethod(create_application),
        },
    )()
    channel = Channel()
    channel.factory = type("Factory", (), {"server": server, "log": lambda self, request: None})()
    channel.isSecure = lambda: False
    channel.requestDone = lambda request: None
    channel.write = lambda data: channel.written.append((data,))
    request = WebRequest(channel)
    request.gotLength(0)
    request.requestReceived(b"POST", b"/api/sessions", b"HTTP/1.1")
    return request, channel


def _queue_made(made: list):
    def create_application(protocol, scope):
        made.append(scope["path"])
        return asyncio.Queue()

    return create_application


@pytest.mark.parametrize("twisteds", [False, True], ids=["ours", "twisteds"])
def test_a_requests_application_is_made_and_handed_its_body(monkeypatch, twisteds):
    from daphne import http_protocol

    if twisteds:
        monkeypatch.setattr(http_protocol, "maybeDeferred", http_protocol.maybeDeferred.__wrapped__)
    made: list = []
    request, _channel = _request_processed(_queue_made(made))

    assert made == ["/api/sessions"]
    assert request.application_queue.get_nowait() == {
        "type": "http.request",
        "body": b"",
        "more_body": False,
    }


def test_a_requests_application_is_made_without_a_deferred_around_its_queue(monkeypatch):
    """Twisted's `maybeDeferred` wrapped the queue in a fired `Deferred` (`succeed`), which
    `inlineCallbacks` took apart again (`addBoth`, its callback): 31 Python calls of Daphne's,
    Twisted's and the hooks' a request received, 26 now."""
    from daphne import http_protocol

    def counted() -> list[str]:
        _request_processed(_queue_made([]))  # warm: imports, logging's level cache
        return _calls(lambda: _request_processed(_queue_made([])))

    ours = counted()
    monkeypatch.setattr(http_protocol, "maybeDeferred", http_protocol.maybeDeferred.__wrapped__)
    theirs = counted()

    assert "maybeDeferred" not in ours and "succeed" not in ours
    assert "_gotResultInlineCallbacks" not in ours
    assert len(ours) <= len(theirs) - 5


@pytest.mark.parametrize("twisteds", [False, True], ids=["ours", "twisteds"])
def test_a_failure_to_make_the_application_is_answered_500_as_daphne_answers_it(
    monkeypatch, caplog, twisteds
):
    from daphne import http_protocol

    if twisteds:
        monkeypatch.setattr(http_protocol, "maybeDeferred", http_protocol.maybeDeferred.__wrapped__)

    def create_application(protocol, scope):
        raise RuntimeError("no application")

    request, channel = _request_processed(create_application)

    assert request.code == 500
    assert b"Daphne HTTP processing error" in b"".join(
        part for written in channel.written for part in written if isinstance(part, bytes)
    )
    assert "RuntimeError: no application" in caplog.text
