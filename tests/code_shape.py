"""Read the code's shape for tests/test_code_shape.py: function lengths and imports.

JavaScript is scanned, not parsed (no parser ships with the project): the scanner skips
comments, strings, template literals and regular expressions, then pairs braces. A brace
opens a function body when it follows `=>` or the `)` of a parameter list introduced by
`function`, a method name or an arrow's parameters.
"""

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Keywords that are followed by `(…) {` without being a function.
_NOT_FUNCTIONS = frozenset({"if", "for", "while", "switch", "catch", "with", "return"})
# After these tokens a `/` starts a regular expression, not a division.
_REGEX_AFTER = frozenset("(,=:[!&|?{};+-*%<>~^") | {"return", "typeof", "case", "=>", ""}


@dataclass(frozen=True)
class Function:
    path: str
    name: str
    line: int
    lines: int


def python_functions(folder: str) -> Iterator[Function]:
    """Every function and method (nested ones too) under `folder`, migrations aside."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield Function(
                    str(path.relative_to(ROOT)),
                    node.name,
                    node.lineno,
                    node.end_lineno - node.lineno + 1,
                )


def python_imports(folder: str) -> Iterator[tuple[str, str]]:
    """(file, imported module) for every import under `folder`, relative ones resolved."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).parent.parts)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield str(path.relative_to(ROOT)), alias.name
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                yield str(path.relative_to(ROOT)), module


def _tokens(source: str) -> Iterator[tuple[str, int]]:
    """Significant tokens of JavaScript with their line: names, punctuation; no literals."""
    i, line, n = 0, 1, len(source)
    previous = ""
    template_depth: list[int] = []  # brace depth at which each open `${` returns to a template
    depth = 0
    while i < n:
        char = source[i]
        if char == "\n":
            line += 1
            i += 1
        elif char.isspace():
            i += 1
        elif source.startswith("//", i):
            i = source.find("\n", i) if "\n" in source[i:] else n
        elif source.startswith("/*", i):
            end = source.index("*/", i) + 2
            line += source.count("\n", i, end)
            i = end
        elif char in "'\"":
            i = _string_end(source, i, char)
            previous = "literal"
        elif char == "`" or (char == "}" and template_depth and template_depth[-1] == depth):
            if char == "}":
                template_depth.pop()
            i, line, opened = _template_part(source, i + 1, line)
            if opened:
                template_depth.append(depth)
            previous = "literal"
        elif char == "/" and previous in _REGEX_AFTER:
            i = _regex_end(source, i)
            previous = "literal"
        elif char.isalnum() or char in "_$":
            match = re.compile(r"[\w$]+").match(source, i)
            previous = match.group()
            yield previous, line
            i = match.end()
        else:
            token = "=>" if source.startswith("=>", i) else char
            depth += {"{": 1, "}": -1}.get(token, 0)
            previous = token
            yield token, line
            i += len(token)


def _string_end(source: str, i: int, quote: str) -> int:
    i += 1
    while source[i] != quote:
        i += 2 if source[i] == "\\" else 1
    return i + 1


def _template_part(source: str, i: int, line: int) -> tuple[int, int, bool]:
    """Skip template text up to its end (False) or to a `${` (True)."""
    while True:
        if source[i] == "\\":
            i += 2
        elif source[i] == "`":
            return i + 1, line, False
        elif source.startswith("${", i):
            return i + 2, line, True
        else:
            line += source[i] == "\n"
            i += 1


def _regex_end(source: str, i: int) -> int:
    i += 1
    in_class = False
    while True:
        char = source[i]
        if char == "\\":
            i += 2
            continue
        if char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "/" and not in_class:
            i += 1
            while i < len(source) and (source[i].isalpha()):
                i += 1
            return i
        i += 1


def js_functions(path: Path) -> Iterator[Function]:
    """Every function body of a JavaScript file, with the name it is known by."""
    tokens = list(_tokens(path.read_text()))
    opens: list[tuple[int, str | None]] = []  # the line a function starts, its name or None
    parens: list[int] = []
    paren_owner: dict[int, int] = {}  # index of `)` → index of its `(`
    for index, (token, _) in enumerate(tokens):
        if token == "(":
            parens.append(index)
        elif token == ")" and parens:
            paren_owner[index] = parens.pop()
    for index, (token, line) in enumerate(tokens):
        if token == "{":
            name, start = _function_name(tokens, index, paren_owner)
            opens.append((tokens[start][1], name))
        elif token == "}" and opens:
            first, name = opens.pop()
            if name is not None:
                yield Function(str(path.relative_to(ROOT)), name, first, line - first + 1)


def _function_name(
    tokens: list[tuple[str, int]], brace: int, paren_owner: dict[int, int]
) -> tuple[str | None, int]:
    """The name of the function whose body `brace` opens (None: not a function body) and the
    index of the token its declaration starts at."""
    before = tokens[brace - 1][0] if brace else ""
    if before == "=>":
        return _arrow_name(tokens, brace - 1, paren_owner)
    if before != ")" or brace - 1 not in paren_owner:
        return None, brace
    opener = paren_owner[brace - 1]
    callee = tokens[opener - 1][0] if opener else ""
    if callee == "function":
        return "(function)", opener - 1
    if callee in _NOT_FUNCTIONS or not re.fullmatch(r"[\w$]+", callee):
        return None, brace
    if opener >= 2 and tokens[opener - 2][0] == "function":
        return callee, opener - 1
    # `name(…) {` is a method when it is not a call followed by a block.
    if tokens[opener - 2][0] in {"{", "}", ";", ",", "async", "get", "set"}:
        return callee, opener - 1
    return None, brace


def _arrow_name(
    tokens: list[tuple[str, int]], arrow: int, paren_owner: dict[int, int]
) -> tuple[str, int]:
    """`const name = (…) => {` or `name: (…) => {` → name; an anonymous arrow otherwise."""
    index = arrow - 1
    if tokens[index][0] == ")" and index in paren_owner:
        index = paren_owner[index]
    start = index
    index -= 1
    if index >= 0 and tokens[index][0] == "async":
        index -= 1
    if index >= 1 and tokens[index][0] in {"=", ":"}:
        return tokens[index - 1][0], index - 1
    return "(arrow)", start
