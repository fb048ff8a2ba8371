"""Blocks to HTML through Django templates under `templates/chat/blocks/`.

Every value reaches the HTML through autoescaping, `escape` or `format_html`, and the only
tags and attributes in the output are the ones written in those templates and in the few
inline snippets below (chips and values, built with `format_html` because a long message has
hundreds of them and the template engine costs tens of microseconds each).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from django.template.loader import get_template
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from geosense.annotations.classes import class_match, class_noun, class_plural

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
    Missing,
    QuestionBlock,
    Ref,
    Response,
    Text,
)
from .formatting import format_area, format_length
from .markdown import Element, markdown_html
from .parser import parse_message, plain_parts

_BLOCK_TEMPLATES = {
    "text": "text_block",
    "question": "question_block",
    "highlight": "highlight_block",
    "find_similar": "find_similar_block",
    "pending": "pending_block",
    "answer": "answer_block",
    "response": "response_block",
}


@cache
def _block_template(kind: str) -> Any:
    return get_template(f"chat/blocks/{_BLOCK_TEMPLATES[kind]}.html")


def _inline_html(part: Inline) -> str:
    """One inline element. These are the hot path of a long message (hundreds per message), so
    they are built with `format_html`, which escapes every argument, instead of a template."""
    if isinstance(part, Text):
        return escape(part.text).replace("\n", "<br>")
    if isinstance(part, Ref):
        if part.vector is None:
            return format_html(_REF, part.annotation_id, part.annotation_id)
        return format_html(_REF_VECTOR, part.annotation_id, part.vector, part.annotation_id)
    if isinstance(part, Length):
        return format_html(_LENGTH, part.element, part.value, format_length(part.value))
    if isinstance(part, Area):
        return format_html(_AREA, part.value, format_area(part.value))
    if isinstance(part, Emphasis):
        tag = "b" if part.tag == "b" else "i"
        return format_html("<{}>{}</{}>", tag, render_inline(part.children), tag)
    if isinstance(part, Markdown):  # only inside literal runs, which have no Markdown parts
        return escape(part.text).replace("\n", "<br>")
    if isinstance(part, Missing):
        return format_html(_MISSING, part.placeholder)
    return format_html(_ERROR, part.detail, part.label)


_REF = '<button type="button" class="chip ref" data-annotation-id="{}">#{}</button>'
_REF_VECTOR = (
    '<button type="button" class="chip ref" data-annotation-id="{}" data-vector="{}">#{}</button>'
)
_LENGTH = '<span class="value length {}" data-value="{}">{}</span>'
_AREA = '<span class="value area" data-value="{}">{}</span>'
_MISSING = '<span class="markup-missing" title="{}">missing value</span>'
_ERROR = '<span class="markup-error" title="{}">⚠ {}</span>'


def _element(part: Inline) -> Element:
    """A part standing inside Markdown: its HTML, and the text code shows for it."""
    if isinstance(part, Text):
        return Element(escape(part.text).replace("\n", "<br>"), part.text)
    if isinstance(part, Missing):
        return Element(_inline_html(part), part.placeholder)
    return Element(_inline_html(part), part.source or plain_parts((part,)))


def _markdown_pieces(parts: Sequence[Inline]) -> list[str | Element]:
    """Markdown source pieces; `<b>`/`<i>` open and close around their content, which is
    Markdown like the prose around it (one parse for the whole run)."""
    pieces: list[str | Element] = []
    for part in parts:
        if isinstance(part, Markdown):
            pieces.append(part.text)
        elif isinstance(part, Emphasis):
            tag = "b" if part.tag == "b" else "i"
            pieces.append(Element(f"<{tag}>", f"<{tag}>"))
            pieces.extend(_markdown_pieces(part.children))
            pieces.append(Element(f"</{tag}>", f"</{tag}>"))
        else:
            pieces.append(_element(part))
    return pieces


def render_inline(parts: Sequence[Inline]) -> SafeString:
    """Inline parts as HTML: Markdown prose with inline syntax only (headers, option labels, tool
    bodies), literal text escaped with its line breaks kept, elements as chips and values."""
    if any(isinstance(p, Markdown) for p in parts):
        # markdown_html sanitises its output with nh3 (an allowlist of tags and attributes).
        return mark_safe(markdown_html(_markdown_pieces(parts), inline=True))
    # Every piece is escaped text or format_html output, which escapes its arguments.
    return mark_safe("".join(map(_inline_html, parts)))


def render_text(
    parts: Sequence[Inline], *, streaming: bool = False, line_complete: bool = False
) -> SafeString:
    """A text block: Markdown with its blocks (paragraphs, lists, tables, code) when the
    assistant wrote it, otherwise literal text with its line breaks."""
    if any(isinstance(p, Markdown) for p in parts):
        html = markdown_html(
            _markdown_pieces(parts), streaming=streaming, line_complete=line_complete
        )
        return mark_safe(html)
    return render_inline(parts)


def _highlight_summary(block: HighlightBlock) -> str:
    data = block.data or {}
    count = len(data.get("ids", ()))
    summary = f"{count:,} annotation{'' if count == 1 else 's'}"
    if data.get("links") is not None:
        summary += f", linked by {data.get('linkType')}"
    return summary


def _block_context(
    block: Block,
    *,
    answers: Mapping[str, Answer],
    responses: Mapping[str, Response],
    questions: Mapping[str, QuestionBlock],
    message_id: int | str | None,
    classes: Collection[str] | None = None,
    streaming: bool = False,
    line_complete: bool = False,
) -> dict[str, Any]:
    kind = block.kind
    if kind == "text":
        return {"html": render_text(block.parts, streaming=streaming, line_complete=line_complete)}
    if kind == "question":
        answer = answers.get(block.id)
        options = [
            {
                "option": option,
                "label_html": render_inline(option.label),
                "context": " ".join(option.context),
                "chosen": answer is not None and answer.option_index == option.index,
            }
            for option in block.options
        ]
        return {
            "block": block,
            "answer": answer,
            "header_html": render_inline(block.header),
            "notes_html": render_inline(block.notes),
            "options": options,
            "message_id": message_id,
        }
    if kind == "highlight":
        return {
            "block": block,
            "body_html": render_inline(block.body),
            "data_json": block.data_json,
            "summary": "" if block.error else _highlight_summary(block),
        }
    if kind == "find_similar":
        response = responses.get(block.request_id)
        return {
            "block": block,
            "problem": block.error or _unsearchable(block, classes),
            "body_html": render_inline(block.body),
            "data_json": block.data_json,
            "response": response,
            "response_words": response_words(response) if response is not None else "",
        }
    if kind == "answer":
        question = questions.get(block.question_id)
        option = None
        if question is not None and block.option_index is not None:
            option = next((o for o in question.options if o.index == block.option_index), None)
        return {
            "block": block,
            "header_html": render_inline(question.header) if question else "",
            "option_html": render_inline(option.label) if option else "",
            "show_message": bool(block.message)
            and (option is None or block.message != option.message),
        }
    if kind == "response":
        return {"block": block, "words": response_words(block)}
    return {"block": block}


def _unsearchable(block: FindSimilarBlock, classes: Collection[str] | None) -> str | None:
    """Why a valid block's search cannot run on this data, or None: without samples the hint
    is the class to search, so it must name one (`classes`: the data's, when known); a sample
    that names its vector (`v`) must name one its annotation has (`classes.vectors_of`)."""
    data = block.data or {}
    if classes is None:
        return None
    if data.get("samples"):
        return _unknown_vector(data["samples"], getattr(classes, "vectors_of", None))
    hint = str(data.get("hint") or "")
    if class_match(hint, classes) is not None:
        return None
    return f"“{hint}” names no class on this map, and there are no samples to compare with"


def _unknown_vector(
    samples: list[dict[str, Any]], vectors_of: Callable[[list[int]], dict[int, list[str]]] | None
) -> str | None:
    """The first sample whose `v` its annotation has no vector of, in words, or None."""
    named = [
        (s["id"], s["v"]) for s in samples if isinstance(s, dict) and isinstance(s.get("v"), str)
    ]
    if not named or vectors_of is None:
        return None
    kinds = vectors_of([sample_id for sample_id, _ in named])
    for sample_id, v in named:
        if sample_id in kinds and v not in kinds[sample_id]:
            has = ", ".join(f"“{k}”" for k in kinds[sample_id]) or "none"
            return (
                f"#{sample_id} cannot be compared by “{v}”: it has no such vector "
                f"(its vectors: {has})"
            )
    return None


def response_words(response: Response) -> str:
    """A find-similar response as the user's bubble shows it ("Found 20 similar pools."); the
    stored sentence is the seed's, written for the model."""
    if response.type != "find_similar" or response.count is None:
        return " ".join(response.text.split())
    things = (
        class_noun(response.class_id, response.count)
        if response.class_id
        else ("annotation" if response.count == 1 else "annotations")
    )
    if response.count == 0:
        return f"Found no similar {class_plural(response.class_id) if response.class_id else 'annotations'}."
    return f"Found {response.count:,} similar {things}."


def render_blocks(
    blocks: Iterable[Block],
    *,
    answers: Mapping[str, Answer] | None = None,
    responses: Mapping[str, Response] | None = None,
    questions: Mapping[str, QuestionBlock] | None = None,
    message_id: int | str | None = None,
    classes: Collection[str] | None = None,
    streaming: bool = False,
    line_complete: bool = False,
) -> SafeString:
    """`classes`: the data's classes, when known (a find-similar block whose search cannot
    run on them renders as an invalid chip). `streaming`: the blocks of a message still being written; its last block may end in
    half-open Markdown, shown as text until it closes (`line_complete`: the text so far ends
    with a line break)."""
    html = []
    blocks = list(blocks)
    for n, block in enumerate(blocks):
        context = _block_context(
            block,
            answers=answers or {},
            responses=responses or {},
            questions=questions or {},
            message_id=message_id,
            classes=classes,
            streaming=streaming and n == len(blocks) - 1,
            line_complete=line_complete,
        )
        html.append(_block_template(block.kind).render(context).strip())
    # Each block is the output of an autoescaping template.
    return mark_safe("\n".join(html))


def render_message(
    text: str,
    *,
    role: str,
    artifacts: Mapping[str, Any],
    answers: Mapping[str, Answer] | None = None,
    streaming: bool = False,
    message_id: int | str | None = None,
    responses: Mapping[str, Response] | None = None,
    questions: Mapping[str, QuestionBlock] | None = None,
    classes: Collection[str] | None = None,
) -> SafeString:
    """HTML for one message, identical on first load and in live updates.

    `answers` marks questions already answered; `responses` marks find-similar requests
    already run; `questions` lets a user's `<answer>` show the question and option it picks.
    """
    blocks = parse_message(
        text, artifacts=artifacts, role=role, streaming=streaming, message_id=message_id
    )
    return render_blocks(
        blocks,
        answers=answers,
        responses=responses,
        questions=questions,
        message_id=message_id,
        classes=classes,
        streaming=streaming,
        line_complete=streaming and text.rstrip(" \t").endswith("\n"),
    )
