"""geosense/settings.py: provider settings are checked when the app starts, with a clear error."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRINT = "from django.conf import settings as s; print(repr(({},)))"
PROVIDER = (
    "GEOSENSE_LLM_HEADERS, GEOSENSE_LLM_TEMPERATURE, GEOSENSE_LLM_MAX_TOKENS, "
    "GEOSENSE_LLM_FIRST_BYTE_TIMEOUT, GEOSENSE_LLM_TOOL_CHOICE"
)
TIMEOUTS = (
    "GEOSENSE_LLM_CONNECT_TIMEOUT, GEOSENSE_LLM_FIRST_BYTE_TIMEOUT, GEOSENSE_LLM_CHUNK_TIMEOUT"
)


def start(names: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GEOSENSE_", "DJANGO_"))}
    # GEOSENSE_ENV_FILE empty: a developer's own .env never reaches the test.
    environ.update(DJANGO_SETTINGS_MODULE="geosense.settings", DEBUG="1", GEOSENSE_ENV_FILE="")
    environ.update(env)
    values = ", ".join(f"s.{name.strip()}" for name in names.split(","))
    code = "import django; django.setup(); " + PRINT.format(values)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def test_provider_settings_are_read_from_the_environment():
    done = start(
        PROVIDER,
        GEOSENSE_LLM_HEADERS='{"api-key": "k"}',
        GEOSENSE_LLM_TEMPERATURE="0.2",
        GEOSENSE_LLM_MAX_TOKENS="1024",
        GEOSENSE_LLM_TIMEOUT="120",
        GEOSENSE_LLM_TOOL_CHOICE="required",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "({'api-key': 'k'}, 0.2, 1024, 120.0, 'required')"


def test_the_three_model_timeouts_default_to_10_60_and_30_seconds_and_are_read():
    assert start(TIMEOUTS).stdout.strip() == "(10.0, 60.0, 30.0)"
    done = start(
        TIMEOUTS,
        GEOSENSE_LLM_CONNECT_TIMEOUT="3",
        GEOSENSE_LLM_FIRST_BYTE_TIMEOUT="90",
        GEOSENSE_LLM_CHUNK_TIMEOUT="15",
    )
    assert done.stdout.strip() == "(3.0, 90.0, 15.0)", done.stderr


def test_unset_provider_settings_take_their_defaults():
    done = start(PROVIDER)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "({}, None, None, 60.0, None)"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GEOSENSE_LLM_HEADERS": "api-key: k"}, "GEOSENSE_LLM_HEADERS is not valid JSON"),
        ({"GEOSENSE_LLM_HEADERS": '["k"]'}, "GEOSENSE_LLM_HEADERS must be a JSON object"),
        ({"GEOSENSE_LLM_HEADERS": '{"X": 1}'}, "GEOSENSE_LLM_HEADERS must be a JSON object"),
        ({"GEOSENSE_LLM_HEADERS": '{"X": "a\\r\\nEvil: 1"}'}, "must be a JSON object"),
        ({"GEOSENSE_LLM_HEADERS": '{"bad name": "v"}'}, "must be a JSON object"),
        ({"GEOSENSE_LLM_TEMPERATURE": "hot"}, "GEOSENSE_LLM_TEMPERATURE must be a number"),
        ({"GEOSENSE_LLM_TEMPERATURE": "3"}, "must be between 0 and 2"),
        ({"GEOSENSE_LLM_MAX_TOKENS": "0"}, "GEOSENSE_LLM_MAX_TOKENS must be at least 1"),
        ({"GEOSENSE_LLM_MAX_TOKENS": "1.5"}, "GEOSENSE_LLM_MAX_TOKENS must be a whole number"),
        ({"GEOSENSE_LLM_TIMEOUT": "0"}, "GEOSENSE_LLM_TIMEOUT must be at least 1"),
        ({"GEOSENSE_LLM_CHUNK_TIMEOUT": "0"}, "GEOSENSE_LLM_CHUNK_TIMEOUT must be at least 0.1"),
        ({"GEOSENSE_LLM_CONNECT_TIMEOUT": "x"}, "GEOSENSE_LLM_CONNECT_TIMEOUT must be a number"),
        ({"GEOSENSE_LLM_TOOL_CHOICE": "any tool"}, "GEOSENSE_LLM_TOOL_CHOICE must be auto"),
        (
            {"GEOSENSE_LLM_CONTEXT_TOKENS": "512"},
            "GEOSENSE_LLM_CONTEXT_TOKENS must be at least 1024",
        ),
        ({"GEOSENSE_LLM_CONTEXT_TOKENS": "8k"}, "GEOSENSE_LLM_CONTEXT_TOKENS must be a whole"),
        ({"GEOSENSE_CREDITS_PER_1K_TOKENS": "-1"}, "GEOSENSE_CREDITS_PER_1K_TOKENS must be"),
        ({"GEOSENSE_CREDITS_PER_1K_TOKENS": "free"}, "GEOSENSE_CREDITS_PER_1K_TOKENS must be a"),
    ],
)
def test_a_wrong_provider_setting_stops_the_start_with_a_clear_message(env, message):
    done = start("GEOSENSE_LLM_HEADERS", **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and message in done.stderr


MODEL_USE = "GEOSENSE_LLM_VISION, GEOSENSE_LLM_CONTEXT_TOKENS, GEOSENSE_CREDITS_PER_1K_TOKENS"


def test_vision_context_and_token_price_default_to_on_32000_and_free_and_are_read():
    assert start(MODEL_USE).stdout.strip() == "(True, 32000, 0.0)"
    done = start(
        MODEL_USE,
        GEOSENSE_LLM_VISION="0",
        GEOSENSE_LLM_CONTEXT_TOKENS="8192",
        GEOSENSE_CREDITS_PER_1K_TOKENS="2.5",
    )
    assert done.stdout.strip() == "(False, 8192, 2.5)", done.stderr


def test_an_sqlite_file_is_in_wal_mode_and_checkpointed_every_10000_pages(tmp_path):
    """A checkpoint runs on the engine's database thread, in the commit that crosses the mark:
    ten times rarer than SQLite's default, it copies the same hot pages once, not ten times."""
    code = (
        "import django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); "
        "print([c.execute(f'PRAGMA {p}').fetchone()[0] for p in "
        "('journal_mode', 'synchronous', 'wal_autocheckpoint')])"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GEOSENSE_", "DJANGO_"))}
    environ.update(
        DJANGO_SETTINGS_MODULE="geosense.settings",
        GEOSENSE_ENV_FILE="",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['wal', 1, 10000]"  # synchronous 1: NORMAL
