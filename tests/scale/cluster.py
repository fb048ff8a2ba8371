"""Throwaway servers on loopback for the scale tests and bench/scale.py.

- `PostgresCluster`: `initdb` into a temporary folder, `postgres` on a free port (its unix
  socket in that folder too), a `geosense` database with PostGIS. Never a system service.
  PostgreSQL refuses to run as root, so under root (CI) the cluster runs as the `postgres`
  user Debian's package creates (or `nobody`).
- `RedisServer`: `redis-server` on a free port, nothing saved to disk.
- `DaphneProcess`: one Daphne running GeoSense with the environment it is given; it can be
  killed (any signal) and started again on the same port.
- `ScaleCluster`: all of them together, migrated and seeded, with N Daphne processes.
- `NginxProxy`: Debian's nginx with the repository's deploy/nginx/geosense-locations.conf in
  front of those processes, serving the collected static files.

`scale_missing()` names what is not installed, for the skip (or failure) message.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.browser.daphne_server import BASE_DIR, SERVE, free_port, manage, server_env

DATABASE = "geosense"
ROLE = "geosense"
START_TIMEOUT = 30.0
SEED_ANNOTATIONS = 300
SEED = 1


# --- what is installed -----------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where `initdb` and `postgres` live: on the PATH, or Debian's versioned folder."""
    on_path = shutil.which("postgres")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(versions[-1]).parent if versions else None


def postgis_installed(bindir: Path) -> bool:
    sharedir = subprocess.run(
        [bindir / "pg_config", "--sharedir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not sharedir:  # pg_config lives in libpq-dev on some systems: Debian's layout then
        sharedir = f"/usr/share/postgresql/{bindir.parent.name}"
    return Path(sharedir, "extension", "postgis.control").exists()


def scale_missing() -> list[str]:
    """What the scale tests need and this machine lacks (empty when all is there)."""
    missing = []
    bindir = postgres_bindir()
    if bindir is None:
        missing.append("PostgreSQL (Debian's `postgresql`: initdb and postgres)")
    elif not postgis_installed(bindir):
        missing.append(f"PostGIS for PostgreSQL {bindir.parent.name} (`postgresql-15-postgis-3`)")
    if shutil.which("redis-server") is None:
        missing.append("`redis-server`")
    if nginx_binary() is None:
        missing.append("`nginx`")
    return missing


def nginx_binary() -> str | None:
    """Debian's nginx lives in /usr/sbin, which is not on every user's PATH."""
    if found := shutil.which("nginx"):
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


# --- helpers ---------------------------------------------------------------------------------


def wait_for_port(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{what} does not listen on port {port}")


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- PostgreSQL ------------------------------------------------------------------------------


@dataclass
class PostgresCluster:
    bindir: Path
    root: Path = field(init=False)
    port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"postgres://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    def _as_owner(self) -> dict[str, Any]:
        """Popen arguments that run a command as the cluster's owner (never root)."""
        if os.geteuid() != 0:
            return {}
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        raise RuntimeError("running as root and there is no postgres or nobody user")

    def start(self) -> PostgresCluster:
        # Not under pytest's tmp_path: its folders are private to root, and the server runs as
        # another user when the tests run as root.
        self.root = Path(tempfile.mkdtemp(prefix="geosense-pg-"))
        owner = self._as_owner()
        if owner:
            os.chown(self.root, owner["user"], owner["group"])
        data = self.root / "data"
        subprocess.run(
            [
                self.bindir / "initdb",
                "-D",
                data,
                "-U",
                ROLE,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            cwd=self.root,
            capture_output=True,
            check=True,
            **owner,
        )
        for _ in range(3):
            self.port = free_port()
            log = (self.root / "postgres.log").open("ab")
            self.process = subprocess.Popen(
                [
                    self.bindir / "postgres",
                    "-D",
                    data,
                    "-p",
                    str(self.port),
                    "-k",
                    self.root,
                    "-c",
                    "listen_addresses=127.0.0.1",
                    # A throwaway cluster: durability buys nothing here.
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                **owner,
            )
            if self._ready():
                break
            stop(self.process)
        else:
            raise RuntimeError(f"PostgreSQL did not start:\n{self.log()[-4000:]}")
        self.sql(f"CREATE DATABASE {DATABASE}", database="postgres")
        # PostGIS is not a trusted extension: the superuser creates it, as a deployment does.
        self.sql("CREATE EXTENSION postgis")
        return self

    def _ready(self) -> bool:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                psycopg.connect(self._dsn("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={ROLE} dbname={database}"

    def sql(self, query: str, params: tuple = (), *, database: str = DATABASE) -> list[tuple]:
        """Rows of a statement run in autocommit on the cluster (from the test process)."""
        import psycopg

        with psycopg.connect(self._dsn(database), autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def log(self) -> str:
        path = self.root / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, signal.SIGINT)  # "fast" shutdown: clients are disconnected
        shutil.rmtree(self.root, ignore_errors=True)


# --- Redis -----------------------------------------------------------------------------------


@dataclass
class RedisServer:
    port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process, "redis-server")
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


# --- Daphne ----------------------------------------------------------------------------------


@dataclass
class DaphneProcess:
    name: str
    env: dict[str, str]
    log_path: Path
    port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DaphneProcess:
        for _ in range(3):
            port = self.port or free_port()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    [
                        *SERVE,
                        "--proxy-headers",
                        "-b",
                        "127.0.0.1",
                        "-p",
                        str(port),
                        "geosense.asgi:application",
                    ],
                    cwd=BASE_DIR,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                wait_for_port(port, self.process, f"Daphne {self.name}")
            except RuntimeError:
                if self.port:  # a restart keeps its port: the old socket may linger a moment
                    time.sleep(0.5)
                    continue
                self.port = 0
                continue
            self.port = port
            return self
        raise RuntimeError(f"Daphne {self.name} did not start:\n{self.log()[-4000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process with this signal (SIGKILL: no clean-up of any kind)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


# --- everything together ---------------------------------------------------------------------


@dataclass
class ScaleCluster:
    """PostgreSQL + PostGIS, Redis and N Daphne processes sharing them, on loopback."""

    workdir: Path
    processes: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    postgres: PostgresCluster | None = None
    redis: RedisServer | None = None
    daphnes: list[DaphneProcess] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> ScaleCluster:
        try:
            bindir = postgres_bindir()
            assert bindir is not None, "PostgreSQL is not installed"
            self.postgres = PostgresCluster(bindir=bindir).start()
            self.redis = RedisServer().start()
            self.env = server_env(
                database_url=self.postgres.url,
                extra={"REDIS_URL": self.redis.url, **self.extra_env},
            )
            self.manage("migrate", "--noinput")
            self.manage("seed_demo", "--annotations", str(SEED_ANNOTATIONS), "--seed", str(SEED))
            self.daphnes = [
                DaphneProcess(
                    name="AB"[n] if self.processes <= 2 else str(n),
                    env=self.env,
                    log_path=self.workdir / f"daphne-{n}.log",
                )
                for n in range(self.processes)
            ]
            for daphne in self.daphnes:
                daphne.start()
        except BaseException:
            self.stop()
            raise
        return self

    def manage(self, *args: str) -> str:
        return manage(*args, env=self.env)

    def shell(self, code: str) -> str:
        """Run Python with Django set up against the cluster's database; returns its output."""
        return self.manage("shell", "--no-imports", "-c", code)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        assert self.postgres is not None
        return self.postgres.sql(query, params)

    def logs(self) -> str:
        return "\n".join(f"--- Daphne {d.name}\n{d.log()[-3000:]}" for d in self.daphnes)

    def stop(self) -> None:
        for daphne in self.daphnes:  # all at once: each may take a moment to close
            if daphne.alive:
                daphne.process.terminate()
        for daphne in self.daphnes:
            daphne.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()


# --- nginx -----------------------------------------------------------------------------------

LOCATIONS = BASE_DIR / "deploy" / "nginx" / "geosense-locations.conf"
DEPLOYED_STATIC = "/srv/geosense/staticfiles/"

NGINX_MAIN = """\
{user}pid {root}/nginx.pid;
error_log {root}/error.log warn;
daemon off;
events {{}}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream geosense {{
        least_conn;
{servers}
        keepalive 32;
    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        "" "";
    }}
    server {{
        listen 127.0.0.1:{port};
        include {root}/geosense-locations.conf;
    }}
}}
"""


@dataclass
class NginxProxy:
    """nginx on a free loopback port in front of `upstreams`, with the deployed locations file
    (only the static folder's path differs: `static_root`)."""

    upstreams: list[int]
    static_root: Path
    port: int = 0
    root: Path = field(init=False)
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NginxProxy:
        # World-readable: nginx's workers read the static files and run as another user.
        self.root = Path(tempfile.mkdtemp(prefix="geosense-nginx-"))
        self.root.chmod(0o755)
        locations = LOCATIONS.read_text()
        assert DEPLOYED_STATIC in locations
        (self.root / "geosense-locations.conf").write_text(
            locations.replace(DEPLOYED_STATIC, f"{self.static_root}/")
        )
        for _ in range(3):
            self.port = free_port()
            (self.root / "nginx.conf").write_text(
                NGINX_MAIN.format(
                    user="user root;\n" if os.geteuid() == 0 else "",
                    root=self.root,
                    port=self.port,
                    servers="\n".join(f"        server 127.0.0.1:{p};" for p in self.upstreams),
                )
            )
            self.process = subprocess.Popen(
                [nginx_binary(), "-p", self.root, "-c", self.root / "nginx.conf"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            try:
                wait_for_port(self.port, self.process, "nginx")
                return self
            except RuntimeError:
                continue
        raise RuntimeError(f"nginx did not start:\n{self.log()}")

    def log(self) -> str:
        path = self.root / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process, signal.SIGQUIT)  # graceful: workers finish their requests
        shutil.rmtree(self.root, ignore_errors=True)
