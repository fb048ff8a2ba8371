"""The shape the code keeps so that the next maintainer can change it (docs/architecture.md):
small functions, imports that point down the layers, the wire spelled out in one place."""

import ast
import re
from pathlib import Path

import pytest

from tests.code_shape import ROOT, js_functions, python_functions, python_imports

MAX_FUNCTION_LINES = 150
JS_EXCEPTIONS: set[tuple[str, str]] = set()

# Layer → modules it must never import (imports point down only).
FORBIDDEN_IMPORTS = {
    "geosense/annotations": ("chat", "tools", "geosense.accounts"),
    "geosense/accounts": ("chat", "tools", "geosense.annotations"),
    "tools": ("chat",),
}

# The `type` of every frame and channel-layer message: spelled out in the wire modules only.
WIRE_TYPES = (
    "session-bind",
    "session-bound",
    "client-tool-register",
    "client-tool-registered",
    "client-tool-invoke",
    "client-tool-result",
    "client-tool-cancelled",
    "client.tool.invoke",
    "client.tool.answer",
    "client.tool.forget",
    "turn.event",
    "annotations-changed",
    "annotations.changed",
    "health.ping",
)


@pytest.mark.parametrize("folder", ["chat", "tools", "geosense"])
def test_no_python_function_is_longer_than_150_lines(folder):
    long = [f for f in python_functions(folder) if f.lines > MAX_FUNCTION_LINES]
    assert not long, "\n".join(f"{f.path}:{f.line} {f.name} has {f.lines} lines" for f in long)


def test_no_javascript_function_is_longer_than_150_lines():
    long = [
        f
        for path in sorted((ROOT / "static" / "geosense").glob("*.js"))
        for f in js_functions(path)
        if f.lines > MAX_FUNCTION_LINES and (f.path, f.name) not in JS_EXCEPTIONS
    ]
    assert not long, "\n".join(f"{f.path}:{f.line} {f.name} has {f.lines} lines" for f in long)


def test_the_javascript_scanner_measures_what_it_reads(tmp_path):
    source = (
        "const pattern = /[}{]/g; // a } in a comment\n"
        "export function outer(a) {\n"
        "  const text = `}${a ? '{' : `${'}'}`}`;\n"
        "  const inner = (b) => {\n"
        "    return b / 2;\n"
        "  };\n"
        "  if (a) { return { method() { return 1; } }; }\n"
        "}\n"
    )
    path = ROOT / "static" / "geosense" / "__scanner_check.js"
    try:
        path.write_text(source)
        found = {(f.name, f.line, f.lines) for f in js_functions(path)}
    finally:
        path.unlink()
    assert found == {("outer", 2, 7), ("inner", 4, 3), ("method", 7, 1)}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_IMPORTS))
def test_imports_point_down_the_layers(layer):
    """Management commands are transports (they may compose layers); the rest may not."""
    forbidden = FORBIDDEN_IMPORTS[layer]
    wrong = [
        f"{path} imports {module}"
        for path, module in python_imports(layer)
        if "/management/" not in path
        and any(module == name or module.startswith(name + ".") for name in forbidden)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_wire_module_imports_nothing_of_geosense():
    modules = {module for _, module in python_imports("geosense") if _ == "geosense/wire.py"}
    assert not {m for m in modules if m.split(".")[0] in {"geosense", "chat", "tools"}}


def _python_strings(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_frame_and_message_types_are_spelled_out_only_in_the_wire_module():
    found = [
        f"{path.relative_to(ROOT)}: {name!r}"
        for folder in ("chat", "tools", "geosense")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "geosense" / "wire.py"
        for name in sorted(_python_strings(path) & set(WIRE_TYPES))
    ]
    assert not found, "\n".join(found)


def _without_comments(source: str) -> str:
    """JavaScript without its comments (which may name a frame), roughly: enough here."""
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)
    return re.sub(r"(?m)(^|\s)//[^\n]*", r"\1", source)


def test_the_pages_frames_are_spelled_out_only_in_wire_js():
    names = "|".join(re.escape(t) for t in WIRE_TYPES)
    quoted = re.compile(rf"""['"`]({names})['"`]""")
    found = [
        f"{path.relative_to(ROOT)}: {match[1]!r}"
        for path in sorted((ROOT / "static" / "geosense").glob("*.js"))
        if path.name != "wire.js"
        for match in quoted.finditer(_without_comments(path.read_text()))
    ]
    assert not found, "\n".join(found)
