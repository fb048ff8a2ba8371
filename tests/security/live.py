"""A hostile user's tools against a live Daphne on loopback: accounts, HTTP, sockets, probes.

Used by the tests under tests/security/ and by `bench/attacks.py`, which runs the same
attacks at full count and prints the table of docs/security.md. Everything targets the
server's loopback address only.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from http.client import HTTPConnection
from typing import Any
from urllib.parse import urlencode, urlsplit

from websockets.asyncio.client import ClientConnection, connect

from tests.browser.daphne_server import DaphneServer

USER_SETUP = """
from django.contrib.auth import get_user_model
from geosense.accounts.services import api_token_create, credit_set
from chat.models import ChatSession
user, _ = get_user_model().objects.get_or_create(username={name!r})
user.set_password({password!r})
user.save()
credit_set(user=user, balance={credits})
session = ChatSession.objects.create(user=user, allow_backend_tools={trusted})
print(api_token_create(user=user), session.pk)
"""


@dataclass(frozen=True)
class Account:
    name: str
    password: str
    token: str
    session: str


def account(
    server: DaphneServer, name: str, *, credits: int = 100, trusted: bool = False
) -> Account:
    """A user on the live server with a bearer token and a fresh session."""
    password = f"pw-{name}-long-enough"
    out = server.shell(
        USER_SETUP.format(name=name, password=password, credits=credits, trusted=trusted)
    )
    token, session = out.split()[-2:]
    return Account(name=name, password=password, token=token, session=session)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    server: DaphneServer,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: bytes | str | dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
    source: str | None = None,
) -> Answer:
    """One request on a fresh connection (from the loopback address `source`, if given); the
    whole answer (an event stream included)."""
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if isinstance(body, dict):
        body = json.dumps(body)
        sent.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    connection = HTTPConnection(
        "127.0.0.1", server.port, timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return Answer(
            status=response.status,
            headers={k.lower(): v for k, v in response.getheaders()},
            body=response.read(),
        )
    finally:
        connection.close()


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    events = []
    for block in body.decode().split("\n\n"):
        name = data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if name:
            events.append((name, data))
    return events


def ws_url(server: DaphneServer) -> str:
    return f"ws://127.0.0.1:{server.port}/ws/chat/"


async def socket_open(
    server: DaphneServer, *, token: str | None = None, headers: dict[str, str] | None = None
) -> ClientConnection:
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return await connect(
        ws_url(server), additional_headers=sent, max_size=None, compression=None, proxy=None
    )


async def frame_next(ws: ClientConnection, *, within: float = 30) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), within))


async def socket_bound(server: DaphneServer, who: Account) -> ClientConnection:
    ws = await socket_open(server, token=who.token)
    await ws.send(json.dumps({"type": "session-bind", "session": who.session}))
    frame = await frame_next(ws)
    assert frame["type"] == "session-bound", frame
    return ws


SOCKET = "socket"  # LatencyProbe(path=SOCKET) times a frame's round trip on the socket


@dataclass
class LatencyProbe:
    """Another user's requests, one every `interval` seconds, timed end to end in a thread.

    Corrected for coordinated omission: a request that took L > interval stands for the
    requests a steady client would have sent meanwhile, which would have waited L - interval,
    L - 2 * interval, ... (as HdrHistogram's `recordValueWithExpectedInterval`), so a stall
    weighs by its length and not as one slow sample.
    """

    server: DaphneServer
    token: str
    path: str = "/api/sessions"
    interval: float = 0.02
    samples_ms: list[float] = field(default_factory=list)
    requests: int = 0
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LatencyProbe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> LatencyProbe:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        return self

    def _run(self) -> None:
        if self.path == SOCKET:
            asyncio.run(self._run_socket())
            return
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                answer = http(self.server, "GET", self.path, token=self.token, timeout=120)
                ok = answer.status == 200
            except OSError:
                ok = False
            self._record(started, ok)
            self._stop.wait(self.interval)

    async def _run_socket(self) -> None:
        """A frame the server answers without a database: its round trip is the event loop's."""
        ws = await socket_open(self.server, token=self.token)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    await ws.send('{"type": "ping"}')
                    ok = (await frame_next(ws, within=120))["type"] == "error"
                except (OSError, TimeoutError):
                    ok = False
                self._record(started, ok)
                await asyncio.sleep(self.interval)
        finally:
            await ws.close()

    def _record(self, started: float, ok: bool) -> None:
        took = (time.perf_counter() - started) * 1000
        self.samples_ms.append(took)
        missed = took - self.interval * 1000
        while missed > 0:
            self.samples_ms.append(missed)
            missed -= self.interval * 1000
        self.requests += 1
        self.failures += not ok

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> str:
        return (
            f"{self.requests} requests, median {statistics.median(self.samples_ms):.1f} ms, "
            f"p99 {self.quantile(0.99):.1f} ms, max {max(self.samples_ms):.1f} ms, "
            f"{self.failures} failed"
        )


def host_of(server: DaphneServer) -> str:
    return urlsplit(server.url).netloc


def login_attempt(
    server: DaphneServer,
    username: str,
    password: str,
    *,
    source: str = "127.0.0.1",
    timeout: float = 60,
) -> Answer:
    """What a browser does: fetch the form (for its CSRF cookie), then post it."""
    form = http(server, "GET", "/accounts/login/", source=source, timeout=timeout)
    cookie = form.headers.get("set-cookie", "")
    csrf = cookie.split("csrftoken=", 1)[1].split(";", 1)[0]
    body = urlencode({"username": username, "password": password, "csrfmiddlewaretoken": csrf})
    return http(
        server,
        "POST",
        "/accounts/login/",
        body=body,
        source=source,
        timeout=timeout,
        headers={
            "Cookie": f"csrftoken={csrf}",
            "Content-Type": "application/x-www-form-urlencoded",
            "Referer": server.url + "/accounts/login/",
        },
    )
