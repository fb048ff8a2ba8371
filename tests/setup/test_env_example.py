"""`.env.example` documents every variable the app reads."""

import ast
import re
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
APP_CODE = ["geosense", "chat", "tools"]
# Chosen before the settings exist (manage.py, asgi.py), so never read from an env file.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE"}


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name_of(node.value)}.{node.attr}"
    return ""


def variables_read(path: Path) -> set[str]:
    """Names in `os.environ[...]`, `os.environ.get(...)`, `os.getenv(...)` and `_env_*(...)`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        key = None
        if isinstance(node, ast.Subscript) and _name_of(node.value).endswith("environ"):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = _name_of(node.func)
            reads = func.endswith(("environ.get", "environ.setdefault", "getenv"))
            if reads or func.split(".")[-1].lstrip("_").startswith("env"):
                key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", key.value):
                found.add(key.value)
    return found


def documented() -> set[str]:
    text = (BASE_DIR / ".env.example").read_text()
    return set(re.findall(r"(?m)^#\s*([A-Z][A-Z0-9_]*)=", text))


def test_the_scan_finds_the_settings_variables():
    read = variables_read(BASE_DIR / "geosense" / "settings.py")
    assert {"DEBUG", "SECRET_KEY", "DATABASE_URL", "GEOSENSE_LLM_BASE_URL"} <= read


def test_every_variable_the_app_reads_is_in_env_example():
    read = set()
    for folder in APP_CODE:
        for path in (BASE_DIR / folder).rglob("*.py"):
            read |= variables_read(path)

    missing = read - documented() - NOT_SETTINGS

    assert not missing, f"add these to .env.example (and the README): {sorted(missing)}"


def test_env_example_sets_nothing_when_copied():
    # Every assignment is commented out at its default, so a copy changes no behaviour.
    lines = (BASE_DIR / ".env.example").read_text().splitlines()
    assert [line for line in lines if line.strip() and not line.startswith("#")] == []
