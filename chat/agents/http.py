"""HTTP/1.1 to the model server: a POST of JSON bytes on a kept-alive connection, its answer's
body read as it arrives.

This replaced aiohttp (issue 15: one process's event loop is the ceiling of its turns). For
this one kind of request aiohttp cost the loop ~110 Python calls a request (its `_request`, a
`ClientRequest` built by twelve `update_*` steps, a payload object, a task to write the body,
timer contexts, the connection's take and release, the cookie filter) and ~9 a chunk of the
answer (its parser's three callbacks, the stream's read and the `resume_reading` chain it runs
on every read, paused or not): at 200 users a third of the main thread's Python calls. Here a
request is one write of bytes made once per client but for the body's length, and the body's
chunks are cut in `data_received`'s own frame.

What it does is what an OpenAI-compatible server needs, and no more:
- a request is `POST` with a `Content-Length` body; no content coding is asked for
  (`Accept-Encoding: identity`: SSE is sent as it is);
- an answer's body has a `Content-Length`, is chunked, or lasts until the server closes; 1xx
  answers are skipped; a connection goes back to the pool only after a complete answer whose
  server keeps it (HTTP/1.1 without `Connection: close`), and is closed after
  `KEEPALIVE_SECONDS` unused;
- HTTPS by the default TLS context (the system's CAs, the host checked), made once at import;
- a proxy named by the environment: `http://` addresses are asked of it in absolute form,
  `https://` ones through a `CONNECT` tunnel; a user and password in its URL go as Basic
  credentials (`Proxy-Authorization`).

Failures are `OSError`s: `ConnectionError` for an answer that breaks HTTP or breaks off, the
loop's own errors for connecting, `TimeoutError` for a wait past the time its caller gives
(`by`, on the loop's clock): a timer a wait, not an `asyncio.timeout` (its context, the task's
cancellation and uncancellation: five Python calls a wait on the loop).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import re
import ssl
import urllib.parse
from collections.abc import Mapping

# The status line and headers of an answer, and a chunk's size line, may be this long at most.
HEAD_MAX_BYTES = 64 * 1024
CHUNK_LINE_MAX_BYTES = 4096
# Body bytes received and not read yet past which reading pauses (the reader is behind).
PAUSE_BYTES = 256 * 1024
KEEPALIVE_SECONDS = 5.0
_CHUNK_SIZE_RE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")
_STATUS_RE = re.compile(r"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_BREAK_RE = re.compile(r"[\r\n\x00]")
# Made once: loading the CA bundle costs ~50 ms of CPU (issue 15, cause 1).
_TLS = ssl.create_default_context()

# How the body of an answer ends.
_LENGTH, _CHUNKED, _CLOSE = "length", "chunked", "close"
# Where a chunked body's reading is: a size line, its data, the line end after the data, the
# trailer's lines, the end.
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class BrokenAnswer(ConnectionError):
    """The server's answer broke HTTP/1.1, or the connection ended in the middle of it."""


class ProxyRefused(ConnectionError):
    """The proxy answered a `CONNECT` with something else than 2xx."""


class Response:
    """One answer, read on its connection: `status` and `headers` (names in lower case) once
    its head has come, then its body by `read`/`read_nowait` (`complete` once all of it has
    come); `release` hands the connection back (kept only after a complete body) or closes
    it."""

    def __init__(self, connection: _Connection, *, bodiless: bool = False) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.loop = connection.loop
        self._connection = connection
        self._bodiless = bodiless
        self._head: bytes | None = b""  # None once the head is read
        self._mode = _CLOSE
        self._keep = False  # the server keeps the connection after this answer
        self._left = 0  # bytes left of the body (`_LENGTH`) or of the chunk being read
        self._state = _SIZE
        self._line = b""  # a line of the chunked framing cut by a piece's end
        self._body: list[bytes] = []  # pieces received and not read yet
        self._size = 0
        self.complete = False  # the whole body has come (read or not)
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[bool] | None = None  # its result: whether time ran out
        self._paused = False
        self._released = False
        connection.response = self

    async def head(self, *, by: float | None = None) -> None:
        """Wait for the status line and headers (until the loop's time `by`)."""
        while self._head is not None:
            if self._error is not None:
                raise self._error
            await self._wait(by)

    def read_nowait(self) -> bytes | None:
        """The body's bytes received and not read yet; b"" at the body's end; None when there
        are none yet (`read` waits for them). A connection that broke off raises, once what
        came before the break is read."""
        body = self._body
        if body:
            self._body, self._size = [], 0
            if self._paused:
                self._paused = False
                self._connection.resume()
            return body[0] if len(body) == 1 else b"".join(body)
        if self._error is not None:
            raise self._error
        return b"" if self.complete else None

    async def read(self, *, by: float | None = None) -> bytes:
        """The body's next bytes, waiting for them (until the loop's time `by`); b"" at its
        end."""
        while (data := self.read_nowait()) is None:
            await self._wait(by)
        return data

    async def _wait(self, by: float | None) -> None:
        """Until the connection's next news (bytes, the end, a failure: `_wake`); a
        `TimeoutError` at the loop's time `by`."""
        waiter = self._waiter = self.loop.create_future()
        timer = None if by is None else self.loop.call_at(by, _expire, waiter)
        try:
            expired = await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if expired:
            raise TimeoutError

    def release(self) -> None:
        """Hand the connection back, once."""
        if self._released:
            return
        self._released = True
        connection, self._connection.response = self._connection, None
        if self.complete and self._keep and self._error is None:
            connection.pool.idle_put(connection)
        else:
            connection.close()

    # --- the connection's side ---------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self._error is not None:  # the connection is closing
            return
        if self._head is not None:
            data = self._head_feed(data)
            if not data:
                if self._head is None:  # the head came, without the body's start
                    self._wake()
                return
        if self.complete:  # bytes past the answer's end: the connection cannot be trusted
            self._keep = False
            return
        mode = self._mode
        if mode == _CHUNKED:
            self._chunks_feed(data)
        elif mode == _LENGTH:
            piece = data[: self._left]
            self._left -= len(piece)
            self._add(piece)
            if len(data) > len(piece):
                self._keep = False
            if not self._left:
                self.complete = True
        else:
            self._add(data)
        self._wake()

    def lost(self, exc: BaseException | None) -> None:
        """The connection ended (the server closed it, or it failed)."""
        if self._head is not None:
            self._fail(BrokenAnswer("the model server closed the connection without an answer"))
        elif not self.complete:
            if self._mode == _CLOSE and exc is None:  # the end of a body without a length
                self.complete = True
            else:
                self._fail(BrokenAnswer("the model server's answer broke off"))
        self._keep = False
        self._wake()

    def _head_feed(self, data: bytes) -> bytes:
        """Read the head from `data`; what follows it (the body's start), if it ended."""
        head = self._head + data if self._head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > HEAD_MAX_BYTES:
                self._fail(BrokenAnswer("the model server's answer has an oversized head"))
            self._head = head
            return b""
        lines = head[:end].decode("latin-1").split("\r\n")
        status = _STATUS_RE.fullmatch(lines[0])
        if status is None:
            self._fail(BrokenAnswer("the model server did not answer in HTTP/1.x"))
            return b""
        code = int(status[2])
        if 100 <= code < 200:  # an interim answer (`100 Continue`, `103 Early Hints`)
            self._head = b""
            return self._head_feed(head[end + 4 :])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name[0] in " \t" or name[-1] in " \t":
                self._fail(BrokenAnswer("the model server's answer has a malformed header"))
                return b""
            name, value = name.lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._head, self.status, self.headers = None, code, headers
        connection = headers.get("connection", "").lower()
        self._keep = status[1] == "1" and "close" not in connection
        encoding = headers.get("transfer-encoding", "").lower()
        if self._bodiless or code in (204, 304):
            self._mode, self.complete = _LENGTH, True
        elif encoding:
            if encoding.rsplit(",", 1)[-1].strip() != "chunked":
                self._mode, self._keep = _CLOSE, False
            else:
                self._mode = _CHUNKED
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit() or not length.isascii():
                self._fail(BrokenAnswer("the model server's answer has a malformed length"))
                return b""
            self._mode, self._left = _LENGTH, int(length)
            self.complete = not self._left
        else:
            self._mode, self._keep = _CLOSE, False
        return head[end + 4 :]

    def _chunks_feed(self, data: bytes) -> None:
        """Cut a piece of a chunked body into the chunks' data, in this one frame: a model
        streams a token a chunk, and a call a chunk is a Python call a token on the loop."""
        pos, size, body = 0, len(data), self._body
        while pos < size:
            if self._state == _DATA:
                end = pos + self._left
                piece = data[pos:end]
                self._left -= len(piece)
                self._size += len(piece)
                body.append(piece)
                pos = end
                if not self._left:
                    self._state = _DATA_END
                continue
            if self._line[-1:] == b"\r" and data[pos : pos + 1] == b"\n":
                line, self._line = self._line[:-1], b""  # cut between its CR and its LF
                pos += 1
            else:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    self._line += data[pos:]
                    if len(self._line) > CHUNK_LINE_MAX_BYTES:
                        self._fail(BrokenAnswer("the model server sent an oversized chunk line"))
                    return
                line = self._line + data[pos:end] if self._line else data[pos:end]
                self._line = b""
                pos = end + 2
            state = self._state
            if state == _SIZE:
                found = _CHUNK_SIZE_RE.fullmatch(line)
                if found is None:
                    self._fail(BrokenAnswer("the model server sent a malformed chunk size"))
                    return
                self._left = int(found[1], 16)
                self._state = _DATA if self._left else _TRAILER
            elif state == _DATA_END:
                if line:
                    self._fail(BrokenAnswer("the model server sent a chunk longer than its size"))
                    return
                self._state = _SIZE
            elif not line:  # the trailer's end, and the body's
                self._state, self.complete = _DONE, True
                if pos < size:  # bytes past the answer: the connection cannot be trusted
                    self._keep = False
                break
        if self._size > PAUSE_BYTES and not self._paused:
            self._pause()

    def _add(self, piece: bytes) -> None:
        if piece:
            self._body.append(piece)
            self._size += len(piece)
            if self._size > PAUSE_BYTES and not self._paused:
                self._pause()

    def _pause(self) -> None:
        """Stop reading while more than `PAUSE_BYTES` wait to be read (`read_nowait` resumes)."""
        self._paused = True
        self._connection.pause()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._keep = False
        self._wake()
        self._connection.close()


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


class _Connection(asyncio.Protocol):
    """A connection to the server (or to a proxy's tunnel to it), with its current answer."""

    def __init__(self, pool: ModelClient) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.idle_since = 0.0

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # a server that talks out of turn: not kept
            self.close()
        else:
            response.feed(data)

    def eof_received(self) -> bool:
        return False  # the transport closes; `connection_lost` ends the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.response is not None:
            self.response.lost(exc)

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ModelClient:
    """A configuration's connections to its server (its URL, headers and connect time-out
    fixed), each kept alive between requests (LIFO, so that few stay warm)."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout: float,
        proxy: str | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed = False
        parts = urllib.parse.urlsplit(url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._connect_timeout = connect_timeout
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._proxy: tuple[str, int, bool] | None = None
        self._proxy_headers = ""
        if proxy is not None:
            found = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            proxy_tls = found.scheme == "https"
            self._proxy = (
                found.hostname or "",
                found.port or (443 if proxy_tls else 80),
                proxy_tls,
            )
            if found.username is not None:
                user = urllib.parse.unquote(found.username)
                password = urllib.parse.unquote(found.password or "")
                token = base64.b64encode(f"{user}:{password}".encode()).decode()
                self._proxy_headers = f"Proxy-Authorization: Basic {token}\r\n"
            if not self._tls:  # asked of the proxy itself, in absolute form
                target = urllib.parse.urlunsplit(parts._replace(fragment=""))
        authority = parts.netloc.rpartition("@")[2]
        lines = [f"POST {target} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if not any(name.lower() == "accept-encoding" for name in headers):
            lines.append("Accept-Encoding: identity")
        if self._proxy is not None and not self._tls and self._proxy_headers:
            lines.append(self._proxy_headers.rstrip("\r\n"))
        lines.append("Content-Length: ")
        head = "\r\n".join(lines)
        if any(_BREAK_RE.search(line) for line in lines):
            raise ValueError("a request header holds a line break")
        self._head = head.encode()
        self._idle: collections.deque[_Connection] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None

    async def post(self, body: bytes, *, by: float | None = None) -> Response:
        """Send `body`; the answer once its head has come (its body still to be read), by the
        loop's time `by` (else `TimeoutError`), a connection made included."""
        if self.closed:
            raise RuntimeError("the model client is closed")
        connection = self._idle_take() or await self._connect(by)
        response = Response(connection)
        assert connection.transport is not None
        connection.transport.write(b"%b%d\r\n\r\n%b" % (self._head, len(body), body))
        try:
            await response.head(by=by)
        except BaseException:
            response.release()
            raise
        return response

    async def close(self) -> None:
        """Close the kept connections; those in use close when their answer is released."""
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        while self._idle:
            self._idle.pop().close()

    def idle_put(self, connection: _Connection) -> None:
        if self.closed or not connection.open:
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.append(connection)
        if self._sweep is None:
            self._sweep = self.loop.call_later(KEEPALIVE_SECONDS, self._stale_close)

    def _idle_take(self) -> _Connection | None:
        """The connection last kept, if it is still open and not due to close (`_stale_close`
        runs on a timer, which may come late)."""
        idle = self._idle
        if idle:
            now = self.loop.time()
            while idle:
                connection = idle.pop()
                if connection.open and now - connection.idle_since < KEEPALIVE_SECONDS:
                    return connection
                connection.close()
        return None

    def _stale_close(self) -> None:
        """Close the connections unused for `KEEPALIVE_SECONDS` (the oldest are on the left);
        look again when the next would be."""
        self._sweep = None
        idle, now = self._idle, self.loop.time()
        while idle and (now - idle[0].idle_since >= KEEPALIVE_SECONDS or not idle[0].open):
            idle.popleft().close()
        if idle:
            self._sweep = self.loop.call_at(
                idle[0].idle_since + KEEPALIVE_SECONDS, self._stale_close
            )

    async def _connect(self, by: float | None) -> _Connection:
        loop = self.loop
        tls = _TLS if self._tls else None
        limit = loop.time() + self._connect_timeout
        async with asyncio.timeout_at(limit if by is None else min(by, limit)):
            if self._proxy is None:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self),
                    self._host,
                    self._port,
                    ssl=tls,
                    server_hostname=self._host if tls else None,
                )
                return connection
            host, port, proxy_tls = self._proxy
            _, connection = await loop.create_connection(
                lambda: _Connection(self),
                host,
                port,
                ssl=_TLS if proxy_tls else None,
                server_hostname=host if proxy_tls else None,
            )
            if tls is None:
                return connection
            try:
                await self._tunnel(connection)
            except BaseException:
                connection.close()
                raise
            return connection

    async def _tunnel(self, connection: _Connection) -> None:
        """Ask the proxy for a tunnel to the server, then speak TLS to the server through it."""
        authority = f"{self._host}:{self._port}"
        assert connection.transport is not None
        connection.transport.write(
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
            f"{self._proxy_headers}\r\n".encode()
        )
        answer = Response(connection, bodiless=True)
        await answer.head()
        connection.response = None
        if not 200 <= answer.status < 300:
            raise ProxyRefused(f"the proxy refused the tunnel (HTTP {answer.status})")
        transport = await self.loop.start_tls(
            connection.transport, connection, _TLS, server_hostname=self._host
        )
        connection.transport = transport  # type: ignore[assignment]
