"""From message text to typed blocks (see `chat.markup` for the rules)."""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from geosense.wire import MAP_CONTEXT_TYPES

from . import syntax
from .blocks import (
    Answer,
    Area,
    Block,
    Emphasis,
    FindSimilarBlock,
    HighlightBlock,
    Inline,
    Length,
    Markdown,
    MarkupError,
    Missing,
    Option,
    PendingBlock,
    QuestionBlock,
    Ref,
    Response,
    Text,
    TextBlock,
)
from .formatting import format_area, format_length
from .markdown import markdown_plain
from .syntax import MISSING, EndTag, Placeholder, StartTag, TextToken, Token
from .validation import MAX_ID, find_similar_problem, highlight_problem

MAX_DATA_CHARS = 4_000_000
MAX_OPTIONS = 20
MAX_MESSAGE = 4_000
MAX_EMPHASIS_DEPTH = 8
_CONTAINERS = frozenset(
    {"question", "header", "option", "tool", "answer", "response", "id", "i", "b"}
)
_BLOCKS = frozenset({"question", "tool"})
_VOID = frozenset({"distance", "size", "area", "ref"})
_ID_TEXT_RE = re.compile(r"[^\x00-\x1f\x7f]{1,64}")
_REQUEST_RE = re.compile(r"[-\w.:]{1,64}")
_NUMBER_RE = re.compile(r"\s*-?\d{1,15}(?:\.\d{1,15})?(?:[eE][-+]?\d{1,3})?\s*")
_INT_RE = re.compile(r"\s*\d{1,19}\s*")
_COUNT_RE = re.compile(r"\b(\d{1,9})\s+results?\b")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Parser:
    """One message's tokens, their tag pairing and the resolved placeholders."""

    def __init__(
        self,
        text: str,
        tokens: list[Token],
        placeholders: Sequence[Placeholder],
        *,
        streaming: bool,
        message_id: int | str | None,
        decode: bool,
    ) -> None:
        self.text = text
        self.tokens = tokens
        self.placeholders = placeholders
        self.streaming = streaming
        self.message_id = message_id
        self.decode = decode
        self.find_similar_count = 0
        self.close: dict[int, int] = {}
        stacks: dict[str, list[int]] = {}
        self.block_starts: list[int] = []
        for index, token in enumerate(tokens):
            if isinstance(token, StartTag) and not token.self_closing:
                if token.name in _CONTAINERS:
                    stacks.setdefault(token.name, []).append(index)
            elif isinstance(token, EndTag) and stacks.get(token.name):
                self.close[stacks[token.name].pop()] = index
            if isinstance(token, StartTag) and token.name in _BLOCKS:
                self.block_starts.append(index)

    # --- helpers ------------------------------------------------------------------------------
    def raw(self, token: Token) -> str:
        return self.text[token.start : token.end]

    def source(self, token: Token) -> Text:
        """A token shown exactly as written: the fallback for markup out of place."""
        return Text(syntax.restore(self.raw(token), self.placeholders))

    def closed_within(self, index: int, hi: int) -> int | None:
        end = self.close.get(index)
        return end if end is not None and end < hi else None

    def attr(self, tag: StartTag, name: str) -> Any:
        return syntax.attribute_value(tag.attrs.get(name), self.placeholders)

    def missing_detail(self, tag: StartTag, name: str) -> str:
        sources = syntax.missing_sources(tag.attrs.get(name), self.placeholders)
        return "missing value " + ", ".join(sources)

    def sourced(self, part: Inline, lo: int, hi: int) -> Inline:
        """The element made of tokens lo..hi (inclusive), knowing the markup it was written as."""
        if not self.decode or not hasattr(part, "source"):
            return part
        raw = self.text[self.tokens[lo].start : self.tokens[min(hi, len(self.tokens) - 1)].end]
        return replace(part, source=syntax.restore(raw, self.placeholders))

    def text_parts(self, raw: str) -> list[Inline]:
        """Assistant prose is Markdown source (entities are Markdown's to decode); interpolated
        values are literal text, never Markdown."""
        if not self.decode:
            return [Text(raw)]
        parts: list[Inline] = []
        for piece in syntax.pieces(raw, self.placeholders, decode=False):
            if isinstance(piece, str):
                parts.append(Markdown(piece))
            elif piece.value is MISSING:
                parts.append(Missing(piece.source))
            else:
                value = syntax.value_text(piece.value)
                if len(value) > syntax.MAX_INTERPOLATED_TEXT:
                    value = value[: syntax.MAX_INTERPOLATED_TEXT] + "…"
                parts.append(Text(value))
        return parts

    # --- inline -------------------------------------------------------------------------------
    def inline(self, lo: int, hi: int, depth: int = 0) -> list[Inline]:
        parts: list[Inline] = []
        i = lo
        while i < hi:
            token = self.tokens[i]
            if isinstance(token, TextToken):
                parts.extend(self.text_parts(self.raw(token)))
                i += 1
            elif isinstance(token, EndTag):
                too_deep = depth >= MAX_EMPHASIS_DEPTH and token.name in ("i", "b")
                if token.name not in _VOID and not too_deep:
                    parts.append(self.source(token))
                i += 1
            elif token.name in ("i", "b") and depth >= MAX_EMPHASIS_DEPTH:
                i += 1  # too deep to nest further: keep the text, drop the styling
            elif token.name in ("i", "b"):
                end = self.closed_within(i, hi)
                open_tail = end is None and self.streaming and hi == len(self.tokens)
                if end is None and not open_tail:
                    parts.append(self.source(token))
                    i += 1
                    continue
                stop = hi if end is None else end
                emphasis = Emphasis(token.name, tuple(self.inline(i + 1, stop, depth + 1)))
                parts.append(self.sourced(emphasis, i, stop if end is not None else stop - 1))
                i = stop + (end is not None)
            elif token.name in _VOID:
                parts.append(self.sourced(self.void(token), i, i))
                i += 1
            elif token.name == "id":
                end = self.closed_within(i, hi)
                if end is None:
                    if self.streaming and hi == len(self.tokens) and self.close.get(i) is None:
                        break
                    parts.append(self.source(token))
                    i += 1
                    continue
                parts.append(self.sourced(self.id_ref(token, i + 1, end), i, end))
                i = end + 1
            elif token.name in _BLOCKS:
                end = self.closed_within(i, hi)
                nested = MarkupError(f"nested <{token.name}>", "blocks cannot be nested")
                parts.append(self.sourced(nested, i, i if end is None else end))
                i = i + 1 if end is None else end + 1
            else:
                parts.append(self.source(token))
                i += 1
        return parts

    def number(self, tag: StartTag, name: str) -> float | str:
        """An attribute's numeric value, or the reason it has none."""
        value = self.attr(tag, name)
        if value is MISSING:
            return self.missing_detail(tag, name)
        if isinstance(value, str) and _NUMBER_RE.fullmatch(value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name} must be a number"
        try:
            number = float(value)
        except OverflowError:
            return f"{name} is too large"
        if not math.isfinite(number) or number < 0:
            return f"{name} must be a non-negative number"
        return number

    def annotation_id(self, value: Any) -> int | None:
        if isinstance(value, str) and _INT_RE.fullmatch(value):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if type(value) is int and 0 <= value <= MAX_ID:
            return value
        return None

    def void(self, tag: StartTag) -> Inline:
        name = tag.name
        if name == "ref":
            value = self.attr(tag, "id")
            if value is MISSING:
                return MarkupError("invalid <ref>", self.missing_detail(tag, "id"))
            annotation = self.annotation_id(value)
            if annotation is None:
                return MarkupError("invalid <ref>", "id must be an annotation id")
            return Ref(annotation)
        key = "id" if name == "area" and "value" not in tag.attrs else "value"
        number = self.number(tag, key)
        if isinstance(number, str):
            return MarkupError(f"invalid <{name}>", number)
        return Area(number) if name == "area" else Length(number, name)

    def id_ref(self, tag: StartTag, lo: int, hi: int) -> Inline:
        content: list[str] = []
        for token in self.tokens[lo:hi]:
            for piece in syntax.pieces(self.raw(token), self.placeholders, decode=True):
                if isinstance(piece, str):
                    content.append(piece)
                elif piece.value is MISSING:
                    return MarkupError("invalid <id>", f"missing value {piece.source}")
                else:
                    content.append(syntax.value_text(piece.value))
        annotation = self.annotation_id("".join(content))
        if annotation is None:
            return MarkupError("invalid <id>", "the content of <id> must be an annotation id")
        vector = self.attr(tag, "v") if "v" in tag.attrs else None
        if vector is MISSING or (vector is not None and not _ID_TEXT_RE.fullmatch(str(vector))):
            return MarkupError("invalid <id>", "v must be a short name")
        return Ref(annotation, None if vector is None else str(vector))

    # --- blocks -------------------------------------------------------------------------------
    def blocks(self) -> list[Block]:
        blocks: list[Block] = []
        pending: list[Inline] = []

        def flush() -> None:
            parts = _trimmed(pending)
            if parts:
                blocks.append(TextBlock(parts))
            pending.clear()

        i, n = 0, len(self.tokens)
        while i < n:
            token = self.tokens[i]
            if isinstance(token, StartTag) and token.name in _BLOCKS:
                end = self.close.get(i)
                if token.self_closing or end is not None:
                    flush()
                    blocks.append(self.block(token, i + 1, i if end is None else end))
                    i = i + 1 if end is None else end + 1
                elif self.streaming:
                    flush()
                    blocks.append(PendingBlock(token.name))
                    i = n
                else:
                    pending.append(self.source(token))
                    i += 1
                continue
            following = bisect.bisect_right(self.block_starts, i)
            stop = self.block_starts[following] if following < len(self.block_starts) else n
            pending.extend(self.inline(i, stop))
            i = stop
        flush()
        return blocks

    def block(self, tag: StartTag, lo: int, hi: int) -> Block:
        if tag.name == "question":
            return self.question(tag, lo, hi)
        kind = self.attr(tag, "type")
        body = _trimmed(self.inline(lo, hi))
        if kind == "highlight":
            data, problem, data_json = self.payload(tag, highlight_problem)
            return HighlightBlock(data=data, error=problem, body=body, data_json=data_json)
        if kind in ("find-similar", "find_similar"):
            self.find_similar_count += 1
            data, problem, data_json = self.payload(tag, find_similar_problem)
            return FindSimilarBlock(
                data=data,
                error=problem,
                body=body,
                request_id=self.request_id(tag),
                data_json=data_json,
            )
        return TextBlock(
            (MarkupError("unknown tool", "type must be highlight or find-similar"), *body)
        )

    def request_id(self, tag: StartTag) -> str:
        for name in ("request", "id"):
            value = self.attr(tag, name) if name in tag.attrs else None
            if isinstance(value, str) and _REQUEST_RE.fullmatch(value):
                return value
        prefix = "m" if self.message_id is None else str(self.message_id)
        return f"{prefix}-fs{self.find_similar_count}"

    def payload(
        self, tag: StartTag, problem_of: Any
    ) -> tuple[dict[str, Any] | None, str | None, str]:
        """The tool's data checked against its contract: (data, problem, data as JSON)."""
        if "data" not in tag.attrs:
            return None, "the tool has no data", ""
        data = self.attr(tag, "data")
        if data is MISSING:
            return None, self.missing_detail(tag, "data"), ""
        if isinstance(data, str):
            if len(data) > MAX_DATA_CHARS:
                return None, "data is too large", ""
            try:
                data = json.loads(data, parse_constant=_reject_constant)
            except (ValueError, RecursionError):
                return None, "data is not valid JSON", ""
        try:
            problem = problem_of(data)
        except (TypeError, ValueError, OverflowError, RecursionError):
            problem = "data does not match the tool's contract"
        if problem:
            return None, problem, ""
        try:
            data_json = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError):
            return None, "data holds values that are not JSON", ""
        if len(data_json) > MAX_DATA_CHARS:
            return None, "data is too large", ""
        return data, None, data_json

    def question(self, tag: StartTag, lo: int, hi: int) -> Block:
        ident = self.attr(tag, "id") if "id" in tag.attrs else MISSING
        if isinstance(ident, int) and not isinstance(ident, bool):
            ident = str(ident)
        header: list[Inline] = []
        options: list[Option] = []
        notes: list[Inline] = []
        i = lo
        while i < hi:
            token = self.tokens[i]
            end = self.closed_within(i, hi) if isinstance(token, StartTag) else None
            if isinstance(token, StartTag) and token.name == "header" and end is not None:
                header.extend(self.inline(i + 1, end))
                i = end + 1
            elif (
                isinstance(token, StartTag)
                and token.name == "option"
                and (end is not None or token.self_closing)
            ):
                stop = i if end is None else end
                if len(options) < MAX_OPTIONS:
                    options.append(self.option(token, len(options), i + 1, stop))
                else:
                    notes.append(MarkupError("too many options", f"at most {MAX_OPTIONS} options"))
                i = stop + 1
            elif isinstance(token, TextToken) and not self.raw(token).strip():
                i += 1
            else:
                stop = self.closed_within(i, hi) if isinstance(token, StartTag) else None
                stop = i + 1 if stop is None else stop + 1
                notes.extend(self.inline(i, stop))
                i = stop
        if not isinstance(ident, str) or not _ID_TEXT_RE.fullmatch(ident):
            error = MarkupError("invalid <question>", "a question needs a short id")
            return TextBlock((error, *_trimmed(header)))
        return QuestionBlock(
            id=ident, header=_trimmed(header), options=tuple(options), notes=_trimmed(notes)
        )

    def option(self, tag: StartTag, index: int, lo: int, hi: int) -> Option:
        label = _trimmed(self.inline(lo, hi))
        message: Any = self.attr(tag, "message") if "message" in tag.attrs else None
        if message is None:
            message = plain_parts(label)
        elif message is MISSING:
            return Option(index, label, "", (), self.missing_detail(tag, "message"))
        message = syntax.value_text(message)
        if len(message) > MAX_MESSAGE:
            return Option(index, label, "", (), "message is too long")
        context = self.attr(tag, "context") if "context" in tag.attrs else ""
        words = context.split() if isinstance(context, str) else []
        known = tuple(dict.fromkeys(w for w in words if w in MAP_CONTEXT_TYPES))
        return Option(index, label, message, known)

    # --- user messages ------------------------------------------------------------------------
    def user_blocks(self) -> list[Block]:
        blocks: list[Block] = []
        pending: list[str] = []

        def flush() -> None:
            text = "".join(pending).strip()
            if text:
                blocks.append(TextBlock((Text(text),)))
            pending.clear()

        i, n = 0, len(self.tokens)
        while i < n:
            token = self.tokens[i]
            end = self.close.get(i) if isinstance(token, StartTag) else None
            if end is not None and token.name in ("answer", "response"):
                body = syntax.scrub(
                    _unescape("".join(self.raw(t) for t in self.tokens[i + 1 : end]))
                ).strip()
                block = self.user_block(token, body)
                if block is not None:
                    flush()
                    blocks.append(block)
                    i = end + 1
                    continue
            pending.append(self.raw(token))
            i += 1
        flush()
        return blocks

    def user_block(self, tag: StartTag, body: str) -> Block | None:
        attrs = {k: self.attr(tag, k) if k in tag.attrs else None for k in tag.attrs}
        if tag.name == "answer":
            question = attrs.get("question")
            if not isinstance(question, str) or not _ID_TEXT_RE.fullmatch(question):
                return None
            index = attrs.get("question-option-index")
            option_index = int(index) if isinstance(index, str) and index.isdigit() else None
            if option_index is not None and option_index >= MAX_OPTIONS:
                option_index = None
            asked_in = attrs.get("asked-in")
            if not isinstance(asked_in, str) or not _REQUEST_RE.fullmatch(asked_in):
                asked_in = None
            return Answer(
                question_id=question, option_index=option_index, message=body, asked_in=asked_in
            )
        kind = attrs.get("type")
        if not isinstance(kind, str) or not kind:
            return None
        count = _COUNT_RE.search(body)
        return Response(
            type=kind,
            class_id=str(attrs.get("class-id") or ""),
            request_id=str(attrs.get("request") or ""),
            text=body,
            count=int(count.group(1)) if count else None,
        )


def _unescape(text: str) -> str:
    return syntax.pieces(text, (), decode=True)[0]


def _trimmed(parts: Sequence[Inline]) -> tuple[Inline, ...]:
    """Drop empty text and the whitespace at both ends of a run of inline parts."""
    items = [p for p in parts if not (isinstance(p, Text | Markdown) and not p.text)]
    while items and isinstance(items[0], Text | Markdown) and not items[0].text.strip():
        items.pop(0)
    while items and isinstance(items[-1], Text | Markdown) and not items[-1].text.strip():
        items.pop()
    if items and isinstance(items[0], Text | Markdown):
        items[0] = type(items[0])(items[0].text.lstrip())
    if items and isinstance(items[-1], Text | Markdown):
        items[-1] = type(items[-1])(items[-1].text.rstrip())
    return tuple(items)


def plain_parts(parts: Sequence[Inline]) -> str:
    """Inline parts as one line of plain text (values formatted, chips as `#id`)."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, Text):
            out.append(part.text)
        elif isinstance(part, Markdown):
            out.append(markdown_plain(part.text))
        elif isinstance(part, Emphasis):
            out.append(plain_parts(part.children))
        elif isinstance(part, Length):
            out.append(format_length(part.value))
        elif isinstance(part, Area):
            out.append(format_area(part.value))
        elif isinstance(part, Ref):
            out.append(f"#{part.annotation_id}")
        elif isinstance(part, Missing):
            out.append("…")
    return " ".join("".join(out).split())


def parse_message(
    text: str,
    *,
    artifacts: Mapping[str, Any],
    role: str = "assistant",
    streaming: bool = False,
    message_id: int | str | None = None,
) -> list[Block]:
    """The blocks of one message; never raises on any input text."""
    if role != "assistant":
        text = syntax.scrub(text)
        tokens, _ = syntax.tokenize(text)
        return _Parser(
            text, tokens, (), streaming=False, message_id=message_id, decode=False
        ).user_blocks()
    if streaming:
        text = syntax.streaming_cut(text)
    text, placeholders = syntax.interpolate(text, artifacts)
    tokens, end = syntax.tokenize(text, streaming=streaming)
    parser = _Parser(
        text[:end],
        tokens,
        placeholders,
        streaming=streaming,
        message_id=message_id,
        decode=True,
    )
    return parser.blocks()
