"""A Daphne process that dies mid-turn: its session takes a new turn as soon as the process is
back (not at the end of the 120 s lease), and the text the user saw stays, cut off.

Real Daphne processes on a SQLite file, the openai agent against the fake model on loopback;
`kill -9` leaves no clean-up of any kind, SIGTERM releases the process's claims on its way out
(chat/processes.py).
"""

import http.client
import json
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.daphne_server import (
    DaphneServer,
    copy_database,
    seeded_database,
    start_server,
)
from tests.chat.helpers import history_is_valid
from tests.fakes.fake_openai import Pause, Text

SETUP = """
from django.contrib.auth import get_user_model
from chat.models import ChatSession
from geosense.accounts.services import api_token_create
user = get_user_model().objects.create_user("crash")
print(api_token_create(user=user), ChatSession.objects.create(user=user).pk)
"""
SHOWN = "Counting the houses"


def post(server: DaphneServer, path: str, body: dict, token: str) -> http.client.HTTPResponse:
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request(
        "POST",
        path,
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    return conn.getresponse()


def until(predicate, *, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def stored(db: Path, session: str) -> list[tuple]:
    with closing(sqlite3.connect(db, timeout=20)) as conn:
        return conn.execute(
            "SELECT role, content, cut_off FROM chat_message WHERE session_id = ? ORDER BY id",
            (session.replace("-", ""),),
        ).fetchall()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    return seeded_database(tmp_path_factory.mktemp("recovery") / "seeded.sqlite3")


@pytest.fixture
def crashing(tmp_path, seeded, fake_llm):
    """A server mid-turn: the model sent some text, which is stored, then stalls."""
    db = copy_database(seeded, tmp_path / "db.sqlite3")
    env = {
        "GEOSENSE_AGENT": "openai",
        "GEOSENSE_LLM_BASE_URL": fake_llm.base_url,
        "GEOSENSE_LLM_MODEL": "fake-model",
    }
    server = start_server(db_path=db, log_path=tmp_path / "a.log", extra_env=env)
    servers = [server]
    try:
        token, session = server.shell(SETUP).split()[-2:]
        fake_llm.reply(Text(SHOWN, 1), Pause(30))
        response = post(server, f"/api/sessions/{session}/message/stream", {"text": "count"}, token)
        assert response.status == 200
        while b"text_delta" not in response.readline():
            pass
        until(
            lambda: ("assistant", SHOWN, 1) in stored(db, session),
            what="the streamed text is stored while the model stalls",
        )

        def restart() -> DaphneServer:
            servers.append(start_server(db_path=db, log_path=tmp_path / "b.log", extra_env=env))
            return servers[-1]

        yield server, restart, token, session, db
    finally:
        for each in servers:
            each.stop()


def test_after_kill_9_the_restarted_process_takes_the_next_turn_at_once(crashing, fake_llm):
    server, restart, token, session, db = crashing
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=10)

    again = restart()
    fake_llm.reply_text("Three classes.")
    response = post(again, f"/api/sessions/{session}/message/stream", {"text": "count"}, token)
    assert response.status == 200, "the session is still claimed by the killed process"
    assert b"Three classes." in response.read()

    rows = stored(db, session)
    assert rows[:2] == [("user", "count", 0), ("assistant", SHOWN, 1)]
    assert rows[-1] == ("assistant", "Three classes.", 0)
    assert history_is_valid(
        [{"role": r, "content": c} for r, c, _ in rows if r in ("user", "assistant")]
    )


def test_sigterm_releases_the_claims_of_the_process(crashing):
    server, _restart, _token, session, db = crashing
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=20)
    with closing(sqlite3.connect(db, timeout=20)) as conn:
        state = conn.execute(
            "SELECT turn_state FROM chat_chatsession WHERE id = ?", (session.replace("-", ""),)
        ).fetchone()
    assert state == ("idle",)
    assert ("assistant", SHOWN, 1) in stored(db, session)
