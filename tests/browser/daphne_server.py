"""A live Daphne server in another process, for browser and multi-process tests.

The server cannot share the test process's in-memory database, settings overrides or mocks,
so it gets everything through its environment: `DEBUG=1`, a test `SECRET_KEY`, a SQLite file
of its own (`DATABASE_URL`) that was migrated and seeded by `manage.py` beforehand, and
whatever a test adds (e.g. `GEOSENSE_LLM_BASE_URL` of the fake model server). The seeded
database is built once per test run and copied for each server.

From the test process, read the server's data with `server.sql(...)` (plain SQLite, fast) or
run ORM code in a `manage.py shell -c` subprocess with `server.shell(...)`, which goes through
the app's own models and services.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parents[2]
SECRET_KEY = "live-server-test-secret"
SEED_ANNOTATIONS = 300
SEED = 1
START_TIMEOUT = 30.0
# How the tests and `bench/load.py` start a server: Daphne on uvloop, as `make run` and the
# deployment files do (geosense/serve.py); the arguments follow, as Daphne's command takes them.
SERVE = (sys.executable, "-m", "geosense.serve")

# The test process's own configuration must not leak into the server: it gets exactly the
# environment a test asks for.
_NOT_INHERITED = {
    "ALLOWED_HOSTS",
    "DATABASE_URL",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "DJANGO_SETTINGS_MODULE",
    "REDIS_URL",
}


def server_env(
    *,
    db_path: Path | None = None,
    database_url: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a server process: a SQLite file (`db_path`) or another database."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _NOT_INHERITED and not name.startswith("GEOSENSE_")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="geosense.settings",
        DEBUG="1",
        SECRET_KEY=SECRET_KEY,
        DATABASE_URL=database_url or f"sqlite:///{db_path}",
        GEOSENSE_ENV_FILE="",  # a developer's .env is not the server's
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def manage(*args: str, env: dict[str, str]) -> str:
    """Run a management command as the server would, and return what it printed."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"manage.py {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def seeded_database(path: Path) -> Path:
    """Migrate a fresh SQLite file and load the demo user and annotations into it."""
    env = server_env(db_path=path)
    manage("migrate", "--noinput", env=env)
    manage("seed_demo", "--annotations", str(SEED_ANNOTATIONS), "--seed", str(SEED), env=env)
    return path


def copy_database(source: Path, target: Path) -> Path:
    """A consistent copy even in WAL mode (SQLite's online backup, not a file copy)."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
    return target


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class DaphneServer:
    url: str
    port: int
    db_path: Path
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] = field(repr=False)

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of a query on the server's database, read from the test process."""
        with closing(sqlite3.connect(self.db_path, timeout=20)) as conn:
            return conn.execute(query, params).fetchall()

    def manage(self, *args: str) -> str:
        return manage(*args, env=self.env)

    def shell(self, code: str) -> str:
        """Run Python with Django set up against the server's database; returns its output."""
        return self.manage("shell", "--no-imports", "-c", code)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(*, db_path: Path, log_path: Path, extra_env: dict[str, str]) -> DaphneServer:
    env = server_env(db_path=db_path, extra=extra_env)
    last_error = ""
    for _ in range(3):
        port = free_port()
        command = [*SERVE, "-b", "127.0.0.1", "-p", str(port)]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [*command, "geosense.asgi:application"],
                cwd=BASE_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = DaphneServer(
            url=f"http://127.0.0.1:{port}",
            port=port,
            db_path=db_path,
            log_path=log_path,
            env=env,
            process=process,
        )
        if _wait_until_listening(server):
            return server
        server.stop()
        last_error = server.log()[-4000:]
    raise RuntimeError(f"Daphne did not start:\n{last_error}")


def _wait_until_listening(server: DaphneServer) -> bool:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            # Most likely the port was taken between choosing and binding it.
            return False
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class DaphneServers:
    """Starts a server per distinct extra environment and keeps it for the whole run."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._template: Path | None = None
        self._servers: dict[tuple[tuple[str, str], ...], DaphneServer] = {}

    def __call__(self, env: dict[str, str] | None = None) -> DaphneServer:
        key = tuple(sorted((env or {}).items()))
        if key not in self._servers:
            self._servers[key] = self._start(dict(key))
        return self._servers[key]

    def _start(self, extra_env: dict[str, str]) -> DaphneServer:
        if self._template is None:
            self._template = seeded_database(self._workdir / "seeded.sqlite3")
        name = f"server-{len(self._servers)}"
        db_path = copy_database(self._template, self._workdir / f"{name}.sqlite3")
        return start_server(
            db_path=db_path, log_path=self._workdir / f"{name}.log", extra_env=extra_env
        )

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()
