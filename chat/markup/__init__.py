"""GeoSense message markup: parse a message into typed blocks and render them safely.

An assistant message is free text with embedded elements (docs/markup.md): `<question id>`
with `<header>` and `<option message context>`, `<tool type="highlight" data>`, `<tool
type="find-similar" data>`, and inline `<distance value>`, `<size value>`, `<area value|id>`,
`<ref id>`, `<id v>…</id>`, `<i>`, `<b>`. A user message carries `<answer question
question-option-index>` and `<response type class-id request>`.

How it works, and why it is safe:
1. Interpolation (assistant messages only). Each `${artifact_id.path}` is swapped for an
   opaque token (private-use sentinels around an index) before any tag is read, so the text is
   "replaced textually before attribute parsing" (docs/markup.md), yet a value full of quotes
   cannot end the attribute it sits in. After tokenizing, an attribute that is exactly one
   placeholder takes the artifact value itself (`data="${artifact-1}"` is that artifact's
   JSON object); a placeholder inside a longer value or in text becomes its text (strings as
   they are, everything else as JSON). An unknown artifact or path is a visible "missing
   value" marker in text and a failed attribute (an error chip) in a tag.
2. Tokenizing only knows GeoSense's element names; `<script>`, unknown tags and tags that do
   not parse stay text. Tags are paired per name in one pass; blocks never nest (an inner
   block becomes an error chip). Payloads are validated against the type contracts of docs/markup.md
   (`validation`), capped in size, and a bad one becomes an error chip while the rest of the
   message renders.
3. Rendering builds HTML only from the templates in `templates/chat/blocks/` with
   autoescaping; every piece of message text is escaped. The assistant's prose is Markdown,
   rendered with the elements inside it and sanitised (`markdown`). While a message streams, a
   half-written tag or placeholder at its end is hidden, an unclosed block shows as a
   placeholder and half-open Markdown as text, so no broken HTML ever appears.
4. Nothing here raises on any input text: malformed markup degrades to text or a chip.
"""

from collections.abc import Mapping
from typing import Any

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
from .compose import (
    TranscriptQuestions,
    answer_compose,
    response_compose,
    responses_in_transcript,
    transcript_questions,
)
from .parser import parse_message, plain_parts
from .render import render_blocks, render_inline, render_message
from .syntax import placeholder_artifact_ids


def message_plain_text(
    text: str, *, role: str = "assistant", artifacts: Mapping[str, Any] | None = None
) -> str:
    """A one-line plain-text preview of a message (titles, the session list)."""
    words: list[str] = []
    for block in parse_message(text, artifacts=artifacts or {}, role=role):
        if isinstance(block, TextBlock):
            words.append(plain_parts(block.parts))
        elif isinstance(block, QuestionBlock):
            words.append(plain_parts(block.header))
        elif isinstance(block, HighlightBlock | FindSimilarBlock):
            words.append(plain_parts(block.body))
        elif isinstance(block, Answer | Response):
            words.append(
                " ".join((block.message if isinstance(block, Answer) else block.text).split())
            )
    return " ".join(w for w in words if w)


__all__ = [
    "Answer",
    "Area",
    "Block",
    "Emphasis",
    "FindSimilarBlock",
    "HighlightBlock",
    "Inline",
    "Length",
    "Markdown",
    "MarkupError",
    "Missing",
    "Option",
    "PendingBlock",
    "QuestionBlock",
    "Ref",
    "Response",
    "Text",
    "TextBlock",
    "TranscriptQuestions",
    "answer_compose",
    "message_plain_text",
    "parse_message",
    "placeholder_artifact_ids",
    "render_blocks",
    "render_inline",
    "render_message",
    "response_compose",
    "responses_in_transcript",
    "transcript_questions",
]
