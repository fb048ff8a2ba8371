"""What an agent is to the turn engine: a stream of text, thoughts and tool calls."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
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


AgentChunk = TextDelta | Thinking | ToolCallRequest


class AgentError(Exception):
    """The agent could not answer (provider down, broken stream); readable for the user."""


class Agent(Protocol):
    def stream(
        self, *, history: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> AsyncIterator[AgentChunk]:
        """Answer the history (OpenAI chat format, system message first) with these tools."""
        ...
