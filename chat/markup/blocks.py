"""The typed result of parsing a message: blocks, and the inline parts inside them.

Every part carries a class-level `kind` so templates can switch on it without isinstance.
Elements keep their `source` (the markup as written) for where code shows them as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ATTRIBUTE_TYPES = frozenset({"length", "area", "pixels", "credits", "position"})


# --- inline parts -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Text:
    """Literal text, shown escaped as it is: user text, interpolated values, markup out of place."""

    text: str
    kind: ClassVar[str] = "text"


@dataclass(frozen=True, slots=True)
class Markdown:
    """Prose the assistant wrote: Markdown source, rendered together with the elements around it."""

    text: str
    kind: ClassVar[str] = "markdown"


@dataclass(frozen=True, slots=True)
class Missing:
    """A `${…}` placeholder whose artifact or path does not exist."""

    placeholder: str
    kind: ClassVar[str] = "missing"


@dataclass(frozen=True, slots=True)
class Emphasis:
    """`<i>` or `<b>` around further inline parts."""

    tag: str
    children: tuple[Inline, ...]
    source: str = field(default="", compare=False, repr=False)
    kind: ClassVar[str] = "emphasis"


@dataclass(frozen=True, slots=True)
class Length:
    """`<distance value>` or `<size value>`: metres."""

    value: float
    element: str
    source: str = field(default="", compare=False, repr=False)
    kind: ClassVar[str] = "length"


@dataclass(frozen=True, slots=True)
class Area:
    """`<area value>` / `<area id>`: square metres."""

    value: float
    source: str = field(default="", compare=False, repr=False)
    kind: ClassVar[str] = "area"


@dataclass(frozen=True, slots=True)
class Ref:
    """`<ref id>` or `<id v>…</id>`: an annotation the page can focus."""

    annotation_id: int
    vector: str | None = None
    source: str = field(default="", compare=False, repr=False)
    kind: ClassVar[str] = "ref"


@dataclass(frozen=True, slots=True)
class MarkupError:
    """Markup that could not be understood: shown as a harmless chip."""

    label: str
    detail: str
    source: str = field(default="", compare=False, repr=False)
    kind: ClassVar[str] = "error"


Inline = Text | Markdown | Missing | Emphasis | Length | Area | Ref | MarkupError


# --- blocks -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TextBlock:
    parts: tuple[Inline, ...]
    kind: ClassVar[str] = "text"


@dataclass(frozen=True, slots=True)
class Option:
    index: int
    label: tuple[Inline, ...]
    message: str
    context: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class QuestionBlock:
    id: str
    header: tuple[Inline, ...]
    options: tuple[Option, ...]
    notes: tuple[Inline, ...] = ()
    kind: ClassVar[str] = "question"


@dataclass(frozen=True, slots=True)
class HighlightBlock:
    data: dict[str, Any] | None
    error: str | None
    body: tuple[Inline, ...]
    data_json: str = field(default="", repr=False, compare=False)
    kind: ClassVar[str] = "highlight"


@dataclass(frozen=True, slots=True)
class FindSimilarBlock:
    data: dict[str, Any] | None
    error: str | None
    body: tuple[Inline, ...]
    request_id: str
    data_json: str = field(default="", repr=False, compare=False)
    kind: ClassVar[str] = "find_similar"


@dataclass(frozen=True, slots=True)
class PendingBlock:
    """A block still being streamed: shown as a placeholder until its closing tag arrives."""

    element: str
    kind: ClassVar[str] = "pending"


@dataclass(frozen=True, slots=True)
class Answer:
    """A user's `<answer>`: an option's index, or None for an answer in their own words.

    `asked_in` is the id of the message that asked the question (the page sends it): a
    question is known by that message and its id, so an id asked twice is two questions.
    """

    question_id: str
    option_index: int | None
    message: str
    asked_in: str | None = None
    kind: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True)
class Response:
    """A user's `<response type="find_similar">` reporting a finished search."""

    type: str
    class_id: str
    request_id: str
    text: str
    count: int | None = None
    kind: ClassVar[str] = "response"


Block = (
    TextBlock | QuestionBlock | HighlightBlock | FindSimilarBlock | PendingBlock | Answer | Response
)
