"""geosense/daphne_hooks.py: a streamed answer's chunks and every answer's headers through
Daphne and Twisted with fewer Python calls, and the same bytes."""

import hashlib
import inspect
import logging

import pytest
from daphne.http_protocol import WebRequest
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.web import http, http_headers
from twisted.web.http_headers import Headers, InvalidHeaderName

import geosense.asgi  # noqa: F401  (the process's set-up, as Daphne imports it)
from tests.daphne_probe import Channel, functions_called

BODY = {"type": "http.response.body", "body": b"event: x\n\n", "more_body": True}

# What the hooks stand in for, as they were written for Daphne 4.2.3 and Twisted 26.10.0: the
# digest of each function's source. A change here means reading the hooks against the new code
# (geosense/daphne_hooks.py's `handle_reply` is Daphne's `Server.handle_reply` with its fast path).
ASSUMED_SOURCES = {
    "Server.handle_reply": "9d9dbaea6de0657a",
    "Server.check_headers_type": "30eb62919fcdd075",
    "WebRequest.handle_reply": "3e14b239c2602d95",
    "Request.write": "0e547d4f76bd1472",
    "WebSocketProtocol.__eq__": "9717acc71a5a476e",  # by identity: hashing by identity agrees
    "Headers.addRawHeader": "c4fe96cc1a6e7950",
    "_NameEncoder.encode": "7b453627217624ac",
    "_sanitizeLinearWhitespace": "eae40a7049d09f94",
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
    from twisted.web.http_headers import _NameEncoder, _sanitizeLinearWhitespace

    originals = {
        "Server.handle_reply": Server.handle_reply.__wrapped__,
        "Server.check_headers_type": Server.check_headers_type,
        "WebRequest.handle_reply": WebRequest.handle_reply,
        "Request.write": http.Request.write,
        "WebSocketProtocol.__eq__": WebSocketProtocol.__eq__,
        "Headers.addRawHeader": Headers.addRawHeader.__wrapped__,
        "_NameEncoder.encode": _NameEncoder.encode,
        "_sanitizeLinearWhitespace": _sanitizeLinearWhitespace,
    }
    digests = {
        name: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]
        for name, function in originals.items()
    }
    assert digests == ASSUMED_SOURCES


def test_a_middle_chunk_goes_to_twisteds_write_without_daphnes_dispatch():
    """Daphne's `Server.handle_reply`, `check_headers_type`, `WebRequest.handle_reply` and its
    debug line (`debug`, `isEnabledFor`) ran for every SSE chunk before Twisted's write: 5
    Python calls, 2 now (the hook's `handle_reply`, `isEnabledFor`)."""
    server, request, channel = _request_started()

    calls = _calls(lambda: _send(server, request, BODY))

    assert b"".join(channel.written[-1]) == b"a\r\nevent: x\n\n\r\n"
    assert calls == ["handle_reply", "write", "toChunk", "isEnabledFor"]


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
    from geosense.daphne_hooks import daphne_response_hooks

    daphne_response_hooks()

    assert Server.handle_reply is handle_reply
    assert http_headers.Headers.addRawHeader is add_raw_header


def test_the_hooks_stay_out_of_a_daphne_they_were_not_written_for(monkeypatch, caplog):
    import daphne

    from geosense.daphne_hooks import daphne_response_hooks

    daphnes, twisteds = Server.handle_reply.__wrapped__, Headers.addRawHeader.__wrapped__
    monkeypatch.setattr(Server, "handle_reply", daphnes)
    monkeypatch.setattr(Headers, "addRawHeader", twisteds)
    monkeypatch.setattr(daphne, "__version__", "4.3.0")

    daphne_response_hooks()

    assert Server.handle_reply is daphnes and Headers.addRawHeader is twisteds
    assert "not installed" in caplog.text and "4.3.0" in caplog.text


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
