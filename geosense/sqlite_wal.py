"""SQLite's write-ahead log in a serving process: kept open, and written to disk in the background.

A process that serves from an SQLite file does two things for its WAL, from start-up
(geosense/asgi.py) to its exit; on a database server, or in memory, neither:

- It keeps one connection to the file open (`wal_keeper_open`). Closing the last connection to
  a database in WAL mode checkpoints the WAL and deletes it, with fsyncs (10-40 ms a close on
  this machine under load). The engine's pool closes its connection whenever nothing queues
  behind a call, so under a light load nearly every trip closed the file's last connection.
- A thread writes the WAL's new pages to disk every quarter of a second, if any (`WalFlusher`). With
  `synchronous=NORMAL` a commit does not fsync; a checkpoint does, in the commit that crosses
  `wal_autocheckpoint` (geosense/settings.py), on the turn engine's one database thread. Its
  fsync of the WAL had every page written since the last checkpoint to put on disk (~40 MiB):
  29-45 ms at 200 users, up to 303 ms, while every turn's trips queued behind it. With the
  pages already on disk, the checkpoint's fsync has at most a quarter of a second's to write.
  The thread only calls `fdatasync` on a read-only descriptor of its own: what SQLite writes,
  where and when, is unchanged, and so is what a crash or a power cut leaves.
"""

import logging
import os
import sqlite3
import threading

from django.conf import settings

logger = logging.getLogger(__name__)

# How often the flusher writes the WAL's new pages to disk: at 200 users ~3 MiB a time.
WAL_FLUSH_SECONDS = 0.25


def sqlite_file() -> str | None:
    """The default database's SQLite file; None for a database server or an in-memory one."""
    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.sqlite3":
        return None
    name = str(database["NAME"])
    if name == ":memory:" or name.startswith("file:"):
        return None
    return name


class WalFlusher(threading.Thread):
    """Every `interval` seconds, `fdatasync` the WAL at `path`: opened once, again when SQLite
    made the file anew (the last connection's close deletes it), let be while there is none."""

    def __init__(self, path: str, interval: float = WAL_FLUSH_SECONDS) -> None:
        super().__init__(name="sqlite_wal_flush", daemon=True)
        self.path = path
        self.interval = interval
        self._stopped = threading.Event()
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None  # the (device, inode) `_fd` is open on
        # The WAL's (size, modification time) at the last sync: unchanged, nothing to write, and
        # on ext4 a sync would still make the disk flush its cache (an idle process's 4 a second).
        self._synced: tuple[int, int] | None = None
        self._failing = False  # a flush failed and was logged: the next failures are not

    def run(self) -> None:
        try:
            while not self._stopped.wait(self.interval):
                try:
                    self.flush()
                except OSError:
                    if not self._failing:
                        logger.exception("Could not write SQLite's WAL %s to disk", self.path)
                    self._failing = True
                else:
                    self._failing = False
        finally:
            self._close()

    def flush(self) -> None:
        """Put the WAL's pages that are only in memory on disk, if it was written since."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            self._close()
            return
        if (status.st_dev, status.st_ino) != self._file:
            self._close()
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return
            opened = os.fstat(fd)
            self._fd, self._file = fd, (opened.st_dev, opened.st_ino)
        written = (status.st_size, status.st_mtime_ns)
        if written == self._synced:
            return
        (getattr(os, "fdatasync", None) or os.fsync)(self._fd)  # macOS has no fdatasync
        # Read before the sync: a write meanwhile changes them, and the next flush syncs again,
        # unless it lands in the same timestamp tick without growing the file (a restarted WAL
        # on a filesystem with coarse timestamps): the checkpoint's own fsync then writes it.
        self._synced = written

    def stop(self) -> None:
        """End the thread (its descriptor closed) and wait for it."""
        self._stopped.set()
        self.join()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._file = self._synced = None


def wal_keeper_open(path: str) -> sqlite3.Connection | None:
    """A connection to the SQLite file at `path` that has read its header (so it counts as
    open for the WAL) and holds nothing; None if there is no such file (none is created).
    It runs nothing after: holding no read snapshot, it never holds back a checkpoint."""
    try:
        keeper = sqlite3.connect(f"file:{path}?mode=rw", uri=True, check_same_thread=False)
        keeper.execute("PRAGMA schema_version").fetchall()
    except sqlite3.OperationalError:
        return None
    return keeper


# What `sqlite_wal_keep` started, for the life of the process.
_kept: tuple[sqlite3.Connection, WalFlusher] | None = None


def sqlite_wal_keep() -> None:
    """With an SQLite file: keep a connection to it open and its WAL flushed, once a process."""
    global _kept
    path = sqlite_file()
    if _kept is not None or path is None:
        return
    keeper = wal_keeper_open(path)
    if keeper is None:
        return
    flusher = WalFlusher(f"{path}-wal")
    flusher.start()
    _kept = keeper, flusher
