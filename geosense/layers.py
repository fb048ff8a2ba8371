"""The process's own plumbing around Channels and Daphne, for one process holding hundreds of
sockets (issue 15: 500 users connecting at once).

- `InMemoryChannelLayer`: Channels' in-memory layer sweeps every channel and every group
  membership of the process for expired entries on each `receive` and `group_send`. Every
  socket's consumer calls `receive` once as it starts and again after each layer message, so
  500 sockets connecting swept ~1,500 memberships 500 times, and a message to every socket (an
  annotations change) swept once per socket: work growing with the sockets, per socket. Here
  the sweep runs at most once per `SWEEP_SECONDS` (messages expire after a minute, groups
  after a day: a second late changes nothing).
- `daphne_connection_tweaks`: autobahn pretty-prints its 29 configuration attributes for a
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
- Daphne listens through Twisted's endpoint strings (`-b HOST -p PORT` becomes
  `tcp:port=PORT:interface=HOST`), whose listen backlog is 50: a burst of connections beyond
  what the loop has accepted so far (200 users' turns ending together, each posting its next
  message on a new connection; a restart under open pages) overflowed the kernel's accept
  queue, which dropped the extra SYNs, and each such client connected again only after TCP's
  1 s retransmission (3 s for a second drop). At 200 users back to back a run counted ~450
  overflows and 200 SYN retransmissions, a second added to one turn in five. An endpoint
  that names no backlog now gets `LISTEN_BACKLOG` (uvicorn's and gunicorn's default; Linux
  caps it at `net.core.somaxconn`, 4096 since 5.4); one that names its own keeps it.
"""

import functools
import pprint
import time
from collections.abc import Callable

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    """Channels' in-memory layer, its expiry sweep at most once per `SWEEP_SECONDS`."""

    SWEEP_SECONDS = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._swept = float("-inf")

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept < self.SWEEP_SECONDS:
            return
        self._swept = now
        super()._clean_expired()


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


def _idle(connection) -> bool:
    """Whether a write to this connection could go out now: plain TCP, open, nothing queued."""
    return (
        not connection.TLS
        and connection.connected
        and not connection.disconnecting
        and not connection._writeDisconnected
        and not connection._tempDataBuffer
        and connection.offset == len(connection.dataBuffer)
    )


def _send_now(connection, data: bytes) -> bytes:
    """Send what the kernel takes at once; the rest, for Twisted to queue."""
    try:
        sent = connection.socket.send(data)
    except OSError:  # full (EAGAIN) or failing: queued, Twisted meets it as before
        sent = 0
    return data[sent:]


def _sent_at_once(write):
    """`tcp.Connection.write`, sending at once what nothing queued is ahead of."""

    def write_now(self, data: bytes) -> None:
        if type(data) is bytes and _idle(self):
            data = _send_now(self, data)
            if not data:
                return
        write(self, data)

    write_now.sent_at_once = True
    return write_now


_ONLY_BYTES = frozenset({bytes})


def _sequence_sent_at_once(write_sequence):
    """`tcp.Connection.writeSequence`, its pieces joined and sent at once when nothing
    queued is ahead of them."""

    def write_sequence_now(self, iovec) -> None:
        if (
            type(iovec) in (list, tuple)
            and _ONLY_BYTES.issuperset(map(type, iovec))
            and _idle(self)
        ):
            rest = _send_now(self, b"".join(iovec))
            if rest:
                write_sequence(self, [rest])
            return
        write_sequence(self, iovec)

    write_sequence_now.sent_at_once = True
    return write_sequence_now


def _without_form_parsing(init):
    """`daphne.http_protocol.WebRequest.__init__`, its request told not to parse form bodies
    (Twisted's `parsePOSTFormSubmission`)."""

    def init_without_form_parsing(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    init_without_form_parsing.without_form_parsing = True
    return init_without_form_parsing


def _access_line_only_if_kept(start_factory):
    """`daphne.http_protocol.HTTPFactory.startFactory`, without Twisted's access-log file when
    Daphne sends Twisted's log nowhere (its `Server.run`, verbosity ≤ 1)."""

    def start_factory_quiet(self) -> None:
        start_factory(self)
        if self.server.verbosity <= 1:
            self._logFile = None

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
    return server_from_string_with_backlog


def daphne_connection_tweaks() -> None:
    """Install the deferred formatting in autobahn (which Daphne's sockets run on), the
    immediate writes in Twisted's TCP connections (which Daphne serves HTTP and sockets on),
    Daphne's requests without Twisted's form parsing, its response messages without
    Twisted's deprecation proxy and a Python hash, and no Twisted access line that goes
    nowhere, and a listen backlog of `LISTEN_BACKLOG` where the endpoint names none."""
    from autobahn import util
    from autobahn.twisted import websocket
    from autobahn.websocket import protocol
    from daphne import http_protocol, server
    from daphne.http_protocol import HTTPFactory, WebRequest
    from twisted.internet import tcp
    from twisted.python.deprecate import _ModuleProxy

    protocol.pformat = _when_written(pprint.pformat)
    for module in (protocol, websocket):  # frames sent, frames received
        module.hltype = _when_written(util.hltype)
        module.hlval = _when_written(util.hlval)
    if not getattr(tcp.Connection.write, "sent_at_once", False):
        tcp.Connection.write = _sent_at_once(tcp.Connection.write)
    if not getattr(tcp.Connection.writeSequence, "sent_at_once", False):
        tcp.Connection.writeSequence = _sequence_sent_at_once(tcp.Connection.writeSequence)
    if not getattr(WebRequest.__init__, "without_form_parsing", False):
        WebRequest.__init__ = _without_form_parsing(WebRequest.__init__)
    if type(http_protocol.http) is _ModuleProxy:
        http_protocol.http = object.__getattribute__(http_protocol.http, "_module")
    WebRequest.__hash__ = object.__hash__
    if not getattr(HTTPFactory.startFactory, "access_line_only_if_kept", False):
        HTTPFactory.startFactory = _access_line_only_if_kept(HTTPFactory.startFactory)
    if not getattr(server.serverFromString, "with_backlog", False):
        server.serverFromString = _with_backlog(server.serverFromString)
