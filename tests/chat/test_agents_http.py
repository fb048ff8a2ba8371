"""The model server's HTTP/1.1 client (chat/agents/http.py), against raw servers on the test's
loop: how answers' bodies end and are cut, which connections are kept, and the proxy's two
ways (absolute form, and a `CONNECT` tunnel with TLS to the server through it)."""

import asyncio
import base64
import datetime
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chat.agents import http
from chat.agents.http import ModelClient

pytestmark = pytest.mark.asyncio

CLOSE = b""  # in an answer's pieces: the server closes the connection there
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass
class RawServer:
    """Answers each request with the next of `answers`: its pieces written one at a time (a
    short pause between them, so that the client reads them apart), `CLOSE` closing there."""

    answers: list[list[bytes]] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)  # each request's head and body
    connections: int = 0
    ended: int = 0  # connections the client closed
    port: int = 0
    tls: ssl.SSLContext | None = None  # a tunnel's TLS (`CONNECT` asked of this server)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"CONNECT ") and self.tls is not None:
                    self.requests.append(head)
                    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    await writer.drain()
                    await writer.start_tls(self.tls)
                    continue
                length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
                body = await reader.readexactly(int(length[1])) if length else b""
                self.requests.append(head + body)
                for piece in self.answers.pop(0):
                    if piece == CLOSE:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.ended += 1
            writer.close()


@pytest_asyncio.fixture
async def raw_server() -> AsyncIterator[RawServer]:
    server = RawServer()
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    yield server
    listening.close()


def client_of(server: RawServer, **kwargs) -> ModelClient:
    return ModelClient(
        f"http://127.0.0.1:{server.port}/v1/chat/completions",
        headers={"Content-Type": "application/json"},
        connect_timeout=5.0,
        **kwargs,
    )


async def body_of(client: ModelClient, request: bytes = b"{}") -> bytes:
    response = await client.post(request)
    body = b""
    try:
        while piece := await response.read():
            body += piece
    finally:
        response.release()
    return body


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


async def test_a_chunked_body_cut_anywhere_arrives_whole_on_one_kept_connection(raw_server):
    """Cut between a CR and its LF, inside a size line or its extension, inside the data."""
    events = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
    raw = b"f;name=value\r\n" + events[0] + b"\r\n" + chunked(events[1])
    raw_server.answers = [[HEAD, raw[:cut], raw[cut:]] for cut in range(1, len(raw))]
    client = client_of(raw_server)
    try:
        for _ in range(1, len(raw)):
            assert await body_of(client) == b"".join(events)
    finally:
        await client.close()

    assert raw_server.connections == 1
    request = raw_server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:%d\r\n" % raw_server.port in request
    assert request.endswith(b"\r\nContent-Length: 2\r\n\r\n{}")


async def test_a_length_body_is_kept_and_a_body_until_close_is_not(raw_server):
    raw_server.answers = [
        [
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
            b"lo",
        ],
        [b"HTTP/1.1 200 OK\r\n\r\n", b"until ", b"closed", CLOSE],
        [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
        [b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"],
        [b"HTTP/1.1 204 No Content\r\n\r\n"],
    ]
    client = client_of(raw_server)
    try:
        assert await body_of(client) == b"hello"  # the interim answer skipped
        assert await body_of(client) == b"until closed"
        assert await body_of(client) == b"ok"
        assert await body_of(client) == b"ok"
        assert await body_of(client) == b""
    finally:
        await client.close()

    # The first connection served two; each that its server closes, or said it would, is new.
    assert raw_server.connections == 4


async def test_a_body_larger_than_the_reader_keeps_up_with_arrives_whole(raw_server):
    """Reading pauses while more than `PAUSE_BYTES` wait to be read, and resumes as they are."""
    body = bytes(range(256)) * (4 * http.PAUSE_BYTES // 256)
    raw_server.answers = [[b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)]]
    client = client_of(raw_server)
    try:
        response = await client.post(b"{}")
        read = b""
        while piece := await response.read():
            read += piece
            await asyncio.sleep(0.01)
        response.release()
    finally:
        await client.close()

    assert read == body


async def test_an_answer_that_breaks_off_gives_what_came_then_raises(raw_server):
    raw_server.answers = [
        [HEAD, b"5\r\nhello\r\n", b"9\r\ncut", CLOSE],
        [HEAD, b"zz\r\n"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    ]
    client = client_of(raw_server)
    try:
        response = await client.post(b"{}")
        assert await response.read() + await response.read() == b"hellocut"
        with pytest.raises(ConnectionError):
            await response.read()
        response.release()
        with pytest.raises(ConnectionError):
            await body_of(client)  # a chunk size that is not one
        assert await body_of(client) == b"ok"
    finally:
        await client.close()

    assert raw_server.connections == 3  # neither broken connection was used again


async def test_a_server_that_closes_before_answering_is_a_connection_error(raw_server):
    raw_server.answers = [[CLOSE]]
    client = client_of(raw_server)
    try:
        with pytest.raises(ConnectionError):
            await client.post(b"{}")
    finally:
        await client.close()


async def test_unused_connections_are_closed_after_the_keepalive(raw_server, monkeypatch):
    monkeypatch.setattr(http, "KEEPALIVE_SECONDS", 0.05)
    raw_server.answers = [[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]]
    client = client_of(raw_server)
    try:
        assert await body_of(client) == b"ok"
        for _ in range(100):
            if raw_server.ended:
                break
            await asyncio.sleep(0.01)
        assert raw_server.ended == 1
    finally:
        await client.close()


async def test_a_line_break_in_a_header_is_refused():
    with pytest.raises(ValueError):
        ModelClient(
            "http://127.0.0.1:9/v1",
            headers={"Authorization": "Bearer k\r\nX-Injected: 1"},
            connect_timeout=1,
        )


async def test_an_http_address_is_asked_of_the_proxy_in_absolute_form(raw_server):
    raw_server.answers = [[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]]
    client = ModelClient(
        "http://llm.example:8000/v1/chat/completions",
        headers={},
        connect_timeout=5.0,
        proxy=f"http://user:pa%20ss@127.0.0.1:{raw_server.port}",
    )
    try:
        assert await body_of(client) == b"ok"
    finally:
        await client.close()

    (request,) = raw_server.requests
    assert request.startswith(b"POST http://llm.example:8000/v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nHost: llm.example:8000\r\n" in request
    assert b"\r\nProxy-Authorization: Basic %b\r\n" % base64.b64encode(b"user:pa ss") in request


def _tls_contexts(tmp_path: Path, host: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for `host`, and a client context trusting it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp_path / "cert.pem").write_bytes(pem)
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return server, ssl.create_default_context(cadata=pem.decode())


async def test_an_https_address_goes_through_a_connect_tunnel_with_the_servers_tls(
    raw_server, tmp_path, monkeypatch
):
    raw_server.tls, trusting = _tls_contexts(tmp_path, "llm.example")
    monkeypatch.setattr(http, "_TLS", trusting)  # the system's CAs do not know the test's
    raw_server.answers = [[HEAD, chunked(b"data: [DONE]\n\n")]] * 2
    client = ModelClient(
        "https://llm.example/v1/chat/completions",
        headers={},
        connect_timeout=5.0,
        proxy=f"http://u:p@127.0.0.1:{raw_server.port}",
    )
    try:
        assert await body_of(client) == b"data: [DONE]\n\n"
        assert await body_of(client) == b"data: [DONE]\n\n"
    finally:
        await client.close()

    tunnel, first, second = raw_server.requests
    auth = b"Proxy-Authorization: Basic %b\r\n" % base64.b64encode(b"u:p")
    assert (
        tunnel == b"CONNECT llm.example:443 HTTP/1.1\r\nHost: llm.example:443\r\n" + auth + b"\r\n"
    )
    # Inside the tunnel: the server's own request, without the proxy's credentials.
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm.example\r\n")
    assert b"Proxy-Authorization" not in first
    assert second == first and raw_server.connections == 1  # the tunnel kept


async def test_a_tunnel_the_proxy_refuses_is_a_connection_error(raw_server):
    raw_server.answers = [[b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n"]]
    client = ModelClient(
        "https://llm.example/v1/chat/completions",
        headers={},
        connect_timeout=5.0,
        proxy=f"http://127.0.0.1:{raw_server.port}",
    )
    try:
        with pytest.raises(http.ProxyRefused):
            await client.post(b"{}")
    finally:
        await client.close()


async def test_an_answers_header_costs_the_loop_few_calls(raw_server):
    """The head is decoded once and each header is cut, its name lowered and its value
    stripped: three C calls a header (five when each name and value was decoded apart). Counted
    as the difference between an answer with 2 headers and one with 42 (the least of five
    each: a loaded machine adds rounds of the loop)."""
    from tests.chat.costs import python_calls

    def answer(headers: int) -> list[bytes]:
        extra = b"".join(b"X-Header-%d: value %d\r\n" % (n, n) for n in range(headers - 2))
        return [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n%bContent-Length: 2\r\n\r\nok" % extra
        ]

    client = client_of(raw_server)
    try:
        raw_server.answers.append(answer(2))
        await body_of(client)  # the connection: what every later request finds
        counts = {}
        for headers in (2, 42):
            runs = []
            for _ in range(5):
                raw_server.answers.append(answer(headers))
                runs.append(await python_calls(body_of(client), builtins=True))
            counts[headers] = min(runs)
    finally:
        await client.close()

    assert counts[42] - counts[2] <= 40 * 3.5, counts
