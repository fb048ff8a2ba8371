"""Blocks to HTML through Django templates under `templates/chat/blocks/`.

Every value reaches the HTML through autoescaping (or `escape` for plain text runs), and the
only tags and attributes in the output are the ones written in those templates. Inline
elements render through small cached templates; text runs are escaped directly because they
are the bulk of a message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from django.template import Context
from django.template.base import Template
from django.template.loader import get_template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .blocks import (
    Answer,
    Block,
    Emphasis,
    HighlightBlock,
    Inline,
    QuestionBlock,
    Response,
    Text,
)
from .parser import parse_message

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
def _inline_template(kind: str) -> Template:
    return get_template(f"chat/blocks/inline/{kind}.html").template


@cache
def _block_template(kind: str) -> Any:
    return get_template(f"chat/blocks/{_BLOCK_TEMPLATES[kind]}.html")


def render_inline(parts: Sequence[Inline]) -> SafeString:
    """Inline parts as HTML: text escaped (line breaks kept), elements through their template."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, Text):
            out.append(escape(part.text).replace("\n", "<br>"))
        elif isinstance(part, Emphasis):
            context = Context({"part": part, "html": render_inline(part.children)})
            out.append(_inline_template("emphasis").render(context))
        else:
            out.append(_inline_template(part.kind).render(Context({"part": part})))
    # Every piece above is escaped text or the output of an autoescaping template.
    return mark_safe("".join(out))


def _data_json(data: Mapping[str, Any] | None) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


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
) -> dict[str, Any]:
    kind = block.kind
    if kind == "text":
        return {"html": render_inline(block.parts)}
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
            "data_json": "" if block.error else _data_json(block.data),
            "summary": "" if block.error else _highlight_summary(block),
        }
    if kind == "find_similar":
        return {
            "block": block,
            "body_html": render_inline(block.body),
            "data_json": "" if block.error else _data_json(block.data),
            "response": responses.get(block.request_id),
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
    return {"block": block}


def render_blocks(
    blocks: Iterable[Block],
    *,
    answers: Mapping[str, Answer] | None = None,
    responses: Mapping[str, Response] | None = None,
    questions: Mapping[str, QuestionBlock] | None = None,
    message_id: int | str | None = None,
) -> SafeString:
    html = []
    for block in blocks:
        context = _block_context(
            block,
            answers=answers or {},
            responses=responses or {},
            questions=questions or {},
            message_id=message_id,
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
) -> SafeString:
    """HTML for one message, identical on first load and in live updates.

    `answers` marks questions already answered; `responses` marks find-similar requests
    already run; `questions` lets a user's `<answer>` show the question and option it picks.
    """
    blocks = parse_message(
        text, artifacts=artifacts, role=role, streaming=streaming, message_id=message_id
    )
    return render_blocks(
        blocks, answers=answers, responses=responses, questions=questions, message_id=message_id
    )
