"""The first ten minutes, on a fresh clone with an empty environment (marker `clone`).

The checkout's files (what a clone of it holds: tracked and new, never ignored ones such as
`.venv`, `.env` or `db.sqlite3`) are copied into a temporary folder, and there `make run`
starts in the background with none of the project's variables set. Then the habits of every
Django user must work with nothing exported: `manage.py api_token demo`, `createsuperuser
--noinput` with Django's documented variables, the admin login `make run` printed. A second
`make run` changes nothing; without `.env`, DEBUG off without a SECRET_KEY is refused.

The package caches are the developer's (pip's and uv's defaults under $HOME, or the
`PIP_CACHE_DIR` / `UV_CACHE_DIR` set), so only the first run on a machine downloads.
`-m "not clone"` leaves it out; CI runs it.
"""

from __future__ import annotations

import http.cookiejar
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dotenv import dotenv_values

from tests.setup.fresh_clone import MakeRun, checkout_copy, clean_environment

pytestmark = pytest.mark.clone

SERVE_TIMEOUT = 600.0  # an empty package cache downloads everything once


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    folder = tmp_path / "geosense"
    checkout_copy(folder)
    return folder


@pytest.fixture
def make_run(clone: Path, tmp_path: Path) -> Iterator[Callable[[], MakeRun]]:
    started: list[MakeRun] = []

    def start() -> MakeRun:
        run = MakeRun.start(clone, tmp_path / f"make-run-{len(started) + 1}.log")
        started.append(run)
        run.wait_served(SERVE_TIMEOUT)
        return run

    yield start
    for run in started:
        run.stop()


def manage(clone: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "manage.py", *args],
        cwd=clone,
        env=clean_environment(**extra_env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def admin_login(base_url: str, username: str, password: str) -> str:
    """Log in through the admin's own form; returns the page it lands on."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(base_url + "admin/login/?next=/admin/", timeout=10) as page:
        form = page.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token,
            "username": username,
            "password": password,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        base_url + "admin/login/?next=/admin/", data=body, headers={"Referer": base_url}
    )
    with opener.open(request, timeout=10) as page:
        return page.read().decode()


def test_every_django_habit_works_on_a_fresh_clone(clone, make_run):
    run = make_run()

    # .env was written on the first run: local, private, and what the printed login says.
    env_file = clone / ".env"
    values = dotenv_values(env_file)
    assert values["DEBUG"] == "1"
    assert len(values["SECRET_KEY"]) >= 50
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    output = run.output()
    assert "log in as demo / demo" in output
    admin_line = (
        f"The admin is at {run.url}admin/: log in as admin / {values['GEOSENSE_ADMIN_PASSWORD']}"
    )
    assert admin_line in output
    assert "Site administration" in admin_login(run.url, "admin", values["GEOSENSE_ADMIN_PASSWORD"])

    # The commands every Django user types, with nothing exported.
    token = manage(clone, "api_token", "demo")
    assert token.returncode == 0, token.stderr
    assert re.fullmatch(r"gs_\S+\n", token.stdout)
    api = urllib.request.Request(
        run.url + "api/sessions", headers={"Authorization": f"Bearer {token.stdout.strip()}"}
    )
    with urllib.request.urlopen(api, timeout=10) as answer:
        assert answer.status == 200

    superuser = manage(
        clone,
        "createsuperuser",
        "--noinput",
        DJANGO_SUPERUSER_USERNAME="ops",
        DJANGO_SUPERUSER_EMAIL="ops@example.org",
        DJANGO_SUPERUSER_PASSWORD="a-long-ops-password",
    )
    assert superuser.returncode == 0, superuser.stderr
    assert "Superuser created successfully." in superuser.stdout
    assert "Site administration" in admin_login(run.url, "ops", "a-long-ops-password")

    # A second `make run` changes nothing and prints the same login.
    run.stop()
    before = env_file.read_bytes()
    again = make_run()
    assert env_file.read_bytes() == before
    assert admin_line.replace(run.url, again.url) in again.output()
    again.stop()

    # Production stays strict: no .env and no SECRET_KEY, DEBUG off is refused.
    env_file.rename(clone / "local.env.saved")
    for debug in ({"DEBUG": "0"}, {}):
        refused = manage(clone, "check", **debug)
        assert refused.returncode != 0
        assert "SECRET_KEY must be set when DEBUG is off." in refused.stderr
