"""An autobahn server-side WebSocket over Twisted's in-memory transport, its handshake done:
for the tests that count what a frame sent or received costs (test_daphne_hooks.py,
chat/test_socket_costs.py)."""

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.testing import StringTransport


def socket_opened() -> tuple[WebSocketServerProtocol, StringTransport]:
    factory = WebSocketServerFactory()
    factory.protocol = WebSocketServerProtocol
    protocol = factory.buildProtocol(("127.0.0.1", 1))
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    return protocol, transport
