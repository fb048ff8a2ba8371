"""The local `.env`: written once by `make run`, read by the settings, beaten by the real
environment; production without it stays strict."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from dotenv import dotenv_values

from geosense import envfile

BASE_DIR = Path(__file__).resolve().parents[2]


def settings_seen(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Load `geosense.settings` in a new process with exactly `env` (plus PATH and HOME)."""
    code = (
        "import json, geosense.settings as s; print(json.dumps({"
        "'DEBUG': s.DEBUG, 'SECRET_KEY': s.SECRET_KEY, "
        "'DB': s.DATABASES['default']['NAME'], 'AGENT': s.GEOSENSE_AGENT, "
        "'LLM': s.GEOSENSE_LLM_BASE_URL}))"
    )
    base = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=BASE_DIR,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def loaded(env: dict[str, str]) -> dict:
    result = settings_seen(env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_settings_read_the_env_file_with_nothing_exported(tmp_path):
    env_file = tmp_path / "local.env"
    env_file.write_text("DEBUG=1\nSECRET_KEY=from-the-file\nGEOSENSE_LLM_BASE_URL=http://x/v1\n")

    seen = loaded({"GEOSENSE_ENV_FILE": str(env_file)})

    assert seen["DEBUG"] is True
    assert seen["SECRET_KEY"] == "from-the-file"
    assert seen["AGENT"] == "openai"


def test_a_real_environment_variable_wins_over_the_file(tmp_path):
    env_file = tmp_path / "local.env"
    env_file.write_text("DEBUG=1\nSECRET_KEY=from-the-file\nGEOSENSE_LLM_BASE_URL=http://x/v1\n")

    seen = loaded(
        {
            "GEOSENSE_ENV_FILE": str(env_file),
            "DEBUG": "0",
            "SECRET_KEY": "from-the-environment",
            "GEOSENSE_LLM_BASE_URL": "",
        }
    )

    assert seen["DEBUG"] is False
    assert seen["SECRET_KEY"] == "from-the-environment"
    assert seen["LLM"] == ""  # set but empty is still set
    assert seen["AGENT"] == "local"


def test_values_are_taken_literally(tmp_path):
    env_file = tmp_path / "local.env"
    env_file.write_text("DEBUG=1\nSECRET_KEY=a$b${HOME}#c\n")

    assert loaded({"GEOSENSE_ENV_FILE": str(env_file)})["SECRET_KEY"] == "a$b${HOME}#c"


@pytest.mark.parametrize("debug", [None, "0", "false"])
def test_without_an_env_file_or_a_secret_key_debug_off_is_refused(tmp_path, debug):
    env = {"GEOSENSE_ENV_FILE": str(tmp_path / "missing.env")}
    if debug is not None:
        env["DEBUG"] = debug

    result = settings_seen(env)

    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY must be set when DEBUG is off." in result.stderr


def test_an_empty_env_file_variable_reads_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOSENSE_ENV_FILE", "")
    assert envfile.env_file_path() is None
    assert envfile.env_file_load() is None

    result = settings_seen({"GEOSENSE_ENV_FILE": ""})
    assert "SECRET_KEY must be set" in result.stderr


def test_the_default_env_file_is_dot_env_at_the_repository_root(monkeypatch):
    monkeypatch.delenv("GEOSENSE_ENV_FILE", raising=False)
    assert envfile.env_file_path() == BASE_DIR / ".env"
    monkeypatch.setenv("GEOSENSE_ENV_FILE", "other.env")
    assert envfile.env_file_path() == BASE_DIR / "other.env"


def test_the_test_suite_reads_no_env_file():
    # tests/settings.py sets this before the settings load; the servers tests start inherit it.
    assert os.environ["GEOSENSE_ENV_FILE"] == ""


def test_a_relative_sqlite_path_is_relative_to_the_repository_root(tmp_path):
    env_file = tmp_path / "local.env"
    env_file.write_text("DEBUG=1\nDATABASE_URL=sqlite:///data/local.sqlite3\n")

    seen = loaded({"GEOSENSE_ENV_FILE": str(env_file)})

    assert seen["DB"] == str(BASE_DIR / "data" / "local.sqlite3")
    assert loaded({"DEBUG": "1", "GEOSENSE_ENV_FILE": ""})["DB"] == str(BASE_DIR / "db.sqlite3")


def test_make_runs_first_write_holds_debug_a_new_secret_key_sqlite_and_the_admin(tmp_path):
    path = tmp_path / ".env"

    done = envfile.local_env_file_ensure(path)

    values = dotenv_values(path)
    assert "Wrote" in done
    assert values["DEBUG"] == "1"
    assert values["DATABASE_URL"] == "sqlite:///db.sqlite3"
    assert len(values["SECRET_KEY"]) >= 50
    assert len(set(values["SECRET_KEY"])) >= 5  # what `check --deploy` asks of a key
    assert values["GEOSENSE_ADMIN_USERNAME"] == "admin"
    assert len(values["GEOSENSE_ADMIN_PASSWORD"]) >= 20
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a secret key and a password
    other = tmp_path / "other.env"
    envfile.local_env_file_ensure(other)
    assert dotenv_values(other)["SECRET_KEY"] != values["SECRET_KEY"]


def test_later_runs_change_nothing(tmp_path):
    path = tmp_path / ".env"
    envfile.local_env_file_ensure(path)
    before = path.read_bytes()

    assert envfile.local_env_file_ensure(path) == ""
    assert path.read_bytes() == before


def test_an_older_env_file_only_gains_the_missing_admin_login(tmp_path):
    path = tmp_path / ".env"
    path.write_text("DEBUG=1\nSECRET_KEY=mine\nGEOSENSE_ADMIN_USERNAME=boss")  # no final newline

    done = envfile.local_env_file_ensure(path)

    values = dotenv_values(path)
    assert "Added" in done
    assert values["SECRET_KEY"] == "mine"
    assert values["GEOSENSE_ADMIN_USERNAME"] == "boss"
    assert len(values["GEOSENSE_ADMIN_PASSWORD"]) >= 20
    assert path.read_text().startswith("DEBUG=1\nSECRET_KEY=mine\nGEOSENSE_ADMIN_USERNAME=boss\n")


def test_the_env_file_is_git_ignored_and_the_example_is_not():
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", ".env", ".env.example"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == [".env"]
