"""The user's side of the markup: composing `<answer>`/`<response>` and reading them back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.utils.html import escape

from .blocks import Answer, QuestionBlock, Response
from .parser import parse_message


def _escape_text(text: str) -> str:
    """Element content: `&`, `<`, `>` are enough for the parser to read it back unchanged."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def answer_compose(
    *, question_id: str, option_index: int | None, message: str, asked_in: object = None
) -> str:
    """`<answer question="…" question-option-index="…" asked-in="…">message</answer>`; without
    an index it is an answer in the user's own words; `asked_in` is the id of the message that
    asked the question. Surrounding whitespace of the message is dropped."""
    index = "" if option_index is None else f' question-option-index="{int(option_index)}"'
    asked = "" if asked_in is None else f' asked-in="{escape(str(asked_in))}"'
    return (
        f'<answer question="{escape(question_id)}"{index}{asked}>'
        f"{_escape_text(message.strip())}</answer>"
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


def responses_in_transcript(texts: Iterable[str]) -> dict[str, Response]:
    """The find-similar response per request id, from user messages' texts in order."""
    responses: dict[str, Response] = {}
    for text in texts:
        for block in parse_message(text, artifacts={}, role="user"):
            if isinstance(block, Response):
                responses[block.request_id] = block
    return responses


@dataclass(frozen=True)
class TranscriptQuestions:
    """Which answer answers which question in a transcript.

    A question is known by the message that asked it and its id, so an id asked in two messages
    is two questions, each answered on its own. An answer names its question by id and by
    `asked-in` (the asking message); an answer without `asked-in` (an API client's, or one
    typed by hand) answers the latest question with that id asked before it. When a question
    is answered twice, the later answer counts.
    """

    # asking message → question id → its answer
    answers: Mapping[str, Mapping[str, Answer]]
    # answering message → question id → the question it answers
    answered: Mapping[str, Mapping[str, QuestionBlock]]

    def answers_in(self, message_id: object) -> Mapping[str, Answer]:
        """The answers to the questions asked in this message, by question id."""
        return self.answers.get(str(message_id), {})

    def questions_answered_in(self, message_id: object) -> Mapping[str, QuestionBlock]:
        """The questions this user message answers, by question id."""
        return self.answered.get(str(message_id), {})


def transcript_questions(
    messages: Iterable[tuple[object, str, str]], *, artifacts: Mapping[str, Any]
) -> TranscriptQuestions:
    """Pair questions and answers over `(message id, role, text)` in transcript order."""
    asked: dict[tuple[str, str], QuestionBlock] = {}
    latest: dict[str, str] = {}
    answers: dict[str, dict[str, Answer]] = {}
    answered: dict[str, dict[str, QuestionBlock]] = {}
    for message_id, role, text in messages:
        mid = str(message_id)
        if role == "assistant":
            for block in parse_message(text, artifacts=artifacts):
                if isinstance(block, QuestionBlock):
                    asked[(mid, block.id)] = block
                    latest[block.id] = mid
        elif role == "user":
            for block in parse_message(text, artifacts={}, role="user"):
                if not isinstance(block, Answer):
                    continue
                asker = block.asked_in
                if (asker, block.question_id) not in asked:
                    asker = latest.get(block.question_id)
                if asker is None:
                    continue
                answers.setdefault(asker, {})[block.question_id] = block
                answered.setdefault(mid, {})[block.question_id] = asked[(asker, block.question_id)]
    return TranscriptQuestions(answers=answers, answered=answered)
