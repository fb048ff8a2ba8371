"""`python -m geosense.serve`: Daphne's command, on uvloop's event loop (geosense/serve.py)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.daphne_server import BASE_DIR, SERVE, manage, server_env, start_server

PROBE = """
import sys
from geosense.serve import event_loop_policy_install
print(event_loop_policy_install())
import daphne.server
print(type(daphne.server.twisted_loop).__module__)
from twisted.internet import reactor
print(reactor._asyncioEventloop is daphne.server.twisted_loop)
try:
    event_loop_policy_install()
except RuntimeError as error:
    print("refused:", error)
"""


def test_daphnes_loop_is_uvloops_when_the_launcher_set_the_policy_first():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    installed, loop_module, reactor_on_it, refused = result.stdout.strip().splitlines()
    assert installed == "True"
    assert loop_module == "uvloop", "Twisted's reactor would run on asyncio's own loop"
    assert reactor_on_it == "True"
    assert refused.startswith("refused: Daphne's loop exists already"), (
        "a policy set after Daphne made its loop would change nothing, silently"
    )


def test_the_tests_and_benches_servers_run_on_uvloop(tmp_path):
    """Every browser, multi-process and scale test starts its servers with `SERVE`, so the
    loop `make run` and the deployment files use is the one the tests exercise (nothing but
    the launcher imports uvloop in a served process: its library mapped is the launcher's)."""
    assert SERVE[1:] == ("-m", "geosense.serve")
    server = start_server(db_path=tmp_path / "db.sqlite3", log_path=tmp_path / "log", extra_env={})
    try:
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    finally:
        server.stop()
    assert "/uvloop/loop." in maps, "the served process never loaded uvloop's loop"


def test_make_run_and_the_deployment_files_serve_through_the_launcher():
    for path in (
        "Makefile",
        "deploy/Dockerfile",
        "deploy/systemd/geosense-daphne@.service",
        "compose.yaml",
    ):
        text = (BASE_DIR / path).read_text()
        assert "geosense.serve" in text, path
        assert "bin/daphne " not in text and '["daphne",' not in text, path


@pytest.mark.asyncio
async def test_the_async_tests_run_on_the_loop_the_server_runs_on():
    """tests/conftest.py's loop factory: the engine's tests on uvloop, as it is served."""
    assert type(asyncio.get_running_loop()).__module__ == "uvloop"


def test_without_uvloop_the_launcher_says_so_and_serves_on_asyncios_loop(tmp_path):
    """A virtualenv not synced since uvloop became a dependency serves as before, and its log
    says why it is slower (review 29-a L2: it fell back without a word)."""
    hidden = tmp_path / "uvloop"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    probe = PROBE.split("try:")[0]  # the install and Daphne's loop, not the refusal
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=BASE_DIR,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{BASE_DIR}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["False", "asyncio.unix_events", "True"]
    assert "uvloop is not installed: serving on asyncio's loop" in result.stderr


def test_a_server_with_debug_off_sends_the_security_headers(tmp_path):
    """With DEBUG off (as deployed, and as the benches serve) Django's handler sets the
    Content-Security-Policy itself instead of a wrapper of `send` (04dc98c): checked on a live
    process, on a page and on an API answer, as the browser tests check it with DEBUG on."""
    import json
    import urllib.error
    import urllib.request

    db = tmp_path / "db.sqlite3"
    manage("migrate", "--noinput", env=server_env(db_path=db))
    server = start_server(
        db_path=db,
        log_path=tmp_path / "log",
        extra_env={"DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1"},
    )
    try:
        with urllib.request.urlopen(f"{server.url}/accounts/login/", timeout=10) as page:
            page_headers = page.headers
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/api/sessions", timeout=10)
        api_headers = refused.value.headers
        api_body = json.loads(refused.value.read())
    finally:
        server.stop()
    assert refused.value.code in (401, 403) and "error" in api_body
    for headers in (page_headers, api_headers):
        csp = headers["Content-Security-Policy"]
        assert csp and "default-src 'self'" in csp and "script-src 'self'" in csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers.get_all("Content-Security-Policy") == [csp]  # set once
