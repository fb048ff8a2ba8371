"""The user's side of the markup: composing `<answer>`/`<response>` and reading them back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.utils.html import escape

from .blocks import Answer, QuestionBlock, Response
from .parser import parse_message


def _escape_text(text: str) -> str:
    """Element content: `&`, `<`, `>` are enough for the parser to read it back unchanged."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def answer_compose(*, question_id: str, option_index: int | None, message: str) -> str:
    """`<answer question="…" question-option-index="…">message</answer>`; without an index it
    is an answer in the user's own words. Surrounding whitespace of the message is dropped."""
    index = "" if option_index is None else f' question-option-index="{int(option_index)}"'
    return (
        f'<answer question="{escape(question_id)}"{index}>{_escape_text(message.strip())}</answer>'
    )


def response_compose(*, class_id: str, request_id: str, count: int, class_name: str) -> str:
    """The find-similar response of docs/markup.md, with its human-readable sentence."""
    sentence = (
        f"Find Similar located {int(count)} result{'' if count == 1 else 's'} "
        f"belonging to class {class_name.strip()}."
    )
    return (
        f'<response type="find_similar" class-id="{escape(class_id)}" '
        f'request="{escape(request_id)}">{_escape_text(sentence)}</response>'
    )


def answers_in_transcript(texts: Iterable[str]) -> dict[str, Answer]:
    """The answer per question id, from user messages' texts in order (a later answer wins)."""
    answers: dict[str, Answer] = {}
    for text in texts:
        for block in parse_message(text, artifacts={}, role="user"):
            if isinstance(block, Answer):
                answers[block.question_id] = block
    return answers


def responses_in_transcript(texts: Iterable[str]) -> dict[str, Response]:
    """The find-similar response per request id, from user messages' texts in order."""
    responses: dict[str, Response] = {}
    for text in texts:
        for block in parse_message(text, artifacts={}, role="user"):
            if isinstance(block, Response):
                responses[block.request_id] = block
    return responses


def questions_in_transcript(
    texts: Iterable[str], *, artifacts: Mapping[str, Any]
) -> dict[str, QuestionBlock]:
    """The question per id, from assistant messages' texts in order (a later one wins)."""
    questions: dict[str, QuestionBlock] = {}
    for text in texts:
        for block in parse_message(text, artifacts=artifacts):
            if isinstance(block, QuestionBlock):
                questions[block.id] = block
    return questions
