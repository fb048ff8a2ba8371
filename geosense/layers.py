"""The process's own channel layer, for one process holding hundreds of sockets (issue 15: 500
users connecting at once). (Its hooks in Daphne, Twisted and autobahn: geosense/daphne_hooks.py.)

- `InMemoryChannelLayer`: Channels' in-memory layer sweeps every channel and every group
  membership of the process for expired entries on each `receive` and `group_send`. Every
  socket's consumer calls `receive` once as it starts and again after each layer message, so
  500 sockets connecting swept ~1,500 memberships 500 times, and a message to every socket (an
  annotations change) swept once per socket: work growing with the sockets, per socket. Here
  the sweep runs at most once per `SWEEP_SECONDS` (messages expire after a minute, groups
  after a day: a second late changes nothing).
"""

import time

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
