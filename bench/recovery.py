"""How soon a session takes a new message after its Daphne process was killed mid-turn.

Issue 15's target: after `kill -9` mid-turn, the session accepts a new message within 5 s of
the restart. Each run: a real Daphne process on a SQLite copy of the demo, the `openai` agent
against the fake model on loopback; a turn streams some text (stored), then the model stalls;
the process gets SIGKILL; a new process is started on the same database and the same message
endpoint is posted until it answers 200 (409 means the dead process's claim still holds).

Timed per run: restart → listening (Daphne and Django starting), listening → the message
accepted (its 200 headers), and restart → accepted (the figure the target is about).

    .venv/bin/python bench/recovery.py --runs 5
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser.daphne_server import (  # noqa: E402
    copy_database,
    seeded_database,
    start_server,
)
from tests.fakes.fake_openai import FakeOpenAI, Pause, Text  # noqa: E402
from tests.multiprocess.test_recovery import SETUP, post  # noqa: E402

MESSAGE = {"text": "count"}


def one_run(seeded: Path, work: Path, fake: FakeOpenAI) -> dict[str, float]:
    """Kill a process mid-turn, restart it, and time until the session takes a message."""
    db = copy_database(seeded, work / "db.sqlite3")
    env = {
        "GEOSENSE_AGENT": "openai",
        "GEOSENSE_LLM_BASE_URL": fake.base_url,
        "GEOSENSE_LLM_MODEL": "fake-model",
    }
    first = start_server(db_path=db, log_path=work / "a.log", extra_env=env)
    try:
        token, session = first.shell(SETUP).split()[-2:]
        path = f"/api/sessions/{session}/message/stream"
        fake.reply(Text("Counting the houses", 1), Pause(30))
        response = post(first, path, MESSAGE, token)
        assert response.status == 200, response.status
        while b"text_delta" not in response.readline():
            pass
        time.sleep(1.5)  # the progressive store has written the text; the heartbeat has run
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
    finally:
        first.stop()

    fake.reset()
    fake.default_text = "Three classes."
    started = time.monotonic()
    second = start_server(db_path=db, log_path=work / "b.log", extra_env=env)
    listening = time.monotonic()
    try:
        url = urlsplit(second.url)
        probe = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        probe.request("GET", "/healthz")
        probe.getresponse().read()
        healthy = time.monotonic()
        refused = 0
        while True:
            answer = post(second, path, MESSAGE, token)
            if answer.status == 200:
                accepted = time.monotonic()
                answer.read()
                break
            answer.read()
            refused += 1
            time.sleep(0.05)
    finally:
        second.stop()
    return {
        "restart_to_listening_s": listening - started,
        "listening_to_accepted_s": accepted - listening,
        "restart_to_accepted_s": accepted - started,
        "listening_to_healthz_s": healthy - listening,
        "refused_first": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    fake = FakeOpenAI().start()
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as folder:
        base = Path(folder)
        seeded = seeded_database(base / "seeded.sqlite3")
        runs = []
        for index in range(args.runs):
            work = base / f"run-{index}"
            work.mkdir()
            runs.append(one_run(seeded, work, fake))
            print(json.dumps(runs[-1]), flush=True)
    fake.stop()
    for key in ("restart_to_listening_s", "listening_to_accepted_s", "restart_to_accepted_s"):
        values = [run[key] for run in runs]
        print(f"{key}: median {statistics.median(values):.3f} s, max {max(values):.3f} s")
    print("answered 409 before accepting:", sum(run["refused_first"] for run in runs), "times")


if __name__ == "__main__":
    main()
