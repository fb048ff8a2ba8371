"""Lexical layer of the markup: `${…}` interpolation tokens and a tolerant tag tokenizer.

Interpolation is textual but cannot break out of an attribute: each placeholder is first
replaced by an opaque token (a private-use sentinel pair around its index), the tags are
tokenized, and only then are tokens inside attribute values and text resolved to artifact
values. Sentinel characters already present in the input are scrubbed before that, and
scrubbed again from every literal piece after entity decoding, so a message can never forge
a token.

Only GeoSense's own element names are recognised as tags; anything else — `<script>`, an
unterminated tag, a tag with malformed attributes — stays text.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOKEN_OPEN = "\ue000"
TOKEN_CLOSE = "\ue001"
# The Markdown renderer's element sentinels (`markdown.ELEMENT_OPEN/CLOSE`) are scrubbed too.
_SENTINELS = {ord(c): "\ufffd" for c in (TOKEN_OPEN, TOKEN_CLOSE, "\ue002", "\ue003")}
_TOKEN_RE = re.compile(f"{TOKEN_OPEN}(\\d+){TOKEN_CLOSE}")
_SENTINEL_RE = re.compile("[\ue000-\ue003]")
_PLACEHOLDER_RE = re.compile(r"\$\{([^{}<>\s\"'`]{1,512})\}")
_INDEX_RE = re.compile(r"\d{1,9}")
MAX_INTERPOLATED_TEXT = 2000

ELEMENTS = (
    "question", "header", "option", "tool", "answer", "response",
    "distance", "size", "area", "ref", "id", "i", "b",
)  # fmt: skip
_TAG_RE = re.compile(r"<(/?)(" + "|".join(ELEMENTS) + r")(?=[\s/>])", re.IGNORECASE)
_ATTR_RE = re.compile(
    r"""\s+([A-Za-z_:][-\w:.]*+)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s"'=<>`/]+)|(?!\s*=))"""
)
_START_END_RE = re.compile(r"\s*(/?)>")
_CLOSE_END_RE = re.compile(r"\s*>")
# What may follow a tag's complete attributes while the tag is still being streamed.
_INCOMPLETE_RE = re.compile(
    r"""(?:\s+[A-Za-z_:][-\w:.]*+(?:\s*(?:=\s*(?:"[^"]*|'[^']*|[^\s"'=<>`/]*))?)?)?\s*/?\Z"""
)
_PARTIAL_NAME_RE = re.compile(r"<(/?)([A-Za-z]{0,8})\Z")
_PARTIAL_PLACEHOLDER_RE = re.compile(r"\$(\{[^{}<>\s\"'`]{0,512})?\Z")


class _MissingType:
    """The value of a placeholder whose artifact or path does not exist."""

    _instance: _MissingType | None = None

    def __new__(cls) -> _MissingType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _MissingType()


@dataclass(frozen=True, slots=True)
class Placeholder:
    source: str
    value: Any


def scrub(text: str) -> str:
    """Replace sentinel characters so literal text can never read as an interpolation token."""
    return text.translate(_SENTINELS) if _SENTINEL_RE.search(text) else text


def artifact_lookup(path: str, artifacts: Mapping[str, Any]) -> Any:
    """Resolve `artifact_id.key.0.key` against the artifacts; MISSING when any step fails."""
    artifact_id, *steps = path.split(".")
    if artifact_id not in artifacts:
        return MISSING
    value = artifacts[artifact_id]
    for step in steps:
        if isinstance(value, Mapping):
            if step in value:
                value = value[step]
            elif _INDEX_RE.fullmatch(step) and int(step) in value:
                value = value[int(step)]
            else:
                return MISSING
        elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
            if not _INDEX_RE.fullmatch(step) or int(step) >= len(value):
                return MISSING
            value = value[int(step)]
        else:
            return MISSING
    return value


def placeholder_artifact_ids(text: str) -> set[str]:
    """The artifacts a text's `${artifact_id.path}` placeholders name (to load only those)."""
    return {match.group(1).split(".", 1)[0] for match in _PLACEHOLDER_RE.finditer(text)}


def interpolate(text: str, artifacts: Mapping[str, Any]) -> tuple[str, list[Placeholder]]:
    """Swap every `${…}` for an opaque token; return the text and the resolved placeholders."""
    text = scrub(text)
    placeholders: list[Placeholder] = []
    if "${" not in text:
        return text, placeholders

    def swap(match: re.Match[str]) -> str:
        placeholders.append(Placeholder(match.group(0), artifact_lookup(match.group(1), artifacts)))
        return f"{TOKEN_OPEN}{len(placeholders) - 1}{TOKEN_CLOSE}"

    return _PLACEHOLDER_RE.sub(swap, text), placeholders


def value_text(value: Any) -> str:
    """How an interpolated value reads inside text or a longer attribute: strings as they are,
    everything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return "…"


def restore(raw: str, placeholders: Sequence[Placeholder]) -> str:
    """The source as the author wrote it: tokens turned back into their `${…}` text."""
    if TOKEN_OPEN not in raw:
        return raw
    return _TOKEN_RE.sub(lambda m: placeholders[int(m.group(1))].source, raw)


def pieces(raw: str, placeholders: Sequence[Placeholder], *, decode: bool) -> list[Any]:
    """Split raw text into literal strings (entity-decoded when `decode`) and Placeholders."""
    if TOKEN_OPEN not in raw:
        return [scrub(html.unescape(raw)) if decode else raw]
    out: list[Any] = []
    for n, piece in enumerate(_TOKEN_RE.split(raw)):
        if n % 2:
            out.append(placeholders[int(piece)])
        elif piece:
            out.append(scrub(html.unescape(piece)) if decode else piece)
    return out


def attribute_value(raw: str | None, placeholders: Sequence[Placeholder]) -> Any:
    """An attribute's value: exactly one placeholder gives the artifact value itself, anything
    longer gives a string; MISSING when a placeholder in it does not resolve."""
    if raw is None:
        return ""
    parts = pieces(raw, placeholders, decode=True)
    if len(parts) == 1 and isinstance(parts[0], Placeholder):
        return parts[0].value
    text = []
    for part in parts:
        if isinstance(part, Placeholder):
            if part.value is MISSING:
                return MISSING
            text.append(value_text(part.value))
        else:
            text.append(part)
    return "".join(text)


def missing_sources(raw: str | None, placeholders: Sequence[Placeholder]) -> list[str]:
    if raw is None or TOKEN_OPEN not in raw:
        return []
    return [
        placeholders[int(m.group(1))].source
        for m in _TOKEN_RE.finditer(raw)
        if placeholders[int(m.group(1))].value is MISSING
    ]


# --- tokens -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TextToken:
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class StartTag:
    name: str
    attrs: dict[str, str | None]
    self_closing: bool
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class EndTag:
    name: str
    start: int
    end: int


Token = TextToken | StartTag | EndTag


def streaming_cut(text: str) -> str:
    """Drop a half-written tag name or placeholder at the very end of a streaming message."""
    match = _PARTIAL_NAME_RE.search(text, max(0, len(text) - 12))
    if match and any(name.startswith(match.group(2).lower()) for name in ELEMENTS):
        return text[: match.start()]
    match = _PARTIAL_PLACEHOLDER_RE.search(text, max(0, len(text) - 520))
    if match:
        return text[: match.start()]
    return text


def tokenize(text: str, *, streaming: bool = False) -> tuple[list[Token], int]:
    """Split text into text runs and GeoSense tags; return the tokens and where they end.

    While streaming, a tag cut off by the end of the text ends the tokens before it.
    """
    tokens: list[Token] = []
    text_start = pos = 0
    length = len(text)
    while True:
        match = _TAG_RE.search(text, pos)
        if match is None:
            break
        closing, name = match.group(1), match.group(2).lower()
        tag_end, tag, incomplete = _tag_at(text, match.end(), name, closing=bool(closing))
        if tag_end is None:
            if incomplete and streaming:
                length = match.start()
                break
            pos = match.start() + 1
            continue
        if match.start() > text_start:
            tokens.append(TextToken(text_start, match.start()))
        if closing:
            tokens.append(EndTag(name, match.start(), tag_end))
        else:
            attrs, self_closing = tag
            tokens.append(StartTag(name, attrs, self_closing, match.start(), tag_end))
        text_start = pos = tag_end
    if length > text_start:
        tokens.append(TextToken(text_start, length))
    return tokens, length


def _tag_at(text: str, pos: int, name: str, *, closing: bool) -> tuple[int | None, Any, bool]:
    """Parse the rest of a tag from `pos`: (end, (attrs, self_closing), incomplete)."""
    if closing:
        end = _CLOSE_END_RE.match(text, pos)
        if end:
            return end.end(), None, False
        return None, None, not text[pos:].strip()
    attrs: dict[str, str | None] = {}
    while True:
        attr = _ATTR_RE.match(text, pos)
        if attr is None:
            break
        key, value = attr.group(1).lower(), attr.group(2)
        if value is not None and value[:1] in "\"'":
            value = value[1:-1]
        attrs.setdefault(key, value)
        pos = attr.end()
    end = _START_END_RE.match(text, pos)
    if end:
        return end.end(), (attrs, bool(end.group(1))), False
    return None, None, _INCOMPLETE_RE.match(text, pos) is not None
