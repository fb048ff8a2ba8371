"""geosense/sqlite_wal.py: a serving process keeps its SQLite file's WAL open (no close deletes
it) and written to disk in the background (a checkpoint on the engine's thread then has little
left to fsync)."""

import os
import sqlite3
import threading
import time
from types import SimpleNamespace

import pytest

from geosense import sqlite_wal


def _write_and_close(path) -> None:
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE IF NOT EXISTS t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    busy, _, _ = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0  # the keeper holds back no checkpoint
    writer.close()


def test_the_wal_keeper_keeps_a_closing_connection_from_checkpointing_the_file(tmp_path):
    """Closing SQLite's last connection checkpoints the WAL and deletes it (fsyncs): with the
    request path holding no connection, the pool's every idle close was the last one."""
    path = tmp_path / "db.sqlite3"
    _write_and_close(path)
    assert not (tmp_path / "db.sqlite3-wal").exists()  # the last close removed it

    assert sqlite_wal.wal_keeper_open(str(tmp_path / "none.sqlite3")) is None
    keeper = sqlite_wal.wal_keeper_open(str(path))
    _write_and_close(path)
    assert (tmp_path / "db.sqlite3-wal").exists()  # not the last: nothing to do on close
    keeper.close()


class _Synced:
    """Stands for `os.fdatasync`: the files (device, inode) it was called on, in order."""

    def __init__(self) -> None:
        self.files: list[tuple[int, int]] = []
        self.called = threading.Event()

    def __call__(self, fd: int) -> None:
        status = os.fstat(fd)
        self.files.append((status.st_dev, status.st_ino))
        self.called.set()

    def since(self, count: int) -> tuple[int, int]:
        """The file of the first sync after the first `count`, once made (up to 5 s). Counted, not
        awaited from a cleared event: a sync made before such a wait began (the flusher's own
        thread) was missed, and an unchanged WAL is not synced again."""
        while len(self.files) <= count:
            self.called.clear()
            if len(self.files) <= count:
                assert self.called.wait(5)
        return self.files[count]


def _identity(path) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_dev, status.st_ino


def test_the_flusher_syncs_the_wal_follows_a_new_file_and_waits_while_there_is_none(
    tmp_path, monkeypatch
):
    synced = _Synced()
    monkeypatch.setattr(sqlite_wal.os, "fdatasync", synced)
    path = tmp_path / "db.sqlite3"
    wal = tmp_path / "db.sqlite3-wal"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    flusher = sqlite_wal.WalFlusher(str(wal), interval=0.01)
    flusher.start()
    try:
        first = _identity(wal)
        assert synced.since(0) == first
        writer.close()  # the last connection: the WAL is checkpointed and deleted
        assert not wal.exists()
        time.sleep(0.05)
        synced.files.clear()
        time.sleep(0.05)
        assert synced.files == []  # no file, nothing synced (and no error)

        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("INSERT INTO t VALUES (1)")  # a new WAL
        assert synced.since(0) == _identity(wal)
    finally:
        flusher.stop()
        writer.close()
    assert flusher._fd is None  # its descriptor closed with the thread


def test_an_unchanged_wal_is_not_synced_again(tmp_path, monkeypatch):
    """On ext4 every `fdatasync` makes the disk flush its write cache, written or not: an idle
    process would have done it four times a second for its whole life (review 31-a, M1)."""
    synced = _Synced()
    monkeypatch.setattr(sqlite_wal.os, "fdatasync", synced)
    path = tmp_path / "db.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    flusher = sqlite_wal.WalFlusher(f"{path}-wal")
    try:
        flusher.flush()
        flusher.flush()
        assert len(synced.files) == 1
        writer.execute("INSERT INTO t VALUES (1)")
        flusher.flush()
        flusher.flush()
        assert len(synced.files) == 2
    finally:
        flusher._close()
        writer.close()


def test_a_failing_flush_is_logged_once_and_the_thread_goes_on(tmp_path, monkeypatch, caplog):
    calls: list[int] = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(sqlite_wal.os, "fdatasync", failing)
    wal = tmp_path / "db.sqlite3-wal"
    wal.write_bytes(b"")
    flusher = sqlite_wal.WalFlusher(str(wal), interval=0.005)
    flusher.start()
    try:
        deadline = time.monotonic() + 5
        while len(calls) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        flusher.stop()
    assert len(calls) >= 5
    logged = [r for r in caplog.records if r.name == "geosense.sqlite_wal"]
    assert len(logged) == 1 and "Could not write SQLite's WAL" in logged[0].getMessage()


def test_a_real_flush_syncs_a_read_only_descriptor(tmp_path):
    """`fdatasync` on the descriptor the flusher opens read-only: Linux allows it."""
    path = tmp_path / "db.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    flusher = sqlite_wal.WalFlusher(f"{path}-wal")
    flusher.flush()
    assert flusher._file == _identity(f"{path}-wal")
    flusher._close()
    writer.close()


@pytest.mark.parametrize(
    ("database", "expected"),
    [
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/db.sqlite3"}, "/srv/db.sqlite3"),
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, None),
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": "file:memdb?mode=memory"}, None),
        ({"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "geosense"}, None),
    ],
)
def test_only_an_sqlite_file_is_kept_and_flushed(monkeypatch, database, expected):
    monkeypatch.setattr(sqlite_wal, "settings", SimpleNamespace(DATABASES={"default": database}))
    assert sqlite_wal.sqlite_file() == expected


def test_a_process_keeps_its_file_open_and_its_wal_flushed_once(tmp_path, monkeypatch):
    path = tmp_path / "db.sqlite3"
    _write_and_close(path)
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}
    monkeypatch.setattr(sqlite_wal, "settings", SimpleNamespace(DATABASES={"default": database}))
    monkeypatch.setattr(sqlite_wal, "_kept", None)
    sqlite_wal.sqlite_wal_keep()
    keeper, flusher = sqlite_wal._kept
    try:
        assert flusher.is_alive() and flusher.name == "sqlite_wal_flush"
        assert flusher.path == f"{path}-wal"
        sqlite_wal.sqlite_wal_keep()
        assert sqlite_wal._kept == (keeper, flusher)  # once a process
    finally:
        flusher.stop()
        keeper.close()


def test_without_fdatasync_the_flusher_fsyncs(tmp_path, monkeypatch):
    """macOS has no `os.fdatasync`: `make run` there flushes with `fsync` (review 31-a, L1)."""
    synced = _Synced()
    monkeypatch.delattr(sqlite_wal.os, "fdatasync")
    monkeypatch.setattr(sqlite_wal.os, "fsync", synced)
    wal = tmp_path / "db.sqlite3-wal"
    wal.write_bytes(b"frames")
    flusher = sqlite_wal.WalFlusher(str(wal))
    flusher.flush()
    flusher._close()
    assert synced.files == [_identity(wal)]
