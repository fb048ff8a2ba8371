"""What the tests of the Daphne and Twisted hooks share (test_layers.py, test_daphne_hooks.py):
a stand-in for a Daphne request's HTTP channel, and the Python functions a piece of work calls."""

import sys
from collections.abc import Callable


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
