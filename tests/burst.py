"""A burst of TCP connections at once, as a process meets it when many clients connect together
(users' turns ending at the same moment, a restart under open pages, an engine opening its
model connections)."""

import errno
import select
import socket
import time
from contextlib import ExitStack


def connects_completed(port: int, count: int, *, within: float) -> int:
    """How many of `count` connections started at once to `port` complete within `within`
    seconds (non-blocking connects: their handshake is the kernel's, whether or not the
    process ever calls `accept`)."""
    with ExitStack() as stack:
        pending = set()
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setblocking(False)
            assert sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
            pending.add(sock)
        completed = 0
        deadline = time.monotonic() + within
        while pending and (left := deadline - time.monotonic()) > 0:
            _, writable, _ = select.select([], list(pending), [], left)
            for sock in writable:
                pending.discard(sock)
                completed += sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return completed
