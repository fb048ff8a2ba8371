"""Pluggable agents: `local` (deterministic, offline) and `openai` (any compatible server)."""

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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

if TYPE_CHECKING:
    from .openai import ProviderConfig


def agent_configured() -> Agent:
    """The agent chosen by GEOSENSE_AGENT (read at each turn, so tests can switch it)."""
    if settings.GEOSENSE_AGENT == "openai":
        from .openai import OpenAIAgent

        return OpenAIAgent(_provider_config())
    from .local import LocalAgent

    return LocalAgent()


# The openai agent's configuration, built from the GEOSENSE_LLM_* settings at the first turn
# and kept: built at every turn, its eleven settings read through Django's lazy settings
# object cost ~30 Python calls a turn on the event loop (issue 15). A setting changed (tests,
# `override_settings`) drops it.
_config: "ProviderConfig | None" = None


def _provider_config() -> "ProviderConfig":
    global _config
    if _config is None:
        from .openai import ProviderConfig

        _config = ProviderConfig(
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
    return _config


@receiver(setting_changed)
def _provider_config_forget(*, setting: str, **kwargs) -> None:
    global _config
    if setting.startswith("GEOSENSE_LLM_"):
        _config = None


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
