"""What one model step costs to build from the stored transcript, by session length.

    .venv/bin/python bench/history.py [--runs 30]

A temporary SQLite database holds sessions of 100, 1,000 and 4,000 messages (turns of four: a
question, a tool call, its result of about 2 KB, the answer). Each run builds the history one
step sends and serialises it as the request body would be (`json.dumps`), timed together: on
a checkout before issue 19 item 5 that is `selectors.llm_history` (the whole transcript), after
it `chat.history.history_window` with the default budget (GEOSENSE_LLM_CONTEXT_TOKENS). Prints
the median and p90 wall time, the median CPU time and the messages sent, per length.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_db = tempfile.NamedTemporaryFile(suffix=".sqlite3", delete=False)
os.environ["DATABASE_URL"] = f"sqlite:///{_db.name}"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "geosense.settings")
os.environ.setdefault("DEBUG", "1")
os.environ["GEOSENSE_ENV_FILE"] = ""

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from chat.models import ChatSession, Message  # noqa: E402

LENGTHS = (100, 1_000, 4_000)
RESULT = json.dumps({"ids": list(range(300)), "note": "x" * 600})


def session_make(user, messages: int) -> ChatSession:
    session = ChatSession.objects.create(user=user)
    rows = []
    for turn in range(1, messages // 4 + 1):
        call = {"id": f"call-{turn}", "name": "measure", "arguments": '{"id": 1}'}
        rows += [
            Message(session=session, turn=turn, role="user", content=f"question {turn} " * 8),
            Message(session=session, turn=turn, role="assistant", tool_calls=[call]),
            Message(
                session=session,
                turn=turn,
                role="tool",
                content=RESULT,
                tool_call_id=call["id"],
                tool_name="measure",
            ),
            Message(session=session, turn=turn, role="assistant", content="an answer " * 30),
        ]
    Message.objects.bulk_create(rows)
    return session


def builder():
    """The step's history as this checkout builds it."""
    try:
        from chat.agents.prompts import system_prompt
        from chat.history import history_budget, history_window
        from tools.registry import backend_tools
    except ImportError:
        from chat.selectors import llm_history

        return "llm_history (whole transcript)", lambda sid: llm_history(session_id=sid)
    specs = [t.openai_spec() for t in backend_tools()]
    budget = history_budget(system=system_prompt(overview={}), tools=specs)
    return (
        f"history_window (budget {budget} tokens)",
        lambda sid: history_window(session_id=sid, budget=budget, images=True).messages,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(username="bench")
    name, build = builder()
    print(f"{name}, {args.runs} runs each")
    for length in LENGTHS:
        session = session_make(user, length)
        build(session.pk)  # warm-up
        walls, cpus, sent = [], [], 0
        for _ in range(args.runs):
            wall, cpu = time.perf_counter(), time.process_time()
            messages = build(session.pk)
            json.dumps({"messages": messages})
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            sent = len(messages)
        walls.sort()
        print(
            f"{length:>5} messages: wall median {statistics.median(walls) * 1000:7.2f} ms, "
            f"p90 {walls[int(0.9 * (len(walls) - 1))] * 1000:7.2f} ms, "
            f"CPU median {statistics.median(cpus) * 1000:7.2f} ms, {sent} messages sent"
        )
    os.unlink(_db.name)


if __name__ == "__main__":
    main()
