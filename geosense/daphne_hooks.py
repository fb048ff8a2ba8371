"""Two small hooks on the response path, below Django: in Daphne and in Twisted (issue 15).

The process is bound by one interpreter lock, so every Python call an answer makes on the event
loop is taken from the turns' throughput. Each hook keeps the library's behaviour and takes the
library's own path for anything it does not recognise:

- `_body_chunk_written`: a streamed answer's every event (an SSE chunk) is an ASGI
  `http.response.body` message with `more_body`. Daphne's `Server.handle_reply` checks the
  connection, runs `check_headers_type` (which looks only at `http.response.start`), and calls
  `WebRequest.handle_reply`, which checks the request again, dispatches on the type, writes
  through Twisted's `Request.write` and logs a debug line: five Python calls before the write.
  A middle chunk of a started response now goes to `Request.write` after the same checks
  (Daphne's: the connection known and not disconnected; the request's: not finished, its
  channel kept), its debug line written only where debug logging is on. The start, the last
  message and anything else go to Daphne's own `handle_reply` unchanged.
- `_header_added`: Twisted adds each header of a response (and of a request, as it parses one)
  through `Headers.addRawHeader`, which canonicalises the name (`_NameEncoder.encode`, cached
  per name) and folds line breaks out of the value (`_sanitizeLinearWhitespace`): three Python
  calls a header, ~8 on every answer. A name Twisted has already canonicalised (its cache) with
  a `bytes` value that holds no line break is now added in one: the same name, the same value.
  Anything else (a new name, a `str`, a line break) takes Twisted's own path.

They assume Daphne 4.2 and Twisted 26.10 (`DAPHNE_ASSUMED`, `TWISTED_ASSUMED`):
tests/test_daphne_hooks.py fails if the functions they stand in for change.
`daphne_response_hooks()` installs both, once (geosense/asgi.py).
"""

import logging

DAPHNE_ASSUMED = "4.2"
TWISTED_ASSUMED = "26.10"

_BODY = "http.response.body"


def _body_chunk_written(handle_reply):
    """`daphne.server.Server.handle_reply`, a middle body chunk of a started answer written
    straight through Twisted's `Request.write`."""
    from daphne.http_protocol import logger
    from twisted.web.http import Request

    async def handle_reply_chunk(self, protocol, message) -> None:
        if message.get("more_body") and message.get("type") == _BODY and protocol._response_started:
            connection = self.connections.get(protocol)
            if (
                connection is None
                or connection.get("disconnected")
                or protocol.finished
                or protocol.channel is None
            ):
                return  # as Daphne: a closed connection's messages are dropped
            Request.write(protocol, message.get("body", b""))
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("HTTP response chunk for %s", protocol.client_addr)
            return
        await handle_reply(self, protocol, message)

    handle_reply_chunk.body_chunk_written = True
    handle_reply_chunk.__wrapped__ = handle_reply
    return handle_reply_chunk


def _header_added(add_raw_header, canonical_names: dict):
    """`twisted.web.http_headers.Headers.addRawHeader`, in one call for a name in Twisted's
    cache of canonical names (`canonical_names`) and a `bytes` value without a line break."""

    def add_raw_header_known(self, name, value) -> None:
        canonical = canonical_names.get(name)
        if canonical is None or type(value) is not bytes or b"\n" in value or b"\r" in value:
            add_raw_header(self, name, value)
            return
        self._rawHeaders.setdefault(canonical, []).append(value)

    add_raw_header_known.header_added = True
    add_raw_header_known.__wrapped__ = add_raw_header
    return add_raw_header_known


def daphne_response_hooks() -> None:
    """Install both hooks (once: a second call changes nothing)."""
    from daphne.server import Server
    from twisted.web import http_headers

    if not getattr(Server.handle_reply, "body_chunk_written", False):
        Server.handle_reply = _body_chunk_written(Server.handle_reply)
    if not getattr(http_headers.Headers.addRawHeader, "header_added", False):
        http_headers.Headers.addRawHeader = _header_added(
            http_headers.Headers.addRawHeader,
            http_headers._nameEncoder._canonicalHeaderCache,
        )
