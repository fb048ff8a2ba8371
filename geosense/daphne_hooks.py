"""Small hooks on the response path below Django, in Daphne and in Twisted (issue 15).

The process is bound by one interpreter lock, so every Python call an answer makes on the event
loop is taken from the turns' throughput. Each hook keeps the library's behaviour:

- `handle_reply`, Daphne's `Server.handle_reply`: the `send` of every ASGI application Daphne
  runs, HTTP and WebSocket. Daphne's drops a message for a connection it no longer knows or
  that is disconnected, runs `check_headers_type` (which looks only at
  `http.response.start`) and hands the message to the protocol. Here:
  * a streamed answer's every event (an SSE chunk, an `http.response.body` with `more_body`,
    on a started answer) goes to Twisted's `Request.write` after the checks Daphne's request
    makes first (not finished, its channel kept): without `WebRequest.handle_reply`'s dispatch,
    and with its debug line written only where debug logging is on (five Python calls
    before the write, two now);
  * any other message skips `check_headers_type` unless it is a start (or has no type, which
    fails it as before), then goes to the protocol's `handle_reply` as before;
  * Daphne's socket protocol hashes by identity in C, as geosense/layers.py has its HTTP
    request do (`WebSocketProtocol.__hash__`, a Python `hash(id(self))`, ran twice for each
    frame a socket's consumer sends).
- `add_raw_header_known`, Twisted's `Headers.addRawHeader`: each header of every answer (and
  of every request, as Twisted parses it) had its name canonicalised (`_NameEncoder.encode`,
  cached per name) and line breaks folded out of its value (`_sanitizeLinearWhitespace`):
  three Python calls a header, ~8 on every answer. A name Twisted has already canonicalised
  (its cache) with a `bytes` value is now added in one, its line breaks folded as Twisted
  folds them: the same name, the same value. Anything else (a new name, a `str`) takes
  Twisted's own path.

Written for Daphne 4.2.3 and Twisted 26.10.0 (`WRITTEN_FOR`): with any other version installed
they stay out (a warning says so), and tests/test_daphne_hooks.py fails if the code they stand
in for changes. `daphne_response_hooks()` installs them, once (geosense/asgi.py).
"""

import logging

import daphne
import twisted
from daphne.http_protocol import logger as daphne_logger
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.web import http_headers
from twisted.web.http import Request

WRITTEN_FOR = {"daphne": "4.2.3", "twisted": "26.10.0"}

logger = logging.getLogger(__name__)

_BODY = "http.response.body"
_START = "http.response.start"


async def handle_reply(self, protocol, message) -> None:
    """Daphne's `Server.handle_reply`, a middle chunk of a started answer written straight
    through Twisted's `Request.write`."""
    connection = self.connections.get(protocol)
    if connection is None or connection.get("disconnected"):
        return
    kind = message.get("type")
    if kind == _BODY and message.get("more_body") and getattr(protocol, "_response_started", False):
        if protocol.finished or protocol.channel is None:
            return  # as Daphne's request: a finished answer's messages are dropped
        Request.write(protocol, message.get("body", b""))
        if daphne_logger.isEnabledFor(logging.DEBUG):
            daphne_logger.debug("HTTP response chunk for %s", protocol.client_addr)
        return
    if kind is None or kind == _START:
        try:
            self.check_headers_type(message)
        except ValueError:
            # Ensure to send SOME reply.
            protocol.basic_error(500, b"Server Error", "Server Error")
            raise
    protocol.handle_reply(message)


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


def daphne_response_hooks() -> None:
    """Install the hooks (once: a second call changes nothing), if Daphne and Twisted are the
    versions they were written for."""
    installed = {"daphne": daphne.__version__, "twisted": twisted.__version__}
    if installed != WRITTEN_FOR:
        logger.warning(
            "Daphne/Twisted response hooks not installed: written for %s, found %s",
            WRITTEN_FOR,
            installed,
        )
        return
    if Server.handle_reply is not handle_reply:
        handle_reply.__wrapped__ = Server.handle_reply
        Server.handle_reply = handle_reply
    WebSocketProtocol.__hash__ = object.__hash__
    if not hasattr(http_headers.Headers.addRawHeader, "__wrapped__"):
        http_headers.Headers.addRawHeader = _header_added(
            http_headers.Headers.addRawHeader,
            http_headers._nameEncoder._canonicalHeaderCache,
        )
