"""Hooks in Daphne, Twisted and autobahn, the libraries below Django that serve every request
and socket of the process (issue 15: one process holding hundreds of users, bound by one
interpreter lock, so every Python call the event loop makes for an answer, a chunk or a frame is
taken from the turns' throughput). Each hook keeps the library's behaviour and takes the
library's own path for anything it does not recognise.

Connections:
- autobahn pretty-prints its 29 configuration attributes for a
  debug log line as each connection is made, whether or not debug logging is on (~0.3 ms of
  the event loop per socket), and names the method and colours the values of another for
  every frame it sends (`hltype`, `hlval`: `inspect` and `click.style`, ~10 µs a frame); the
  text is now made only if the line is written, and what stands for it until then is built
  in C (`_WhenWritten`, no Python frame). And Twisted
  queues every write to a TCP connection for the reactor's next round: it registers the
  socket for writability (an `epoll_ctl`), waits a loop round, sends, and unregisters it (a
  second `epoll_ctl`), for every frame and every SSE chunk. A write to a connection with
  nothing queued is now sent at once, as asyncio's own transports do; whatever the kernel
  does not take at once (or an error) is queued as before, so the order and Twisted's
  handling of full buffers, producers and lost connections stay its own. That holds for
  `writeSequence` too, which is how Twisted writes an HTTP answer's headers and each chunk
  of a chunked body (an SSE stream's every event): its pieces go out in one `send`.
- Twisted closes a connection (an HTTP answer's end: every turn's stream, as each comes on
  a connection of its own) in the reactor's next round, once what is queued is written: the
  socket registered for writability (a new watcher: an `ioctl`, two `epoll_ctl`), a loop
  round, an empty `send`, then unregistered (an `epoll_ctl`), ~15 Python calls. With nothing
  queued (every write was sent at once, above) the HTTP channel's connection is now closed at
  once, as that round would close it (`_closed_at_once`: what Twisted itself does for a
  connection that can no longer write); anything queued, a producer, TLS or a half-close takes
  Twisted's own path.
- Twisted parses the body of every POST whose `Content-Type` is a form into `request.args`
  (the type itself through `email`'s header parser, ~0.2 ms; a multipart body whole, on the
  event loop, before any limit of Django's applies). Daphne never reads `args`: it hands the
  raw body to Django, which parses what a view asks for within its own limits. Daphne's
  requests now skip that parse.
- Daphne's every response message (an SSE stream's every chunk) looked up `http.Request` in
  `twisted.web.http` through Twisted's deprecation proxy of that module (six Python calls, for
  a warning about `HTTPClient`, which Daphne never uses), and hashed its request twice through
  `WebRequest.__hash__`, a Python method for `hash(id(self))`. Daphne's module now holds the
  module itself, and its requests hash by identity in C (`object.__hash__`: equal requests are
  the same object either way): 7 Python calls a body message instead of 15.
- Twisted's HTTP factory formats a combined access-log line for every request as it ends
  (`combinedLogFormatter`: six escapes, two header reads) and emits it into Twisted's log, 27
  Python calls and ~9 µs a request; Daphne, at its default verbosity (≤ 1), sends Twisted's
  log nowhere (`lambda _: None`), and keeps an access log of its own (`--access-log`). At that
  verbosity the factory now keeps no access-log file (Twisted's `log` skips the line, as it
  does for a factory without one); at a higher verbosity the line goes on as before.
- Twisted's asyncio reactor calls every read and write event of a connection (a request's
  bytes, a socket's frame, a close) through `log.callWithLogger`, which pushes a log context
  naming the connection (`logPrefix`) for the call through Twisted's context tracker: ~8
  Python calls an event, for Twisted's log alone. Where Daphne sends that log nowhere
  (verbosity ≤ 1) the events are called without it.
- Daphne's request hands its scope to `create_application` through Twisted's `maybeDeferred`,
  yielded in its `process` (an `inlineCallbacks` generator): the plain result (the
  application's queue) was wrapped in a fired `Deferred` that `inlineCallbacks` then took apart
  again (`succeed`, the `Deferred`, `addBoth`, `_runCallbacks` and its callback: ~6 Python
  calls a request). `inlineCallbacks` sends a value that is not a `Deferred` back into the
  generator as it is, so Daphne's module's `maybeDeferred` now hands a plain result back
  unwrapped (`_result_or_deferred`); an exception, a `Deferred`, a `Failure`, a coroutine or a
  generator are what `maybeDeferred` makes of them.
- Daphne listens through Twisted's endpoint strings (`-b HOST -p PORT` becomes
  `tcp:port=PORT:interface=HOST`), whose listen backlog is 50: a burst of connections beyond
  what the loop has accepted so far (200 users' turns ending together, each posting its next
  message on a new connection; a restart under open pages) overflowed the kernel's accept
  queue, which dropped the extra SYNs, and each such client connected again only after TCP's
  1 s retransmission (3 s for a second drop): at 500 users back to back 36 of 1,166 turns'
  connections took 1.03 s (docs/benchmarks.md, session 28's end). An endpoint
  that names no backlog now gets `LISTEN_BACKLOG` (uvicorn's and gunicorn's default; Linux
  caps it at `net.core.somaxconn`, 4096 since 5.4); one that names its own keeps it.

The response path:
- `handle_reply`, Daphne's `Server.handle_reply`: the `send` of every ASGI application Daphne
  runs, HTTP and WebSocket. Daphne's drops a message for a connection it no longer knows or
  that is disconnected, runs `check_headers_type` (which looks only at
  `http.response.start`) and hands the message to the protocol. Here:
  * a streamed answer's every event (an SSE chunk, an `http.response.body` with `more_body`,
    on a started answer) goes to Twisted's `Request.write` after the checks Daphne's request
    makes first (not finished, its channel kept): without `WebRequest.handle_reply`'s dispatch,
    and with its debug line written only where debug logging is on (five Python calls
    before the write, two now); once the answer's headers are out, a chunk of a chunked
    answer is what Twisted's `Request.write` makes of it (its size line, the data, a line end,
    counted in `sentLength`), handed to the connection's `write` as one piece: not through
    `Request.write`, `toChunk` and the channel's `writeSequence` (three Python calls a chunk);
    and an answer's first part, where Twisted would chunk it, is written with the answer's
    status line and headers as Twisted writes them, in one write (`_answer_head_written`: one
    `send` an answer, not two, and ~10 Python calls fewer);
  * a socket's every text frame (a `websocket.send` on an accepted socket: each turn event a
    page's socket gets, each client tool's invoke) goes to autobahn's `sendMessage` after
    Daphne's checks (not connecting, not both text and bytes): without
    `WebSocketProtocol.handle_reply`'s dispatch and `serverSend`, its debug line written only
    where debug logging is on (four Python calls before the send, one now), on a protocol
    whose `handle_reply` and `serverSend` are still Daphne's; and where autobahn's
    `sendMessage`, `sendFrame` and `sendData` would make one plain frame of it (an open server
    socket without compression, fragments, masks, a payload limit it passes, frame logs,
    timings or a queue), the frame (its header and the payload) is written to the connection
    here, autobahn's traffic counts kept as they keep them (five Python calls a frame fewer:
    the three and their debug line's logger);
  * an answer's start on Daphne's request, after `check_headers_type`, is set by the hook
    (`_answer_started`: its status, its headers as `add_raw_header_known` adds them, Daphne's
    `Server` header as Twisted's `setHeader` sets it): ~17 Python calls an answer fewer;
  * a debug line's check (Daphne's, per chunk and frame, kept by the hooks) asks logging's
    `isEnabledFor` only where the logger has not already found DEBUG off (its cache of levels,
    `_levels_found`): a Python call a chunk and a frame fewer where debug logging is off;
  * any other message skips `check_headers_type` unless it is a start (or has no type, which
    fails it as before), then goes to the protocol's `handle_reply` as before;
  * Daphne's socket protocol hashes by identity in C, as Daphne's HTTP request does
    (above) (`WebSocketProtocol.__hash__`, a Python `hash(id(self))`, ran twice for each
    frame a socket's consumer sends).
- `add_raw_header_known`, Twisted's `Headers.addRawHeader`: each header of every answer (and
  of every request, as Twisted parses it) had its name canonicalised (`_NameEncoder.encode`,
  cached per name) and line breaks folded out of its value (`_sanitizeLinearWhitespace`):
  three Python calls a header, ~8 on every answer. A name Twisted has already canonicalised
  (its cache) with a `bytes` value is now added in one, its line breaks folded as Twisted
  folds them: the same name, the same value. Anything else (a new name, a `str`) takes
  Twisted's own path. `getRawHeaders`, which Twisted calls four times a request as it parses
  it (`Content-Type`, `Expect`, `Cookie`, `Connection`), reads a cached `bytes` name's values
  the same way, in one Python call, not two.
- `header_received_known`, Twisted's `HTTPChannel.headerReceived`: each header line of every
  request was split, its name canonicalised (`encode`), checked for a length
  (`_maybeChooseTransferDecoder`) and added (`addRawHeader`): four Python calls a header, ~5
  headers a request. A name Twisted has already canonicalised that does not set the body's
  length (not `Content-Length`, `Transfer-Encoding`), with a value Twisted takes (no NUL, CR
  or LF), is now added in one, with the same checks and the same header count and limit;
  anything else (a new name, a length, a value or line Twisted answers 400) takes Twisted's
  own path.

`daphne_hooks_install()` installs them, once (geosense/asgi.py). Two are installed whatever the
versions: the listen backlog (through Twisted's documented endpoint strings) and the form
parsing switched off (an attribute Twisted's request reads; a bound on what a request may cost
the loop, not a saving). The others are written for Daphne 4.2.3, Twisted 26.10.0, autobahn
26.10.2 and txaio 26.6.1 (`WRITTEN_FOR`, the versions uv.lock pins): with any other version
installed they stay out (a warning says so), so an upgrade that skipped the suite runs the
libraries' own code, and tests/test_daphne_hooks.py fails if the code they stand in for
changes. The private names they read are read only then.
"""

import functools
import inspect
import logging
import pprint
import struct
from collections.abc import Callable
from types import CoroutineType, GeneratorType
from typing import Any

import autobahn
import daphne
import twisted
import txaio
from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne.http_protocol import WebRequest
from daphne.http_protocol import logger as daphne_logger
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from daphne.ws_protocol import logger as daphne_socket_logger
from twisted.internet import asyncioreactor, defer, error, tcp
from twisted.python import failure, log
from twisted.web import http_headers
from twisted.web.http import NO_BODY_CODES, HTTPChannel, Request
from txaio import tx as txaio_tx

WRITTEN_FOR = {"daphne": "4.2.3", "twisted": "26.10.0", "autobahn": "26.10.2", "txaio": "26.6.1"}

logger = logging.getLogger(__name__)

_BODY = "http.response.body"
_START = "http.response.start"
_SOCKET_SEND = "websocket.send"
# Daphne's socket protocol's own dispatch and send, which `handle_reply` stands in for when a
# socket's protocol still has them (not a subclass, or a test, that replaced either).
_SOCKET_REPLY = WebSocketProtocol.handle_reply
_SOCKET_SERVER_SEND = WebSocketProtocol.serverSend
# Daphne's HTTP request's own dispatch, which `handle_reply` stands in for an answer's start.
_REQUEST_REPLY = WebRequest.handle_reply
# Twisted's cache of canonical header names (the raw name → the name it sends): private, so
# read by `daphne_hooks_install` once the versions are those the hooks were written for (an
# upgrade that renamed it would otherwise stop the process from starting; review 31-b L1).
# Empty until then: every name takes Twisted's own path.
_CANONICAL_NAMES: dict[bytes, bytes] = {}
# autobahn's send of a message, of a frame and of its bytes, which `handle_reply` does itself
# for a text message where they would make one plain frame of it.
_AUTOBAHN_SENDS = (
    AutobahnProtocol.sendMessage,
    AutobahnProtocol.sendFrame,
    AutobahnProtocol.sendData,
)
_SOCKET_OPEN = AutobahnProtocol.STATE_OPEN
# The logger `protocol.log` gives Daphne's socket protocol (autobahn's, read without its
# descriptor's call), and what its `debug` is while autobahn's debug lines are off (txaio's
# private `_no_op`): with them on, a frame takes autobahn's own path, which writes `sendData`'s
# line. Set by `daphne_hooks_install`, as `_CANONICAL_NAMES`.
_AUTOBAHN_LOG: Any = None
_TXAIO_NO_OP: Any = None
# What Daphne's two loggers have found of their levels (logging's private `Logger._cache`, level
# → enabled, cleared in place whenever a level or `logging.disable` changes): a level found off
# is off for `isEnabledFor` too, so a debug line's check asks it only where its answer may be
# yes (it is a Python call, for every chunk and frame). Set by `daphne_hooks_install`, as
# `_CANONICAL_NAMES`; empty until then: every check asks `isEnabledFor`.
_DEBUG = logging.DEBUG
_DAPHNE_LEVELS: dict[int, bool] = {}
_SOCKET_LEVELS: dict[int, bool] = {}
_FRAME_HEAD_16 = struct.Struct("!BBH")
_FRAME_HEAD_64 = struct.Struct("!BBQ")
# Twisted's HTTP channel's `writeSequence` (its transport's), where a chunk is written as one piece.
_CHANNEL_SEQUENCE = HTTPChannel.writeSequence
# And its `writeHeaders`, where an answer's head and first chunk are written as one piece.
_CHANNEL_HEADERS = HTTPChannel.writeHeaders


async def handle_reply(self, protocol, message) -> None:
    """Daphne's `Server.handle_reply`, a middle chunk of a started answer written straight
    through Twisted's `Request.write`, a text frame of an accepted socket straight through
    autobahn's `sendMessage`."""
    connection = self.connections.get(protocol)
    if connection is None or connection.get("disconnected"):
        return
    kind = message.get("type")
    if kind == _BODY and message.get("more_body") and getattr(protocol, "_response_started", False):
        if protocol.finished or protocol.channel is None:
            return  # as Daphne's request: a finished answer's messages are dropped
        body = message.get("body", b"")
        if (
            protocol.chunked
            and protocol.startedWriting
            and body
            and type(body) is bytes
            and getattr(type(protocol.channel), "writeSequence", None) is _CHANNEL_SEQUENCE
        ):
            # Twisted's `Request.write` of a chunk once the headers are out, its chunk made
            # and handed to the connection as one piece, not through `toChunk` and the
            # channel's `writeSequence` (`ITransport.writeSequence` is a write of its pieces
            # joined).
            if not protocol._disconnected:
                protocol.sentLength += len(body)
                protocol.channel.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        elif (
            not protocol.startedWriting
            and body
            and type(body) is bytes
            and not protocol._disconnected
            and protocol.clientproto == b"HTTP/1.1"
            and protocol.method != b"HEAD"
            and protocol.code not in NO_BODY_CODES
            and protocol.lastModified is None
            and protocol.etag is None
            and not protocol.cookies
            and type(protocol.responseHeaders) is http_headers.Headers
            and b"Content-Length" not in protocol.responseHeaders._rawHeaders
            and getattr(type(protocol.channel), "writeHeaders", None) is _CHANNEL_HEADERS
            and getattr(type(protocol.channel), "writeSequence", None) is _CHANNEL_SEQUENCE
        ):
            _answer_head_written(protocol, body)
        else:
            Request.write(protocol, body)
        if _DAPHNE_LEVELS.get(_DEBUG, True) and daphne_logger.isEnabledFor(_DEBUG):
            daphne_logger.debug("HTTP response chunk for %s", protocol.client_addr)
        return
    if (
        kind == _SOCKET_SEND
        and type(protocol).handle_reply is _SOCKET_REPLY
        and type(protocol).serverSend is _SOCKET_SERVER_SEND
        and protocol.state != protocol.STATE_CONNECTING
    ):
        text = message.get("text")
        if text and not message.get("bytes"):
            # Daphne's `WebSocketProtocol.handle_reply` and `serverSend` for a text frame on an
            # accepted socket (what every frame of a GeoSense socket is).
            if _SOCKET_LEVELS.get(_DEBUG, True) and daphne_socket_logger.isEnabledFor(_DEBUG):
                daphne_socket_logger.debug(
                    "Sent WebSocket packet to client for %s", protocol.client_addr
                )
            payload = text.encode("utf8")
            size = len(payload)
            if (
                protocol.state == _SOCKET_OPEN
                and _AUTOBAHN_SENDS
                == (
                    type(protocol).sendMessage,
                    type(protocol).sendFrame,
                    type(protocol).sendData,
                )
                and "sendMessage" not in protocol.__dict__
                and protocol._perMessageCompress is None
                and not protocol.trackedTimings
                and not protocol.send_queue
                and not protocol.logFrames
                and not protocol.logOctets
                and protocol.factory.isServer
                and _AUTOBAHN_LOG.debug is _TXAIO_NO_OP
                and "log" not in protocol.__dict__
                and not protocol.maskServerFrames
                and not 0 < protocol.autoFragmentSize < size
                and not 0 < protocol.maxMessagePayloadSize < size
            ):
                # autobahn's `sendMessage`, `sendFrame` and `sendData` for what they make of
                # a text message on an open server socket with none of their options on (no
                # compression, fragments, masks, frame logs, timings, queue or debug lines): one
                # frame, its header (FIN and the text opcode, the length) and the payload,
                # written to the connection, and the counts they keep.
                if size <= 125:
                    frame = bytes((0x81, size)) + payload
                elif size <= 0xFFFF:
                    frame = _FRAME_HEAD_16.pack(0x81, 126, size) + payload
                else:
                    frame = _FRAME_HEAD_64.pack(0x81, 127, size) + payload
                stats = protocol.trafficStats
                stats.outgoingWebSocketMessages += 1
                stats.outgoingOctetsAppLevel += size
                stats.outgoingOctetsWebSocketLevel += size
                stats.outgoingWebSocketFrames += 1
                protocol.transport.write(frame)
                if protocol.state == _SOCKET_OPEN:
                    stats.outgoingOctetsWireLevel += len(frame)
                return
            protocol.sendMessage(payload, False)
            return
    if kind is None or kind == _START:
        try:
            self.check_headers_type(message)
        except ValueError:
            # Ensure to send SOME reply.
            protocol.basic_error(500, b"Server Error", "Server Error")
            raise
        if (
            kind == _START
            and type(protocol).handle_reply is _REQUEST_REPLY
            and type(protocol.responseHeaders) is http_headers.Headers
            and not protocol.finished
            and protocol.channel is not None
            and not protocol._response_started
            and "status" in message
        ):
            _answer_started(protocol, message)
            return
    protocol.handle_reply(message)


def _answer_head_written(request, body: bytes) -> None:
    """Twisted's `Request.write` of a chunked answer's first part (HTTP/1.1, no Content-Length,
    not a HEAD, a status with a body, no Last-Modified, ETag or cookies of Twisted's): the
    answer chunked, its status line and headers as `HTTPChannel.writeHeaders` writes them,
    and the part as a chunk, handed to the connection in one write (Twisted made two, each a
    `send`: `getRawHeaders`, `setRawHeaders` with the name's encoding and the value's folding,
    `writeHeaders`, `getAllRawHeaders`, `toChunk` and the channel's `writeSequence` twice,
    ~10 Python calls an answer)."""
    request.startedWriting = 1
    raw = request.responseHeaders._rawHeaders
    raw[b"Transfer-Encoding"] = [b"chunked"]
    request.chunked = 1
    head = [request.clientproto, b" ", b"%d" % (request.code,), b" ", request.code_message, b"\r\n"]
    for name, values in raw.items():
        for value in values:
            head.extend((name, b": ", value, b"\r\n"))
    head.append(b"\r\n%x\r\n%b\r\n" % (len(body), body))
    request.sentLength += len(body)
    request.channel.transport.write(b"".join(head))


def _answer_started(request, message: dict) -> None:
    """Daphne's `WebRequest.handle_reply` for an answer's start (its status, its headers, and
    Daphne's `Server` header unless the answer has one), on a request whose answer has not
    started: each header added to Twisted's `Headers` as `add_raw_header_known` adds it (a name
    in Twisted's cache of canonical names with a `bytes` value; Twisted's `addRawHeader`
    otherwise), here, and `Server` set as Twisted's `setHeader` sets it (`hasHeader`, `setHeader`,
    `setRawHeaders`, the name's encoding twice and the value's folding: a Python call each, and
    one a header: ~17 Python calls an answer)."""
    request._response_started = True
    request.setResponseCode(message["status"])
    headers = request.responseHeaders
    raw = headers._rawHeaders
    for name, value in message.get("headers", {}):
        # `add_raw_header_known`'s two lines (`_header_added`), a Python call a header fewer:
        # Twisted's header append is written out here, there and in `header_received_known`;
        # a fix to one is a fix to all three.
        canonical = _CANONICAL_NAMES.get(name)
        if canonical is None or type(value) is not bytes:
            headers.addRawHeader(name, value)
        else:
            raw.setdefault(canonical, []).append(b" ".join(value.splitlines()))
    server_name = request.server.server_name
    if server_name and b"Server" not in raw:
        raw[b"Server"] = [b" ".join(server_name.encode().splitlines())]
    if _DAPHNE_LEVELS.get(_DEBUG, True) and daphne_logger.isEnabledFor(_DEBUG):
        daphne_logger.debug(
            "HTTP %s response started for %s", message["status"], request.client_addr
        )


def _levels_found(logger: logging.Logger) -> dict[int, bool]:
    """`logger`'s cache of the levels it has found on or off (logging's `Logger._cache`, which
    `isEnabledFor` answers from unless the logger is disabled), or an empty dict where it keeps
    none (a Python whose logging changed: every check then asks `isEnabledFor`)."""
    found = getattr(logger, "_cache", None)
    return found if type(found) is dict else {}


def _header_added(add_raw_header, canonical_names: dict):
    """`twisted.web.http_headers.Headers.addRawHeader`, in one Python call for a name in
    Twisted's cache of canonical names (`canonical_names`) and a `bytes` value."""

    def add_raw_header_known(self, name, value) -> None:
        canonical = canonical_names.get(name)
        if canonical is None or type(value) is not bytes:
            add_raw_header(self, name, value)
            return
        # `_sanitizeLinearWhitespace`, in C calls. (A test for a line break first cost more
        # than the whole: `bytes in bytes` tries the needle as an int, raising and clearing a
        # TypeError each time.)
        self._rawHeaders.setdefault(canonical, []).append(b" ".join(value.splitlines()))

    add_raw_header_known.__wrapped__ = add_raw_header
    return add_raw_header_known


def _headers_read(get_raw_headers, canonical_names: dict):
    """`twisted.web.http_headers.Headers.getRawHeaders`, in one Python call for a `bytes` name in
    Twisted's cache of canonical names (`canonical_names`): its values, or `default` when it has
    none, as Twisted's returns them."""

    def get_raw_headers_known(self, name, default=None):
        canonical = canonical_names.get(name)
        if canonical is None or type(name) is not bytes:
            return get_raw_headers(self, name, default)
        return self._rawHeaders.get(canonical) or default

    get_raw_headers_known.__wrapped__ = get_raw_headers
    return get_raw_headers_known


# The headers that choose a request body's decoder (`HTTPChannel._maybeChooseTransferDecoder`).
_LENGTH_HEADERS = frozenset({b"Content-Length", b"Transfer-Encoding"})


def _header_line_read(header_received, canonical_names: dict):
    """`twisted.web.http.HTTPChannel.headerReceived`, in one Python call for a header whose name
    is in Twisted's cache of canonical names (`canonical_names`) and does not set the body's
    length, with a value Twisted takes."""

    def header_received_known(self, line: bytes) -> bool:
        name, colon, value = line.partition(b":")
        canonical = canonical_names.get(name)
        if canonical is None or not colon or canonical in _LENGTH_HEADERS:
            return header_received(self, line)
        value = value.strip(b" \t")
        headers = self.requests[-1].requestHeaders
        if (
            len(value.translate(None, b"\x00\r\n")) != len(value)
            or type(headers) is not http_headers.Headers
        ):
            return header_received(self, line)
        # `addRawHeader` (a value without line breaks is what its folding makes of it).
        headers._rawHeaders.setdefault(canonical, []).append(value)
        self._receivedHeaderCount += 1
        if self._receivedHeaderCount > self.maxHeaders:
            self._respondToBadRequestAndDisconnect()
            return False
        return True

    header_received_known.__wrapped__ = header_received
    return header_received_known


class _WhenWritten(functools.partial):
    """A call of a text-making function (autobahn's `hltype`, `hlval`, `pformat`) made only if
    the log line that holds it is formatted. Built by `functools.partial` in C: three of them
    for every frame sent, and no Python frame for any."""

    __slots__ = ()

    def __str__(self) -> str:
        return self()

    def __format__(self, spec: str) -> str:
        return format(self(), spec)


def _when_written(text: Callable[..., str]) -> Callable[..., _WhenWritten]:
    """`text`, deferred until a log line that holds its result is formatted."""
    return functools.partial(_WhenWritten, text)


def _timings_text(timings) -> str:
    """autobahn's `Timings.__str__`, which formats through its module's `pformat`: made at
    once, as before the deferred `pformat`."""
    return pprint.pformat(timings._timings)


def _sent_at_once(write):
    """`tcp.Connection.write`, sending at once what nothing queued is ahead of (plain TCP,
    open, nothing queued); what the kernel does not take, or all of it on an error (full:
    EAGAIN), goes to Twisted's `write` to queue and meet as before. (One function: the check,
    the send and the write were a Python call each, for every frame and SSE chunk.)"""

    def write_now(self, data: bytes) -> None:
        if type(data) is bytes and not (
            self.TLS
            or not self.connected
            or self.disconnecting
            or self._writeDisconnected
            or self._tempDataBuffer
            or self.offset != len(self.dataBuffer)
        ):
            try:
                sent = self.socket.send(data)
            except OSError:
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        write(self, data)

    write_now.sent_at_once = True
    return write_now


_ONLY_BYTES = frozenset({bytes})


def _sequence_sent_at_once(write_sequence):
    """`tcp.Connection.writeSequence`, its pieces joined and written as one (`write_now`: sent
    at once when nothing queued is ahead of them, queued joined otherwise: the same bytes in
    the same order)."""

    def write_sequence_now(self, iovec) -> None:
        if type(iovec) in (list, tuple) and _ONLY_BYTES.issuperset(map(type, iovec)):
            self.write(b"".join(iovec))
            return
        write_sequence(self, iovec)

    write_sequence_now.sent_at_once = True
    return write_sequence_now


# The reason a connection closed in order is lost with, shared as the reactor shares its own
# (`PosixReactorBase._disconnectSelectable`'s).
_CONNECTION_DONE = failure.Failure(error.ConnectionDone())


def _closed_at_once(lose_connection):
    """Twisted's `HTTPChannel.loseConnection` (its producer unregistered, then its transport's
    `loseConnection`), a TCP connection with nothing queued closed at once: what
    `FileDescriptor.loseConnection` asks the reactor's next write round for, `doWrite` with
    nothing to write and the reactor's `_disconnectSelectable` (reading and writing stopped, the
    connection lost as done), without the round, its watcher and its empty `send`. Anything
    else (TLS, something queued, a producer, a half-close, a connection closing or closed, a
    transport not Twisted's TCP server's) takes Twisted's path."""

    def lose_connection_now(self) -> None:
        transport = self.transport
        if (
            type(transport) is not tcp.Server
            or self._networkProducer is not transport
            or transport.TLS
            or not transport.connected
            or transport.disconnecting
            or transport._writeDisconnecting
            or transport._writeDisconnected
            or transport._tempDataBuffer
            or transport.offset != len(transport.dataBuffer)
            or transport.producer is not self
        ):
            lose_connection(self)
            return
        # `unregisterProducer` (its connection not yet disconnecting: no write round asked).
        transport.producer = None
        # `loseConnection`, then the write round's `doWrite` and `_disconnectSelectable`.
        transport.stopReading()
        transport.disconnecting = 1
        transport.stopWriting()
        transport.connectionLost(_CONNECTION_DONE)

    lose_connection_now.__wrapped__ = lose_connection
    return lose_connection_now


def _result_or_deferred(maybe_deferred):
    """Twisted's `maybeDeferred` where Daphne's request `process` yields it to `inlineCallbacks`:
    a plain result handed back as it is (`inlineCallbacks` sends it into the generator at once,
    as it sends a fired `Deferred`'s result), anything else as `maybeDeferred` makes it."""

    def result_or_deferred(f, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except BaseException:
            return defer.fail(failure.Failure(captureVars=defer.Deferred.debug))
        if isinstance(result, (defer.Deferred, failure.Failure, CoroutineType, GeneratorType)):
            return maybe_deferred(lambda: result)
        return result

    result_or_deferred.__wrapped__ = maybe_deferred
    return result_or_deferred


def _without_form_parsing(init):
    """`daphne.http_protocol.WebRequest.__init__`, its request told not to parse form bodies
    (Twisted's `parsePOSTFormSubmission`)."""

    def init_without_form_parsing(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    init_without_form_parsing.without_form_parsing = True
    return init_without_form_parsing


def _called_without_log_context(logger, func, *args, **kw):
    """Twisted's `log.callWithLogger`, which the asyncio reactor wraps around every read and
    write event of a connection (`add_reader`, `add_writer`), without the log context it sets
    for the call (`{"system": logger.logPrefix()}`, a copy of the current one, pushed and
    popped through Twisted's context tracker: ~8 Python calls an event), which only Twisted's
    log reads. A failure is swallowed and logged to Twisted's log, as there."""
    try:
        return func(*args, **kw)
    except KeyboardInterrupt:
        raise
    except BaseException:
        log.err()


def _access_line_only_if_kept(start_factory):
    """`daphne.http_protocol.HTTPFactory.startFactory`, without Twisted's access-log file and
    the log context of each read and write event (`_called_without_log_context`) when Daphne
    sends Twisted's log nowhere (its `Server.run`, verbosity ≤ 1). (The factory starts as its
    port starts listening, before the port's first event.)"""

    def start_factory_quiet(self) -> None:
        start_factory(self)
        quiet = self.server.verbosity <= 1
        if quiet:
            self._logFile = None
        asyncioreactor.callWithLogger = _called_without_log_context if quiet else log.callWithLogger

    start_factory_quiet.access_line_only_if_kept = True
    return start_factory_quiet


# The listen backlog of an endpoint Daphne opens without naming one (Twisted's default: 50).
LISTEN_BACKLOG = 2048
# Twisted's endpoint kinds that take a `backlog` argument.
_BACKLOG_KINDS = frozenset({"tcp", "tcp6", "unix", "ssl"})


def _with_backlog(server_from_string):
    """Twisted's `serverFromString` as Daphne calls it, an endpoint that names no backlog
    given `LISTEN_BACKLOG`."""

    def server_from_string_with_backlog(reactor, description: str):
        kind = description.split(":", 1)[0]
        if kind in _BACKLOG_KINDS and "backlog=" not in description:
            description = f"{description}:backlog={LISTEN_BACKLOG}"
        return server_from_string(reactor, description)

    server_from_string_with_backlog.with_backlog = True
    server_from_string_with_backlog.__wrapped__ = server_from_string
    return server_from_string_with_backlog


def daphne_hooks_install() -> None:
    """Install the hooks, once (a second call changes nothing): the listen backlog and the form
    parsing's switch whatever the versions, the others only on the versions they were written
    for (a warning otherwise)."""
    from autobahn import util
    from autobahn.twisted import websocket
    from autobahn.websocket import protocol
    from daphne import http_protocol, server
    from daphne.http_protocol import HTTPFactory, WebRequest
    from twisted.python.deprecate import _ModuleProxy

    if not getattr(server.serverFromString, "with_backlog", False):
        server.serverFromString = _with_backlog(server.serverFromString)
    # Twisted's form parsing stays off whatever the versions (a security bound, not a saving: a
    # multipart body parsed whole on the loop before any limit of Django's).
    if not getattr(WebRequest.__init__, "without_form_parsing", False):
        WebRequest.__init__ = _without_form_parsing(WebRequest.__init__)
    installed = {
        "daphne": daphne.__version__,
        "twisted": twisted.__version__,
        "autobahn": autobahn.__version__,
        "txaio": txaio.__version__,
    }
    if installed != WRITTEN_FOR:
        logger.warning(
            "Daphne/Twisted/autobahn hooks not installed: written for %s, found %s",
            WRITTEN_FOR,
            installed,
        )
        return
    global _CANONICAL_NAMES, _AUTOBAHN_LOG, _TXAIO_NO_OP, _DAPHNE_LEVELS, _SOCKET_LEVELS
    _CANONICAL_NAMES = http_headers._nameEncoder._canonicalHeaderCache
    _DAPHNE_LEVELS = _levels_found(daphne_logger)
    _SOCKET_LEVELS = _levels_found(daphne_socket_logger)
    _AUTOBAHN_LOG = inspect.getattr_static(WebSocketProtocol, "log")
    _TXAIO_NO_OP = txaio_tx._no_op
    # Connections.
    protocol.pformat = _when_written(pprint.pformat)
    # The module's one `pformat` that is not a log line's: its timings' text stays a text.
    protocol.Timings.__str__ = _timings_text
    for module in (protocol, websocket):  # frames sent, frames received
        module.hltype = _when_written(util.hltype)
        module.hlval = _when_written(util.hlval)
    if not getattr(tcp.Connection.write, "sent_at_once", False):
        tcp.Connection.write = _sent_at_once(tcp.Connection.write)
    if not getattr(tcp.Connection.writeSequence, "sent_at_once", False):
        tcp.Connection.writeSequence = _sequence_sent_at_once(tcp.Connection.writeSequence)
    if type(http_protocol.http) is _ModuleProxy:
        http_protocol.http = object.__getattribute__(http_protocol.http, "_module")
    WebRequest.__hash__ = object.__hash__
    if not hasattr(http_protocol.maybeDeferred, "__wrapped__"):
        http_protocol.maybeDeferred = _result_or_deferred(http_protocol.maybeDeferred)
    if not hasattr(HTTPChannel.loseConnection, "__wrapped__"):
        HTTPChannel.loseConnection = _closed_at_once(HTTPChannel.loseConnection)
    if not getattr(HTTPFactory.startFactory, "access_line_only_if_kept", False):
        HTTPFactory.startFactory = _access_line_only_if_kept(HTTPFactory.startFactory)
    # The response path.
    if Server.handle_reply is not handle_reply:
        handle_reply.__wrapped__ = Server.handle_reply
        Server.handle_reply = handle_reply
    WebSocketProtocol.__hash__ = object.__hash__
    if not hasattr(http_headers.Headers.addRawHeader, "__wrapped__"):
        http_headers.Headers.addRawHeader = _header_added(
            http_headers.Headers.addRawHeader,
            http_headers._nameEncoder._canonicalHeaderCache,
        )
    if not hasattr(HTTPChannel.headerReceived, "__wrapped__"):
        HTTPChannel.headerReceived = _header_line_read(
            HTTPChannel.headerReceived, http_headers._nameEncoder._canonicalHeaderCache
        )
    if not hasattr(http_headers.Headers.getRawHeaders, "__wrapped__"):
        http_headers.Headers.getRawHeaders = _headers_read(
            http_headers.Headers.getRawHeaders,
            http_headers._nameEncoder._canonicalHeaderCache,
        )
