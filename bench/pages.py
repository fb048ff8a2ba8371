"""Pages of a long session, before and after, side by side in one run (issue 15, item 9).

A session of 1,000 turns is written straight into a fresh SQLite database (each turn a user
message, an assistant message that calls a tool, the tool's result and an answer with a
highlight, Markdown, references and values; every tenth turn asks a question that the next
one answers), then each request is timed through Django's test client (the server's whole
work: middleware, queries, rendering; no network):

- `page`: `GET /chat/<id>/`, the chat page of the session;
- `live update`: the partial the page fetches after a live turn ends (the last turn);
- `api`: `GET /api/sessions/<id>` without a cursor (every message, the contract's shape);
- `api page`: the same with `?limit=50` (only a tree that knows the cursor pages it);
- `older page`: the turns before the page's first (only a tree that paginates has it).

Run by hand from the repository root, naming the trees to compare (a worktree of an older
commit for "before"):

    .venv/bin/python bench/pages.py /tmp/before-i15p .

Each tree is measured in its own process, on its own database, with this tree's venv. Prints
the median and p90 of each request's wall time over RUNS runs after one warm-up, the median of
its CPU time (the work itself, without waiting for a CPU on a busy machine), then the ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TURNS = 1_000
RUNS = 15
HERE = Path(__file__).resolve()


def _measure(tree: Path) -> dict[str, list[float]]:
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    db = Path(tempfile.mkdtemp(prefix="bench-pages-")) / "db.sqlite3"
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "geosense.settings"
    os.environ["DEBUG"] = "1"
    os.environ["GEOSENSE_ENV_FILE"] = ""
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    session, last_turn = _session_make()

    from django.test import Client

    client = Client()
    client.force_login(session.user)
    base = f"/chat/{session.pk}/"
    requests = {
        "page": base,
        "live update": f"{base}turns/{last_turn}/",
        "api": f"/api/sessions/{session.pk}",
        "api page": f"/api/sessions/{session.pk}?limit=50",
        "older page": f"{base}turns/?before={last_turn - 20}",
    }
    times: dict[str, list[float]] = {}
    for name, url in requests.items():
        if client.get(url).status_code != 200:  # warm-up; an unknown page is left out
            continue
        if name == "api page" and "next_cursor" not in client.get(url).json():
            continue  # the tree ignores the cursor: it would time the whole transcript again
        runs, cpu = [], []
        for _ in range(RUNS):
            start, start_cpu = time.perf_counter(), time.process_time()
            response = client.get(url)
            runs.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        times[name] = runs
        times[f"{name} cpu"] = cpu
    return times


def _session_make():
    from django.contrib.auth import get_user_model

    from chat.models import Artifact, ChatSession, Message

    user = get_user_model().objects.create_user("bench", password="bench")
    session = ChatSession.objects.create(user=user, title="A long conversation")
    messages, artifacts = [], []
    for turn in range(1, TURNS + 1):
        if turn % 10 == 1 and turn > 1:
            user_text = (
                '<answer question="q-view" question-option-index="1" '
                'asked-in="{asker}">The big ones</answer>'
            )
        else:
            user_text = f"Which trees are within 20 m of a house? ({turn})"
        messages.append(Message(session=session, turn=turn, role="user", content=user_text))
        call = {"id": f"call-{turn}", "name": "spatial_relation", "arguments": "{}"}
        messages.append(
            Message(session=session, turn=turn, role="assistant", content="", tool_calls=[call])
        )
        messages.append(
            Message(
                session=session,
                turn=turn,
                role="tool",
                tool_call_id=call["id"],
                tool_name=call["name"],
                content=json.dumps({"artifact_id": f"artifact-{turn}", "count": 12}),
            )
        )
        ids = list(range(turn, turn + 12))
        artifacts.append(
            Artifact(
                session=session,
                artifact_id=f"artifact-{turn}",
                kind="selection",
                data={"ids": ids, "areas": [10.5 * i for i in ids]},
                origin="tool:spatial_relation",
            )
        )
        answer = (
            f'I found **12 trees** within <distance value="20" /> of a house.\n'
            f'<tool type="highlight" data="${{artifact-{turn}}}">Show the trees</tool>\n'
            f'The largest is <ref id="${{artifact-{turn}.ids.0}}" /> with '
            f'<area id="${{artifact-{turn}.areas.0}}" />; the others are:\n\n'
            + "".join(f'- <ref id="{i}" /> at <distance value="{i % 20}" />\n' for i in ids[1:])
        )
        if turn % 10 == 0:
            answer += (
                '\n<question id="q-view"><header>Which ones next?</header>'
                '<option message="The small ones">Small</option>'
                '<option message="The big ones">Big</option></question>'
            )
        messages.append(Message(session=session, turn=turn, role="assistant", content=answer))
    Message.objects.bulk_create(messages)
    Artifact.objects.bulk_create(artifacts)
    # Answers name the message that asked (the page's `asked-in`).
    askers = {
        m.turn: m.pk for m in Message.objects.filter(session=session, content__contains="<question")
    }
    for message in Message.objects.filter(session=session, content__contains="{asker}"):
        message.content = message.content.replace("{asker}", str(askers[message.turn - 1]))
        message.save(update_fields=["content"])
    session.turn_count = TURNS
    session.save(update_fields=["turn_count"])
    return session, TURNS


def _summary(runs: list[float]) -> tuple[float, float]:
    ordered = sorted(runs)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def main(trees: list[str]) -> None:
    results = {}
    for tree in trees:
        out = subprocess.run(
            [sys.executable, str(HERE), "--measure", str(Path(tree).resolve())],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[tree] = json.loads(out.strip().splitlines()[-1])
    names = ["page", "live update", "api", "api page", "older page"]
    print(f"{TURNS:,} turns, {RUNS} runs each; milliseconds: wall median / p90, CPU median")
    print(f"{'request':<14}" + "".join(f"{tree:>30}" for tree in trees))
    for name in names:
        cells = []
        for tree in trees:
            runs = results[tree].get(name)
            cpu = results[tree].get(f"{name} cpu")
            cells.append(
                "—"
                if runs is None
                else "{:.1f} / {:.1f}, {:.1f}".format(*_summary(runs), statistics.median(cpu))
            )
        print(f"{name:<14}" + "".join(f"{cell:>30}" for cell in cells))
    if len(trees) == 2:
        before, after = (results[tree] for tree in trees)
        print("ratios (before median / after median, wall):")
        for name, other in [
            ("page", "page"),
            ("live update", "live update"),
            ("api", "api"),
            ("api", "api page"),
        ]:
            if name in before and other in after:
                ratio = _summary(before[name])[0] / _summary(after[other])[0]
                print(f"  {name} → {other}: {ratio:.1f}x")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(_measure(Path(sys.argv[2]))))
    else:
        main(sys.argv[1:] or ["."])
