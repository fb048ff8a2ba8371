"""Pluggable agents: `local` (deterministic, offline) and `openai` (any compatible server)."""

from django.conf import settings

from .base import (
    Agent,
    AgentChunk,
    AgentContext,
    AgentError,
    AttachedContext,
    TextDelta,
    Thinking,
    ToolCallRequest,
    Usage,
    UserRequest,
)

__all__ = [
    "Agent",
    "AgentChunk",
    "AgentContext",
    "AgentError",
    "AttachedContext",
    "TextDelta",
    "Thinking",
    "ToolCallRequest",
    "Usage",
    "UserRequest",
    "agent_code_import",
    "agent_configured",
    "agents_close",
]


def agent_configured() -> Agent:
    """The agent chosen by GEOSENSE_AGENT (read at each turn, so tests can switch it)."""
    if settings.GEOSENSE_AGENT == "openai":
        from .openai import OpenAIAgent, ProviderConfig

        return OpenAIAgent(
            ProviderConfig(
                base_url=settings.GEOSENSE_LLM_BASE_URL,
                model=settings.GEOSENSE_LLM_MODEL,
                api_key=settings.GEOSENSE_LLM_API_KEY,
                headers=settings.GEOSENSE_LLM_HEADERS,
                temperature=settings.GEOSENSE_LLM_TEMPERATURE,
                max_tokens=settings.GEOSENSE_LLM_MAX_TOKENS,
                connect_timeout=settings.GEOSENSE_LLM_CONNECT_TIMEOUT,
                first_byte_timeout=settings.GEOSENSE_LLM_FIRST_BYTE_TIMEOUT,
                chunk_timeout=settings.GEOSENSE_LLM_CHUNK_TIMEOUT,
                tool_choice=settings.GEOSENSE_LLM_TOOL_CHOICE,
                vision=settings.GEOSENSE_LLM_VISION,
            )
        )
    from .local import LocalAgent

    return LocalAgent()


def agent_code_import() -> None:
    """Import the configured agent's code as the process starts (`geosense/asgi.py`): its
    HTTP client (aiohttp) takes about 0.25 s of CPU to import, which the first turn after every
    start would otherwise spend on the event loop, every user of the process waiting."""
    if settings.GEOSENSE_AGENT == "openai":
        from . import openai  # noqa: F401


async def agents_close() -> None:
    """Close what the agents hold for this event loop (the model servers' clients): at
    shutdown (`geosense/asgi.py`)."""
    from .openai import provider_clients_close

    await provider_clients_close()
