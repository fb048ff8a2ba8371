"""The local `.env` file: `make run` writes it on its first run, the settings read it.

Every `manage.py` command, Daphne, the bench scripts (anything that loads `geosense.settings`)
reads the file into the environment before the settings do, so nothing needs exporting on a
developer's machine. A variable already in the real environment always wins over the file.

`GEOSENSE_ENV_FILE` names another file; set to nothing, no file is read. The test suite sets it
so that a developer's own `.env` (a model server, a database) never reaches a test.

This module imports nothing of Django's settings: `make run` calls it before any exist.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from dotenv import dotenv_values, load_dotenv

BASE_DIR = Path(__file__).resolve().parent.parent
ENV_FILE_VARIABLE = "GEOSENSE_ENV_FILE"

_HEADER = """\
# GeoSense's local settings, written by `make run` on its first run. Git-ignored: never commit it.
# Real environment variables win over this file; .env.example lists every variable.
"""
_ADMIN_COMMENT = "# The local superuser that `make run` keeps for /admin/ (development only).\n"


def env_file_path() -> Path | None:
    """The file to read: `.env` at the repository root, `$GEOSENSE_ENV_FILE`, or None."""
    named = os.environ.get(ENV_FILE_VARIABLE)
    if named is None:
        return BASE_DIR / ".env"
    if not named.strip():
        return None
    return BASE_DIR / Path(named).expanduser()  # an absolute path stays as it is


def env_file_load() -> Path | None:
    """Read the env file into `os.environ` without replacing any variable already set.

    Values are taken literally (no `${VAR}` expansion). Returns the file read, if any.
    """
    path = env_file_path()
    if path is None or not path.is_file():
        return None
    load_dotenv(path, override=False, interpolate=False, encoding="utf-8")
    return path


def local_env_file_ensure(path: Path | None = None) -> str:
    """Write the local development settings if there is no env file yet.

    A new file gets `DEBUG=1`, a freshly generated `SECRET_KEY`, the SQLite database and the
    local superuser's login; an existing file only gains the superuser's login if it lacks it
    (files from before `make run` kept one). No value in an existing file is ever changed.
    Returns what was done, for `make run` to print, or "" when nothing was.
    """
    path = path or env_file_path()
    if path is None:
        return f"{ENV_FILE_VARIABLE} is empty: no env file written."
    admin = {
        "GEOSENSE_ADMIN_USERNAME": "admin",
        "GEOSENSE_ADMIN_PASSWORD": secrets.token_urlsafe(18),
    }
    if not path.exists():
        settings = {
            "DEBUG": "1",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "DATABASE_URL": "sqlite:///db.sqlite3",
        }
        lines = [f"{name}={value}" for name, value in settings.items()]
        text = _HEADER + "\n".join(lines) + "\n" + _ADMIN_COMMENT
        text += "".join(f"{name}={value}\n" for name, value in admin.items())
        try:
            # Exclusive and private: it holds a secret key and a password.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another `make run` wrote it first
            return ""
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        return (
            f"Wrote {_shown(path)}: DEBUG=1, a new SECRET_KEY, the SQLite database and a local "
            "superuser's password (real environment variables win over it)."
        )
    present = dotenv_values(path, interpolate=False)
    missing = {name: value for name, value in admin.items() if name not in present}
    if not missing:
        return ""
    with path.open("a", encoding="utf-8") as file:
        if path.read_bytes()[-1:] not in (b"", b"\n"):
            file.write("\n")
        file.write(_ADMIN_COMMENT)
        file.write("".join(f"{name}={value}\n" for name, value in missing.items()))
    return f"Added the local superuser's login to {_shown(path)}."


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(BASE_DIR))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    done = local_env_file_ensure()
    if done:
        print(done, file=sys.stderr)
