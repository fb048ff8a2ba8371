"""A fresh clone as a new user meets it: the project's files in a new folder, a shell with none
of the project's variables, and `make run` in the background until it serves the login page.

Used by `test_fresh_clone.py` and by `bench/cold_run.py` (which times it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.browser.daphne_server import free_port

BASE_DIR = Path(__file__).resolve().parents[2]
_NEVER_INHERITED = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"}


def project_variables() -> set[str]:
    """Every variable `.env.example` documents: the project's, never a new user's."""
    text = (BASE_DIR / ".env.example").read_text()
    return set(re.findall(r"(?m)^#\s*([A-Z][A-Z0-9_]*)=", text))


def clean_environment(**extra: str) -> dict[str, str]:
    """This machine's environment (TLS roots, proxies, pip's index, caches) without anything of
    the project's (its variables, `GEOSENSE_*`, `DJANGO_*`) or of the caller's venv."""
    unwanted = project_variables() | _NEVER_INHERITED
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in unwanted and not name.startswith(("GEOSENSE_", "DJANGO_"))
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env.update(extra)
    return env


def checkout_copy(dest: Path) -> None:
    """Copy what a clone of this checkout would hold, with the work tree's changes: tracked
    and new files, never ignored ones (`.venv`, `.env`, `db.sqlite3`)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=BASE_DIR,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = BASE_DIR / name
        if not source.exists() and not source.is_symlink():  # deleted, not yet committed
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


@dataclass
class MakeRun:
    """`make run` in its own process group, its output in `log`."""

    folder: Path
    log: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None
    port: int = 0
    started: float = 0.0
    # (seconds since the start, line) for each line of output, as `wait_served` saw it come.
    timeline: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def start(cls, folder: Path, log: Path, env: dict[str, str] | None = None) -> MakeRun:
        run = cls(folder, log, clean_environment() if env is None else env)
        run.started = time.monotonic()
        run._spawn()
        return run

    def _spawn(self) -> None:
        # A free port now may be another process's by the time Daphne binds it, a minute
        # later on a cold run: `wait_served` then starts again on another one.
        self.port = free_port()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["make", "run", f"PORT={self.port}"],
                cwd=self.folder,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_served(self, timeout: float) -> None:
        """Return once the login page answers 200; raise if `make run` stops or times out."""
        deadline = time.monotonic() + timeout
        retries = 3
        while time.monotonic() < deadline:
            self._read_timeline()
            if self.process.poll() is not None:
                taken = (
                    f"Couldn't listen on 127.0.0.1:{self.port}: [Errno 98] Address already in use"
                )
                if taken in self.output() and retries:
                    retries -= 1
                    self._spawn()
                    continue
                raise RuntimeError(f"make run exited {self.process.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "accounts/login/", timeout=2) as page:
                    if page.status == 200:
                        self._read_timeline()
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"make run served nothing in {timeout:.0f} s:\n{self.output()}")

    def _read_timeline(self) -> None:
        lines = self.output().splitlines()
        now = time.monotonic() - self.started
        self.timeline.extend((now, line) for line in lines[len(self.timeline) :])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
