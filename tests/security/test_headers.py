"""Issue 12, item 7: a strict Content-Security-Policy on every answer, no inline script, and
deployment settings that `manage.py check --deploy` finds nothing to say about."""

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

from geosense.headers import SecurityHeadersMiddleware
from tests.security.live import http

ROOT = Path(__file__).resolve().parents[2]

# The production environment the README and docs/deploy.md document.
PRODUCTION_ENV = {
    "DEBUG": "0",
    "SECRET_KEY": "k7#Qz9!vR2@xW5$mN8^bT4&hJ1*pL6(dF3)sG0_yC-uE+aV=oI|nK~eZ{jX}qB",
    "ALLOWED_HOSTS": "geosense.example",
    "CSRF_TRUSTED_ORIGINS": "https://geosense.example",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto,https",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
}


def _policy(header: str) -> dict[str, list[str]]:
    return {
        name: sources
        for name, *sources in (part.split() for part in header.split(";") if part.strip())
    }


def test_a_page_carries_a_strict_policy(db):
    response = Client().get("/accounts/login/")
    # Django's test client bypasses the ASGI layer: the header is checked live below.
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY"


def test_every_live_answer_static_files_included_carries_the_policy(daphne_server):
    for path in ("/accounts/login/", "/static/geosense/app.css", "/api/sessions", "/nowhere"):
        answer = http(daphne_server, "GET", path)
        policy = _policy(answer.headers["content-security-policy"])
        assert policy["script-src"] == ["'self'"], path
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in answer.headers["content-security-policy"]
        assert "'unsafe-eval'" not in answer.headers["content-security-policy"]
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_no_template_holds_an_inline_script_or_event_handler():
    found = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        text = path.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            if "src=" not in tag:
                found.append(f"{path.name}: {tag}")
        found += [f"{path.name}: {m}" for m in re.findall(r"\son[a-z]+\s*=", text)]
        found += [f"{path.name}: {m}" for m in re.findall(r"javascript:", text)]
    assert not found, found


def test_a_tile_host_is_added_to_the_policy():
    env = {"DEBUG": "1", "GEOSENSE_MAP_TILE_URL": "https://tiles.example/{z}/{x}/{y}.png"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json; from django.conf import settings as s; print(json.dumps(s.GEOSENSE_CSP))",
        ],
        cwd=ROOT,
        env={**_base_env(), **env, "DJANGO_SETTINGS_MODULE": "geosense.settings"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    policy = json.loads(out)
    assert policy["img-src"][-1] == policy["connect-src"][-1] == "https://tiles.example"


def _base_env() -> dict[str, str]:
    import os

    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "SYSTEMROOT", "TMPDIR")
    return {k: v for k, v in os.environ.items() if k in keep}


@pytest.mark.parametrize("missing", [None, "SECURE_HSTS_SECONDS", "SESSION_COOKIE_SECURE"])
def test_check_deploy_is_clean_with_the_documented_production_variables(tmp_path, missing):
    env = {**_base_env(), **PRODUCTION_ENV, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    if missing:
        del env[missing]
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if missing is None:
        assert done.returncode == 0, done.stderr
        assert "System check identified no issues" in done.stdout
    else:
        assert done.returncode != 0  # the check notices what is missing


def test_the_headers_are_added_at_the_start_and_a_body_message_passes_as_it_is():
    """The policy is added to the response's start only (the app's own header kept, ours not
    doubled); each body message (an SSE stream's every chunk) goes on as the same object, its
    one Python call the wrapper's own."""
    sent: list = []
    calls: list[str] = []
    body = {"type": "http.response.body", "body": b"event: x\n\n", "more_body": True}

    async def app(scope, receive, send):
        start_headers = [(b"X-Content-Type-Options", b"nosniff"), (b"x-a", b"1")]
        await send({"type": "http.response.start", "status": 200, "headers": start_headers})

        def count(frame, event, arg):
            if event == "call":
                calls.append(frame.f_code.co_name)

        sys.setprofile(count)
        try:
            await send(body)
        finally:
            sys.setprofile(None)

    async def send(message):
        sent.append(message)

    asyncio.run(SecurityHeadersMiddleware(app)({"type": "http"}, None, send))

    names = [name.lower() for name, _ in sent[0]["headers"]]
    assert names == [b"x-content-type-options", b"x-a", b"content-security-policy"]
    assert sent[1] is body
    assert calls == ["send_with_headers", "send"]
