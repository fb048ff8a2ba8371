"""Debian's nginx with the repository's deploy/nginx files in front of both Daphne processes:
the site files pass `nginx -t`, a turn streams through it event by event, a socket upgrades
through it and serves a client tool, static files come from nginx itself, and requests reach
both processes."""

import asyncio
import datetime
import http.client
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.browser.daphne_server import manage
from tests.client_tools import LOCATION
from tests.fakes.fake_openai import Pause, Text
from tests.scale.client import is_invoke, tab
from tests.scale.cluster import BASE_DIR, NginxProxy, ScaleCluster, nginx_binary

DEPLOY_NGINX = BASE_DIR / "deploy" / "nginx"
STALL = 2.0


@pytest.fixture(scope="module")
def proxy(scale_cluster: ScaleCluster, tmp_path_factory) -> Iterator[NginxProxy]:
    static_root = tmp_path_factory.mktemp("static")
    manage(
        "collectstatic",
        "--noinput",
        "-v",
        "0",
        env={**scale_cluster.env, "STATIC_ROOT": str(static_root)},
    )
    proxy = NginxProxy(upstreams=[d.port for d in scale_cluster.daphnes], static_root=static_root)
    try:
        yield proxy.start()
    finally:
        proxy.stop()


# --- the files as deployed -------------------------------------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "geosense.example.org")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (folder / "fullchain.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "privkey.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return folder / "fullchain.pem", folder / "privkey.pem"


@pytest.mark.parametrize("site", ["geosense.conf", "compose.conf"])
def test_the_site_files_pass_nginx_t_in_debians_configuration(site, tmp_path):
    """A copy of /etc/nginx with the site enabled and the locations in snippets/, as
    docs/deploy.md installs them; only the certificate paths (and compose's host name, which
    only Docker's DNS knows) point elsewhere."""
    etc = tmp_path / "nginx"
    shutil.copytree(
        "/etc/nginx", etc, symlinks=False, ignore=shutil.ignore_patterns("sites-enabled")
    )
    (etc / "sites-enabled").mkdir()
    (etc / "snippets").mkdir(exist_ok=True)
    shutil.copy(DEPLOY_NGINX / "geosense-locations.conf", etc / "snippets")
    cert, key = self_signed(tmp_path)
    text = (DEPLOY_NGINX / site).read_text()
    text = text.replace("/etc/letsencrypt/live/geosense.example.org/fullchain.pem", str(cert))
    text = text.replace("/etc/letsencrypt/live/geosense.example.org/privkey.pem", str(key))
    text = text.replace("server web:8000;", "server 127.0.0.1:8000;")
    text = text.replace("/etc/nginx/", f"{etc}/")
    (etc / "sites-enabled" / site).write_text(text)
    main = (etc / "nginx.conf").read_text().replace("/etc/nginx/", f"{etc}/")
    main = re.sub(r"(?m)^pid .*;$", f"pid {tmp_path}/nginx.pid;", main)
    (etc / "nginx.conf").write_text(main)

    checked = subprocess.run(
        [nginx_binary(), "-t", "-c", etc / "nginx.conf", "-g", f"error_log {tmp_path}/e.log;"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


# --- traffic through the proxy ---------------------------------------------------------------


def stream_with_times(url: str, token: str, path: str, body: dict) -> list[tuple[float, str]]:
    """POST and read the event stream line by line: (seconds since the request, event name)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    start = time.monotonic()
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept-Encoding": "gzip, deflate, br",  # as a browser asks
        },
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Encoding") is None
    events = []
    while line := response.readline():
        if line.startswith(b"event: "):
            events.append((time.monotonic() - start, line[7:].decode().strip()))
    conn.close()
    return events


def test_a_turn_streams_through_nginx_event_by_event(cluster, proxy, scale_api, fake_llm):
    session = scale_api.session_create(proxy.url)
    fake_llm.reply(Text("Looking"), Pause(STALL), Text(" done."))

    events = stream_with_times(
        proxy.url, scale_api.token, f"/api/sessions/{session}/message/stream", {"text": "hi"}
    )

    first_delta = next(t for t, name in events if name == "text_delta")
    end = next(t for t, name in events if name == "turn_end")
    assert end - first_delta >= STALL * 0.8


@pytest.mark.asyncio
async def test_a_socket_upgrades_through_nginx_and_serves_a_client_tool(
    cluster, proxy, scale_api, fake_llm
):
    session = await asyncio.to_thread(scale_api.session_create, proxy.url)
    fake_llm.reply_tool_calls([("px1", "location_get", {})])
    fake_llm.reply_text("Through the proxy.")
    async with tab(proxy.url, scale_api, session, [LOCATION]) as holder:
        turn = asyncio.create_task(asyncio.to_thread(scale_api.say, proxy.url, session, "where?"))
        invoke = (await holder.until(is_invoke))[-1]
        await holder.answer(invoke, {"status": "DECLINED", "message": "No."})
        out = await turn
        assert (await holder.until(lambda f: f.get("event") == "turn_end"))[-1]["type"] == "event"

    assert out.message["content"] == "Through the proxy."


def test_static_files_come_from_nginx_not_from_daphne(cluster, proxy):
    with urllib.request.urlopen(cluster.daphnes[0].url + "/healthz", timeout=10) as response:
        apps_policy = response.headers["Content-Security-Policy"]
    with urllib.request.urlopen(proxy.url + "/static/geosense/app.css", timeout=10) as response:
        assert response.status == 200
        assert response.headers.get_content_type() == "text/css"
        assert response.headers["Content-Security-Policy"] == apps_policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.read() == (BASE_DIR / "static/geosense/app.css").read_bytes()
    with pytest.raises(urllib.error.HTTPError) as direct:  # DEBUG is off: Daphne serves none
        urllib.request.urlopen(cluster.daphnes[0].url + "/static/geosense/app.css", timeout=10)
    assert direct.value.code == 404


def test_requests_through_nginx_reach_both_processes(cluster, proxy):
    before = [d.log().count("GET /healthz") for d in cluster.daphnes]
    for _ in range(6):
        with urllib.request.urlopen(proxy.url + "/healthz", timeout=10) as response:
            assert json.loads(response.read())["status"] == "ok"
    time.sleep(0.2)  # the access log line is written after the response
    after = [d.log().count("GET /healthz") for d in cluster.daphnes]

    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
