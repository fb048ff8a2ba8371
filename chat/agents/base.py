"""What an agent is to the turn engine: a stream of text, thoughts and tool calls."""

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Thinking:
    """What the agent says it will do; shown in the turn's activity log, not stored."""

    text: str


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # the model's JSON text, validated by the engine


@dataclass(frozen=True)
class Usage:
    """Tokens the server reported for one request (the last report of the stream wins); the
    engine records them per turn and charges them (chat/usage.py)."""

    prompt_tokens: int
    completion_tokens: int


AgentChunk = TextDelta | Thinking | ToolCallRequest | Usage


class AgentError(Exception):
    """The agent could not answer (provider down, broken stream); readable for the user."""


@dataclass(frozen=True)
class AttachedContext:
    """A data context the page attached to a user message (visibility, position, image,
    selection), stored as the artifact `artifact_id`."""

    type: str
    artifact_id: str
    data: Any


@dataclass(frozen=True)
class UserRequest:
    """The user message a turn answers, as the user sent it, with its contexts."""

    text: str
    contexts: tuple[AttachedContext, ...] = ()

    def context(self, kind: str) -> AttachedContext | None:
        """The last context of this type, if the message carries one."""
        found = [c for c in self.contexts if c.type == kind]
        return found[-1] if found else None


@dataclass(frozen=True)
class AgentContext:
    """What the engine knows as data beside the history the model reads as text: the live
    annotations per class, each class's shape ("point", "line", "polygon" or "mixed": what can
    be measured) and the request the turn answers. An LLM reads them in its messages; an agent
    that is code (the local one) reads them here, never parsed back out of text. `overview`
    and `shapes` are made once per index revision and shared by every step until it changes
    (review 32-a L7): read them, never change them in place."""

    overview: Mapping[str, int] = field(default_factory=dict)
    shapes: Mapping[str, str] = field(default_factory=dict)
    request: UserRequest = field(default_factory=lambda: UserRequest(text=""))


class Agent(Protocol):
    def stream(
        self,
        *,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        context: AgentContext,
    ) -> AsyncIterator[AgentChunk]:
        """Answer the history (OpenAI chat format, system message first) with these tools.
        Its messages are shared with the engine's next window (engine invariant 6): read them,
        never change them in place."""
        ...
