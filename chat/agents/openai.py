"""An agent backed by any OpenAI-compatible chat-completions server (streaming, tools)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai

from .base import AgentChunk, AgentContext, AgentError, TextDelta, ToolCallRequest

REQUEST_TIMEOUT = 60.0  # seconds per request; the client retries connection failures
MAX_RETRIES = 2


class OpenAIAgent:
    def __init__(self, *, base_url: str, model: str, api_key: str = "") -> None:
        if not base_url:
            raise AgentError("GEOSENSE_LLM_BASE_URL is not set.")
        self.model = model or "default"
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "not-needed",
            timeout=REQUEST_TIMEOUT,
            max_retries=MAX_RETRIES,
        )

    async def stream(
        self,
        *,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        context: AgentContext,
    ) -> AsyncIterator[AgentChunk]:
        """Stream text as it comes; yield tool calls once the stream has finished them.

        The model reads everything from `history` (the overview is in the system prompt, the
        contexts follow their message's text), so `context` is not used here.

        Tool-call fragments arrive split across chunks, keyed by `index`; several calls may
        interleave (parallel calls). A stream that ends without a finish reason is broken.
        """
        calls: dict[int, dict[str, str]] = {}
        finished = False
        try:
            kwargs: dict[str, Any] = {"model": self.model, "messages": history, "stream": True}
            if tools:
                kwargs["tools"] = tools
            stream = await self.client.chat.completions.create(**kwargs)
            async with stream:
                async for chunk in stream:
                    for choice in chunk.choices or []:
                        delta = choice.delta
                        if delta is not None and delta.content:
                            yield TextDelta(delta.content)
                        for fragment in (delta.tool_calls if delta is not None else None) or []:
                            call = calls.setdefault(
                                fragment.index, {"id": "", "name": "", "arguments": ""}
                            )
                            if fragment.id:
                                call["id"] = fragment.id
                            if fragment.function is not None:
                                call["name"] += fragment.function.name or ""
                                call["arguments"] += fragment.function.arguments or ""
                        if choice.finish_reason:
                            finished = True
        except asyncio.CancelledError:
            raise
        except openai.APIStatusError as exc:
            raise AgentError(f"The language model server answered HTTP {exc.status_code}.") from exc
        except openai.APITimeoutError as exc:
            raise AgentError("The language model server did not answer in time.") from exc
        except (openai.APIError, OSError, ValueError) as exc:
            raise AgentError(
                f"The language model stream broke off ({type(exc).__name__})."
            ) from exc
        if not finished:
            raise AgentError("The language model stream ended before it was complete.")
        for index in sorted(calls):
            call = calls[index]
            if not call["name"]:
                raise AgentError("The language model sent a tool call without a name.")
            yield ToolCallRequest(
                id=call["id"] or f"call_{index}", name=call["name"], arguments=call["arguments"]
            )
